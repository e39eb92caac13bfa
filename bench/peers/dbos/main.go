package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	_ "github.com/dbos-inc/dbos-transact-golang/dbos/driver/sqlite"
	"github.com/jackc/pgx/v5"
)

// pct and result repeat the JSON shape of Ferry's bench.Result on
// purpose: the keys are the contract that tools outside the repo read,
// and this module does not import Ferry.
type pct struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

type result struct {
	Workload   string         `json:"workload"`
	Backend    string         `json:"backend"`
	N          int            `json:"n"`
	Completed  int            `json:"completed"`
	TotalS     float64        `json:"total_s"`
	UnitsPerS  float64        `json:"units_per_s"`
	StepsPerS  float64        `json:"steps_per_s"`
	LatencyMS  *pct           `json:"latency_ms"`
	HandoffMS  *pct           `json:"handoff_ms"`
	LatenessMS *pct           `json:"lateness_ms"`
	Settings   map[string]any `json:"settings"`
}

const (
	// pollInterval is the queue's polling interval the performance issue
	// measured DBOS with.
	pollInterval = 10 * time.Millisecond
	// enqueuers start the workflows at once, as Ferry's bench triggers
	// its runs from 64 clients.
	enqueuers = 64
	fanWidth  = 8
)

func main() {
	workload := flag.String("workload", "all", "jobs, chain10, fanout, sleep or all")
	n := flag.Int("n", 0, "workflows (default: jobs 20000, chain10 1000, fanout 1000, sleep 10000)")
	database := flag.String("database", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "a Postgres URL (a schema is made and dropped per run) or sqlite (a temporary file)")
	repeat := flag.Int("repeat", 1, "runs of each workload")
	flag.Parse()
	ws := []string{*workload}
	if *workload == "all" {
		ws = []string{"jobs", "chain10", "fanout", "sleep"}
	}
	for _, w := range ws {
		size := *n
		if size == 0 {
			size = map[string]int{"jobs": 20000, "chain10": 1000, "fanout": 1000, "sleep": 10000}[w]
		}
		for range *repeat {
			r, err := once(context.Background(), w, *database, size)
			if err != nil {
				fmt.Fprintln(os.Stderr, "dbos bench:", err)
				os.Exit(1)
			}
			b, _ := json.Marshal(r)
			fmt.Println(string(b))
		}
	}
}

// marks are the moments the workflows' code records, by workflow index.
type marks struct {
	mu       sync.Mutex
	stepEnd  map[int]time.Time // the last step's end, for the next step's hand-off
	handoffs []float64
	lateness []float64
	done     atomic.Int64
}

func (m *marks) stepStart(i int, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if end, ok := m.stepEnd[i]; ok {
		m.handoffs = append(m.handoffs, ms(now.Sub(end)))
	}
}

func (m *marks) stepDone(i int, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stepEnd[i] = now
}

func once(ctx context.Context, workload, database string, n int) (result, error) {
	cfg := dbos.Config{AppName: "ferry-bench-peer", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	backend := "postgres"
	if database == "sqlite" {
		backend = "sqlite"
		dir, err := os.MkdirTemp("", "dbos-bench-")
		if err != nil {
			return result{}, err
		}
		defer os.RemoveAll(dir)
		cfg.DatabaseURL = "sqlite:" + filepath.Join(dir, "bench.db")
	} else {
		if _, err := url.Parse(database); err != nil {
			return result{}, err
		}
		schema := "dbos_bench_" + strings.ToLower(rand.Text()[:10])
		cfg.DatabaseURL, cfg.DatabaseSchema = database, schema
		defer func() {
			if c, err := pgx.Connect(context.Background(), database); err == nil {
				_, _ = c.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
				c.Close(context.Background())
			}
		}()
	}
	dctx, err := dbos.NewContext(ctx, cfg)
	if err != nil {
		return result{}, err
	}
	defer dbos.Shutdown(dctx, 10*time.Second) //nolint:errcheck

	m := &marks{stepEnd: map[int]time.Time{}}
	noop := func(i int) dbos.Step[bool] {
		return func(context.Context) (bool, error) {
			m.stepStart(i, time.Now())
			m.stepDone(i, time.Now())
			return true, nil
		}
	}
	steps := map[string]int{"jobs": 1, "chain10": 10, "fanout": 2 + fanWidth, "sleep": 1}[workload]
	var wf dbos.Workflow[int, bool]
	switch workload {
	case "jobs", "chain10":
		wf = func(ctx dbos.Context, i int) (bool, error) {
			for range steps {
				if _, err := dbos.RunAsStep(ctx, noop(i)); err != nil {
					return false, err
				}
			}
			m.done.Add(1)
			return true, nil
		}
	case "fanout":
		wf = func(ctx dbos.Context, i int) (bool, error) {
			if _, err := dbos.RunAsStep(ctx, noop(i)); err != nil {
				return false, err
			}
			chans := make([]<-chan dbos.StepOutcome[bool], fanWidth)
			for k := range chans {
				c, err := dbos.Go(ctx, func(context.Context) (bool, error) { return true, nil })
				if err != nil {
					return false, err
				}
				chans[k] = c
			}
			for _, c := range chans {
				if o := <-c; o.Err != nil {
					return false, o.Err
				}
			}
			if _, err := dbos.RunAsStep(ctx, noop(i)); err != nil {
				return false, err
			}
			m.done.Add(1)
			return true, nil
		}
	case "sleep":
		wf = func(ctx dbos.Context, i int) (bool, error) {
			// The intended wake is a second after the sleep begins; the
			// wake is when the workflow goes on (Ferry: the sleep step's
			// end as its timer's transaction records it).
			begin := time.Now()
			if _, err := dbos.Sleep(ctx, time.Second); err != nil {
				return false, err
			}
			late := time.Since(begin.Add(time.Second))
			m.mu.Lock()
			m.lateness = append(m.lateness, ms(late))
			m.mu.Unlock()
			if _, err := dbos.RunAsStep(ctx, noop(i)); err != nil {
				return false, err
			}
			m.done.Add(1)
			return true, nil
		}
	default:
		return result{}, fmt.Errorf("unknown workload %q", workload)
	}
	dbos.RegisterWorkflow(dctx, wf, dbos.WithWorkflowName("bench_"+workload))
	if err := dbos.Launch(dctx); err != nil {
		return result{}, err
	}
	q, err := dbos.RegisterQueue(dctx, "bench", dbos.WithQueueBasePollingInterval(pollInterval))
	if err != nil {
		return result{}, err
	}

	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, enqueuers)
	for range enqueuers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if _, err := dbos.RunWorkflow(dctx, wf, i, dbos.WithQueue(q)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return result{}, fmt.Errorf("enqueue: %w", err)
	}
	created := time.Since(start).Seconds()
	// The workflows' code says when all have run their last step; their
	// completion is committed after it, so the list is read until it
	// holds them all.
	deadline := time.Now().Add(20 * time.Minute)
	var list []dbos.WorkflowStatus
	for {
		if m.done.Load() >= int64(n) {
			list, err = dbos.ListWorkflows(dctx, dbos.WithFilterStatus(dbos.WorkflowStatusSuccess), dbos.WithFilterLoadInput(false), dbos.WithFilterLoadOutput(false))
			if err != nil {
				return result{}, err
			}
			if len(list) >= n {
				break
			}
		}
		if time.Now().After(deadline) {
			return result{}, fmt.Errorf("%d of %d workflows done in 20 minutes", m.done.Load(), n)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	first, last := list[0].CreatedAt, list[0].CompletedAt
	lat := make([]float64, 0, len(list))
	for _, w := range list {
		end := w.CompletedAt
		if end.IsZero() {
			end = w.UpdatedAt
		}
		if w.CreatedAt.Before(first) {
			first = w.CreatedAt
		}
		if end.After(last) {
			last = end
		}
		lat = append(lat, ms(end.Sub(w.CreatedAt)))
	}
	total := last.Sub(first).Seconds()
	r := result{
		Workload: workload, Backend: backend, N: n, Completed: len(list), TotalS: round(total),
		UnitsPerS: round(float64(len(list)) / total), StepsPerS: round(float64(len(list)*steps) / total),
		LatencyMS: percentiles(lat),
		Settings:  map[string]any{"peer": "dbos", "queue_polling_interval_ms": pollInterval.Milliseconds(), "enqueuers": enqueuers, "create_s": round(created)},
	}
	if workload == "chain10" {
		r.HandoffMS = percentiles(m.handoffs)
	}
	if workload == "sleep" {
		r.LatenessMS = percentiles(m.lateness)
	}
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func percentiles(v []float64) *pct {
	if len(v) == 0 {
		return nil
	}
	sort.Float64s(v)
	at := func(p float64) float64 { return round(v[int(math.Ceil(p*float64(len(v))))-1]) }
	return &pct{P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: round(v[len(v)-1])}
}

func round(f float64) float64 { return math.Round(f*100) / 100 }
