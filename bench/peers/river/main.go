package main

import (
	"context"
	"crypto/rand"
	"database/sql"
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
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	_ "modernc.org/sqlite"
)

type noopArgs struct{}

func (noopArgs) Kind() string { return "bench_noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

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
	Workload  string         `json:"workload"`
	Backend   string         `json:"backend"`
	N         int            `json:"n"`
	Completed int            `json:"completed"`
	TotalS    float64        `json:"total_s"`
	UnitsPerS float64        `json:"units_per_s"`
	StepsPerS float64        `json:"steps_per_s"`
	LatencyMS *pct           `json:"latency_ms"`
	Settings  map[string]any `json:"settings"`
}

const (
	workers     = 2000
	insertBatch = 1000
)

func main() {
	n := flag.Int("n", 20000, "jobs")
	database := flag.String("database", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "sqlite (a new file per run) or a Postgres URL (a schema is made and dropped per run)")
	repeat := flag.Int("repeat", 1, "runs")
	flag.Parse()
	for range *repeat {
		r, err := once(context.Background(), *database, *n)
		if err != nil {
			fmt.Fprintln(os.Stderr, "river bench:", err)
			os.Exit(1)
		}
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
	}
}

func once(ctx context.Context, database string, n int) (result, error) {
	if database == "sqlite" {
		return onSQLite(ctx, n)
	}
	return onPostgres(ctx, database, n)
}

// onSQLite runs the workload on a new SQLite file through River's SQLite
// driver, with one connection as its documentation asks (River's
// concurrent operations otherwise fail with SQLITE_BUSY), in WAL with
// every commit synced: the durability Ferry's default has.
func onSQLite(ctx context.Context, n int) (result, error) {
	dir, err := os.MkdirTemp("", "river-bench-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "river.db")+"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)")
	if err != nil {
		return result{}, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	drv := riversqlite.New(db)
	if err := migrate(ctx, drv, ""); err != nil {
		return result{}, err
	}
	r, err := run(ctx, drv, "", "sqlite", n)
	if err != nil {
		return result{}, err
	}
	// As Ferry's bench writes it. NORMAL measured the same: River's
	// completions, one row a statement, set its pace here, not the syncs.
	r.Settings["sqlite_synchronous"] = "full"
	return r, nil
}

// onPostgres runs the workload in a new schema of database, dropped after.
func onPostgres(ctx context.Context, database string, n int) (result, error) {
	u, err := url.Parse(database)
	if err != nil {
		return result{}, err
	}
	schema := "river_bench_" + strings.ToLower(rand.Text()[:10])
	admin, err := pgx.Connect(ctx, database)
	if err != nil {
		return result{}, err
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return result{}, err
	}
	defer admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	drv := riverpgxv5.New(pool)
	if err := migrate(ctx, drv, schema); err != nil {
		return result{}, err
	}
	return run(ctx, drv, schema, "postgres", n)
}

func migrate[TTx any](ctx context.Context, drv riverdriver.Driver[TTx], schema string) error {
	m, err := rivermigrate.New(drv, &rivermigrate.Config{Schema: schema})
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// run inserts n jobs, then starts River's workers and times the drain.
func run[TTx any](ctx context.Context, drv riverdriver.Driver[TTx], schema, backend string, n int) (result, error) {
	ws := river.NewWorkers()
	river.AddWorker(ws, noopWorker{})
	client, err := river.NewClient(drv, &river.Config{
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Schema:            schema,
		Workers:           ws,
	})
	if err != nil {
		return result{}, err
	}
	// Completed events are sent once the completer has committed: the
	// same point Ferry's figure ends at (a run's finished_at).
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: n + 1, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer cancel()
	start := time.Now()
	for lo := 0; lo < n; lo += insertBatch {
		params := make([]river.InsertManyParams, 0, insertBatch)
		for i := lo; i < min(lo+insertBatch, n); i++ {
			params = append(params, river.InsertManyParams{Args: noopArgs{}})
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return result{}, fmt.Errorf("insert: %w", err)
		}
	}
	created := time.Since(start).Seconds()
	if err := client.Start(ctx); err != nil {
		return result{}, err
	}
	// Stopped on every way out: its goroutines must not outlive the pool
	// closed after it.
	defer func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.Stop(stopCtx)
	}()
	lat := make([]float64, 0, n)
	deadline := time.After(10 * time.Minute)
	for len(lat) < n {
		select {
		case ev := <-events:
			// Every completed job counts, so a missing finalized time
			// cannot leave the loop waiting for the deadline.
			done := time.Now()
			if ev.Job.FinalizedAt != nil {
				done = *ev.Job.FinalizedAt
			}
			lat = append(lat, float64(done.Sub(ev.Job.CreatedAt).Microseconds())/1000)
		case <-deadline:
			return result{}, fmt.Errorf("%d of %d jobs completed in 10 minutes", len(lat), n)
		}
	}
	total := time.Since(start).Seconds()
	return result{
		Workload: "jobs", Backend: backend, N: n, Completed: len(lat), TotalS: round(total),
		UnitsPerS: round(float64(n) / total), StepsPerS: round(float64(n) / total), LatencyMS: percentiles(lat),
		Settings: map[string]any{"peer": "river", "workers": workers, "fetch_cooldown_ms": 2, "fetch_poll_interval_ms": 20, "insert_batch": insertBatch, "create_s": round(created)},
	}, nil
}

func percentiles(v []float64) *pct {
	sort.Float64s(v)
	at := func(p float64) float64 { return round(v[int(math.Ceil(p*float64(len(v))))-1]) }
	return &pct{P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: round(v[len(v)-1])}
}

func round(f float64) float64 { return math.Round(f*100) / 100 }
