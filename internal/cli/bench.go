package cli

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/bench"
)

func benchCmd() *cobra.Command {
	var o bench.Options
	var asJSON, allocs bool
	var cpuProfile, memProfile, logLevel string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure throughput and latency on an embedded engine (jobs, chain10, fanout, sleep)",
		Long: `Run benchmark workloads on an embedded engine with in-process no-op task
handlers (the worker SDK; with --transport http through the engine's API on
loopback). Each workload runs on a fresh database: a temporary SQLite file, or
a new schema in the given Postgres database that is dropped afterwards. The
engine's log goes to stderr from --log-level up.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			if memProfile != "" {
				defer func() {
					if f, err := os.Create(memProfile); err == nil {
						_ = pprof.Lookup("allocs").WriteTo(f, 0)
						f.Close()
					}
				}()
			}
			if logLevel != "off" {
				var lvl slog.Level
				if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
					return fmt.Errorf("--log-level: %w (or off)", err)
				}
				o.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lvl}))
			}
			if allocs {
				o.Allocs = cmd.ErrOrStderr()
			}
			var w io.Writer
			if asJSON {
				w = out
			}
			results, err := bench.Run(cmd.Context(), o, w)
			if !asJSON {
				for _, r := range results {
					printResult(out, r)
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Workload, "workload", "all", "jobs, chain10, fanout, sleep, sleep-rss (100,000 runs held asleep), start (trigger → first step's start at a light load), scale (hand-off and claim latency with 10k/100k/1M finished runs retained; -n sets the top level) or all (the first four)")
	f.StringVar(&o.Database, "database", "sqlite", "sqlite or a postgres:// URL")
	f.IntVarP(&o.N, "n", "n", 0, "runs per workload (default: jobs 20000, chain10 1000, fanout 1000, sleep 10000, sleep-rss 100000, start 500)")
	f.IntVar(&o.Workers, "workers", 0, "worker SDK concurrency (handlers in flight; default: jobs 2000, as in River's benchmark, chain10 16, the others 64)")
	f.IntVar(&o.Concurrency, "concurrency", 64, "engine dispatcher slots")
	f.DurationVar(&o.Timeout, "timeout", 30*time.Minute, "give up on a workload after this long")
	f.IntVar(&o.Repeat, "repeat", 1, "run each workload this many times and report the median run (by units/s)")
	f.Float64Var(&o.Rate, "rate", 0, "trigger the runs of chain10, fanout, sleep and sleep-rss at this many a second in all (default: as fast as they are taken)")
	f.StringVar(&o.Transport, "transport", "embedded", "embedded (in-process calls) or http (the engine's API on loopback; workers and triggers through the Go client, as remote workers do)")
	f.IntVar(&o.Nodes, "nodes", 1, "run this many engines on the one Postgres database, as separate servers (the triggers go to them in turn; each runs its share of --workers)")
	f.StringVar(&logLevel, "log-level", "warn", "the engine's log on stderr from this level: debug, info, warn, error or off")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per workload")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile (pprof) to this file")
	f.StringVar(&memProfile, "memprofile", "", "write an allocation profile (pprof: -sample_index=alloc_space) to this file at the end")
	f.BoolVar(&allocs, "allocs", false, "print on stderr, for each run of a workload, the objects and bytes the process allocated a unit (counted exactly)")
	return cmd
}

func printResult(w io.Writer, r bench.Result) {
	fmt.Fprintf(w, "%-8s %-8s n=%-6d completed=%-6d %.2fs  %.1f units/s  %.1f steps/s", r.Workload, r.Backend, r.N, r.Completed, r.TotalS, r.UnitsPerS, r.StepsPerS)
	if p := r.LatencyMS; p != nil {
		fmt.Fprintf(w, "  latency p50/p95/p99 %.1f/%.1f/%.1f ms", p.P50, p.P95, p.P99)
	}
	if p := r.HandoffMS; p != nil {
		fmt.Fprintf(w, "  handoff p50/p99 %.2f/%.2f ms", p.P50, p.P99)
	}
	if p := r.LatenessMS; p != nil {
		fmt.Fprintf(w, "  lateness p50/p99 %.2f/%.2f ms", p.P50, p.P99)
	}
	fmt.Fprintf(w, "  peak RSS %.0f MB\n", r.PeakRSSMB)
}
