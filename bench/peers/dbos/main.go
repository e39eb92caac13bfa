package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
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
	// queueReload is longer than DBOS's queue runner's reload interval
	// (one second in v1.2.0).
	queueReload = 1100 * time.Millisecond
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
	returned []float64    // the sleep's own return after its deadline
	ended    atomic.Int64 // workflows whose code returned, with or without an error
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
	cfg := dbos.Config{AppName: "ferry-bench-peer", Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
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
	// step runs workflow i's next no-op step.
	step := func(ctx dbos.Context, i int) error {
		_, err := dbos.RunAsStep(ctx, noop(i))
		return err
	}
	// Steps as Ferry counts them: the sleep is one.
	steps := map[string]int{"jobs": 1, "chain10": 10, "fanout": 2 + fanWidth, "sleep": 2}[workload]
	var wf dbos.Workflow[int, bool]
	switch workload {
	case "jobs", "chain10":
		wf = func(ctx dbos.Context, i int) (bool, error) {
			defer m.ended.Add(1)
			for range steps {
				if err := step(ctx, i); err != nil {
					return false, err
				}
			}
			return true, nil
		}
	case "fanout":
		wf = func(ctx dbos.Context, i int) (bool, error) {
			defer m.ended.Add(1)
			if err := step(ctx, i); err != nil {
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
			if err := step(ctx, i); err != nil {
				return false, err
			}
			return true, nil
		}
	case "sleep":
		wf = func(ctx dbos.Context, i int) (bool, error) {
			defer m.ended.Add(1)
			// dbos.Sleep checkpoints its deadline (its clock in whole
			// milliseconds, plus the second) and then waits on an
			// in-memory timer: nothing durable marks the wake. Its first
			// durable trace is the next step's checkpoint, so lateness
			// runs to that step's return (Ferry's: to the moment its
			// timer's transaction applies the wake-up). The deadline is
			// taken as this clock's millisecond before the call: never
			// after DBOS's own, so DBOS is not flattered.
			deadline := time.Now().Truncate(time.Millisecond).Add(time.Second)
			if _, err := dbos.Sleep(ctx, time.Second); err != nil {
				return false, err
			}
			returned := time.Since(deadline)
			if err := step(ctx, i); err != nil {
				return false, err
			}
			late := time.Since(deadline)
			m.mu.Lock()
			m.lateness = append(m.lateness, ms(late))
			m.returned = append(m.returned, ms(returned))
			m.mu.Unlock()
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
	// The queue runner picks up new queues once a second: the span must
	// not count a second in which nothing could run.
	time.Sleep(queueReload)

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
	// The workflows' code says when all have returned; their outcomes
	// are committed after it, so the list is read until it holds them
	// all (a workflow that failed is not counted as completed).
	deadline := time.Now().Add(20 * time.Minute)
	var list []dbos.WorkflowStatus
	for {
		if m.ended.Load() >= int64(n) {
			all, err := dbos.ListWorkflows(dctx, dbos.WithFilterStatus(dbos.WorkflowStatusSuccess, dbos.WorkflowStatusError), dbos.WithFilterLoadInput(false), dbos.WithFilterLoadOutput(false))
			if err != nil {
				return result{}, err
			}
			if len(all) >= n {
				for _, w := range all {
					if w.Status == dbos.WorkflowStatusSuccess {
						list = append(list, w)
					}
				}
				break
			}
		}
		if time.Now().After(deadline) {
			return result{}, fmt.Errorf("%d of %d workflows ended in 20 minutes", m.ended.Load(), n)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	if len(list) == 0 {
		return result{}, fmt.Errorf("none of %d workflows succeeded", n)
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
		// DBOS's own defaults otherwise: no concurrency limit, the JSON
		// serializer, 20 Postgres connections, SQLite with
		// synchronous=NORMAL (Ferry's figures are with FULL).
		Settings: map[string]any{"peer": "dbos", "queue_polling_interval_ms": pollInterval.Milliseconds(), "enqueuers": enqueuers, "create_s": round(created), "enqueue": "one workflow a call"},
	}
	if workload == "chain10" {
		r.HandoffMS = percentiles(m.handoffs)
	}
	if workload == "sleep" {
		r.LatenessMS = percentiles(m.lateness)
		r.Settings["lateness_to"] = "the next step's checkpoint"
		r.Settings["sleep_return_lateness_ms"] = percentiles(m.returned)
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
