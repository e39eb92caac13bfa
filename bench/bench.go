package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres"
	"github.com/ferryhq/ferry/worker"
)

// Workloads in the order `all` runs them.
var Workloads = []string{"jobs", "chain10", "fanout", "sleep"}

// Options selects and sizes a benchmark.
type Options struct {
	Workload string // one of Workloads, or "all"
	Database string // "sqlite" / "sqlite:DIR-or-FILE" or a postgres:// URL
	N        int    // runs (0 = the workload's default)
	// Workers is the worker SDK's concurrency (handlers in flight; 0 =
	// the workload's default, see defaultWorkers).
	Workers int
	// Engine concurrency (dispatcher slots).
	Concurrency int
	Timeout     time.Duration
	// Repeat runs each workload this many times and reports the run with
	// the median units_per_s (settings.units_per_s_all lists every run).
	Repeat int
	// Rate paces the runs that are triggered one at a time (chain10,
	// fanout, sleep, sleep-rss) at this many a second in all; 0 triggers
	// them as fast as they are taken. jobs creates its runs in batches
	// first and start has its own gap, so neither takes a rate.
	Rate float64
	// Transport is how the workers and the triggers reach the engine:
	// "embedded" (the default: in-process calls, the figures) or
	// "http" (the engine's API served on loopback, the worker SDK and
	// the triggers going through the Go client, as remote workers do).
	Transport string
	// repeated is set for a workload's runs after its first (runMedian):
	// they keep the heap the run before grew (see resetPeakRSS).
	repeated bool
	// Nodes runs this many engines on the one Postgres database, as
	// separate servers would be (0 or 1: one). The triggers go to them
	// in turn and each runs its share of the workers.
	Nodes  int
	Logger *slog.Logger
	// Allocs, if set, gets a line for each run of a workload: the
	// objects and bytes the whole process allocated a unit (a job, a
	// run), the benchmark's own included. Counted exactly (runtime
	// MemStats), unlike a sampled allocation profile, so two builds'
	// figures compare to the object.
	Allocs io.Writer
	// progress, when set, receives each scale level as it is measured.
	progress func(Result)
}

// Pct are latency percentiles in milliseconds.
type Pct struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Result is one workload's figures; the JSON keys are read by tools.
type Result struct {
	Workload   string         `json:"workload"`
	Backend    string         `json:"backend"`
	N          int            `json:"n"`
	Completed  int            `json:"completed"`
	TotalS     float64        `json:"total_s"`
	UnitsPerS  float64        `json:"units_per_s"`
	StepsPerS  float64        `json:"steps_per_s"`
	LatencyMS  *Pct           `json:"latency_ms"`
	HandoffMS  *Pct           `json:"handoff_ms"`
	LatenessMS *Pct           `json:"lateness_ms"`
	PeakRSSMB  float64        `json:"peak_rss_mb"`
	Settings   map[string]any `json:"settings"`
}

var defaultN = map[string]int{"jobs": 20000, "chain10": 1000, "fanout": 1000, "sleep": 10000, "sleep-rss": 100000, "start": 500}

// defaultWorkers is how many handlers a workload runs unless told. jobs
// runs 2,000, the worker count of River's own benchmark that its target
// figure comes from: independent jobs are drained as fast as handlers
// are free, so the count sets the throughput (Postgres ≈8,500 jobs/s at
// 64, ≈12,500 at 1,000 or 2,000). In chain10 a handler carries its run
// from step to step, and more handlers trade hand-off latency for
// throughput: it runs 16, where both of its goals are measured together
// (≥ 550 runs/s with the hand-off ≤ 2 / ≤ 20 ms; at 64 it runs ≈1,000–
// 1,400 runs/s with 3.5–5 ms hand-offs; docs/performance.md). The other
// workflows run 64.
func defaultWorkers(workload string) int {
	switch workload {
	case "jobs":
		return 2000
	case "chain10":
		return 16
	}
	return 64
}

// Run runs the selected workloads one after the other, each on a fresh
// database, and writes each result as a JSON line to out as it finishes.
func Run(ctx context.Context, o Options, out io.Writer) ([]Result, error) {
	names := []string{o.Workload}
	if o.Workload == "all" {
		names = Workloads
	}
	switch o.Transport {
	case "", "embedded":
	case "http":
		if o.Workload == "scale" {
			// Its claim probes call the store's claim directly, to time
			// the claim alone.
			return nil, errors.New("scale: --transport http does not apply (its claims are timed in process)")
		}
	default:
		return nil, fmt.Errorf("transport %q: use embedded or http", o.Transport)
	}
	if o.Nodes > 1 {
		switch {
		case !isPostgres(o.Database):
			return nil, errors.New("--nodes: several nodes share a Postgres database (SQLite is one node); give a postgres:// URL")
		case o.Transport == "http":
			return nil, errors.New("--nodes: with --transport http the workers reach one node; use embedded")
		case o.Workload == "scale":
			return nil, errors.New("scale: --nodes does not apply (its claims are timed in process)")
		}
	}
	var results []Result
	for _, name := range names {
		if name == "scale" {
			o.progress = func(r Result) {
				if out != nil {
					b, _ := json.Marshal(r)
					fmt.Fprintln(out, string(b))
				}
			}
			rs, err := scale(ctx, o)
			results = append(results, rs...)
			if err != nil {
				return results, fmt.Errorf("scale: %w", err)
			}
			continue
		}
		if o.Rate > 0 && (name == "jobs" || name == "start") {
			return results, fmt.Errorf("%s: --rate applies to runs triggered one at a time (chain10, fanout, sleep, sleep-rss)", name)
		}
		if _, ok := defaultN[name]; !ok {
			return results, fmt.Errorf("unknown workload %q (use %s, sleep-rss, start, scale or all)", name, strings.Join(Workloads, ", "))
		}
		r, err := runMedian(ctx, name, o)
		if err != nil {
			return results, fmt.Errorf("%s: %w", name, err)
		}
		results = append(results, r)
		if out != nil {
			b, _ := json.Marshal(r)
			fmt.Fprintln(out, string(b))
		}
	}
	return results, nil
}

// runMedian runs a workload o.Repeat times (at least once) and returns the
// run with the median units_per_s.
func runMedian(ctx context.Context, name string, o Options) (Result, error) {
	n := max(o.Repeat, 1)
	runs := make([]Result, 0, n)
	for i := 0; i < n; i++ {
		var before goruntime.MemStats
		if o.Allocs != nil {
			goruntime.ReadMemStats(&before)
		}
		o.repeated = i > 0
		r, err := runOne(ctx, name, o)
		if err != nil {
			return Result{}, err
		}
		if o.Allocs != nil && r.N > 0 {
			var after goruntime.MemStats
			goruntime.ReadMemStats(&after)
			fmt.Fprintf(o.Allocs, "allocs %s %s: %.1f objects and %.0f bytes a unit\n", r.Workload, r.Backend,
				float64(after.Mallocs-before.Mallocs)/float64(r.N), float64(after.TotalAlloc-before.TotalAlloc)/float64(r.N))
		}
		runs = append(runs, r)
	}
	all := make([]float64, n)
	for i, r := range runs {
		all[i] = r.UnitsPerS
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].UnitsPerS < runs[j].UnitsPerS })
	med := runs[n/2]
	if n > 1 {
		med.Settings["repeats"] = n
		med.Settings["units_per_s_all"] = all
	}
	return med, nil
}

// env is one fresh engine with its workers, or several on one database
// (Options.Nodes).
type env struct {
	eng  *ferry.Engine // the first node: workflows are applied there
	engs []*ferry.Engine
	turn atomic.Uint64 // the node the next trigger goes to (see node)
	// nodeTasks, with several nodes, is how many tasks each node's
	// workers have handled.
	nodeTasks func() []int64
	st        store.Store
	backend   string
	settings  map[string]any
	rate      float64 // see Options.Rate
	stop      func()
	// startWorkers starts the in-process worker pool.
	startWorkers func()
	// api is the Go client of the engine's HTTP API (transport http),
	// else nil: triggers then call the engine. requests counts the
	// requests the API served.
	api      *client.Client
	requests *atomic.Int64
	// handled counts handler calls: waitDone counts runs in the database
	// only once the handlers are done, as a count reads every run of the
	// workflow and would load the database being measured.
	handled atomic.Int64
	// failed counts handler calls that returned an error: a run whose
	// last task failed still ends as completed (nothing is blocked), so
	// the runs' statuses alone do not show it (waitDone).
	failed atomic.Int64
}

func freshDatabase(ctx context.Context, database string) (url string, backend string, cleanup func(), err error) {
	switch {
	case database == "" || database == "sqlite" || strings.HasPrefix(database, "sqlite:"):
		dir, err := os.MkdirTemp("", "ferry-bench-")
		if err != nil {
			return "", "", nil, err
		}
		// Options after "?" (synchronous=normal) carry over to the fresh file.
		opts := ""
		if _, q, ok := strings.Cut(database, "?"); ok {
			opts = "?" + q
		}
		return "sqlite:" + filepath.Join(dir, "bench.db") + opts, "sqlite", func() { os.RemoveAll(dir) }, nil
	case isPostgres(database):
		schema := "ferry_bench_" + strings.ToLower(rand.Text()[:10])
		// The schema is made on a plain connection: Ferry's own URL
		// parameters (ferry_max_conns) are not Postgres's.
		server, err := postgres.ServerURL(database)
		if err != nil {
			return "", "", nil, err
		}
		conn, err := pgx.Connect(ctx, server)
		if err != nil {
			return "", "", nil, err
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			return "", "", nil, err
		}
		dsn, err := withSearchPath(database, schema)
		if err != nil {
			return "", "", nil, err
		}
		return dsn, "postgres", func() {
			c, err := pgx.Connect(context.Background(), server)
			if err == nil {
				_, _ = c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
				c.Close(context.Background())
			}
		}, nil
	}
	return "", "", nil, fmt.Errorf("database %q: use sqlite or a postgres:// URL", database)
}

// sqliteSynchronous is the synchronous level a SQLite URL's options ask
// for, read as the store reads them (any case): "normal" or "full".
func sqliteSynchronous(dsn string) string {
	if _, q, ok := strings.Cut(dsn, "?"); ok {
		if v, err := url.ParseQuery(q); err == nil && strings.EqualFold(v.Get("synchronous"), "normal") {
			return "normal"
		}
	}
	return "full"
}

func isPostgres(database string) bool {
	return strings.HasPrefix(database, "postgres://") || strings.HasPrefix(database, "postgresql://")
}

func withSearchPath(dsn, schema string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func start(ctx context.Context, o Options, handler worker.HandlerFunc) (*env, error) {
	dsn, backend, cleanup, err := freshDatabase(ctx, o.Database)
	if err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	nodes := max(o.Nodes, 1)
	if o.Workers < nodes {
		// (Checked here, after the workload's default count.)
		cleanup()
		return nil, fmt.Errorf("--nodes %d: give each node a worker at least (--workers %d)", nodes, o.Workers)
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var engs []*ferry.Engine
	closeAll := func() {
		cancel()
		wg.Wait()
		for _, eng := range engs {
			eng.Close()
		}
		cleanup()
	}
	// Each node is an engine of its own on the same database, as separate
	// `ferry server` processes are: its own connections, listener, timer
	// loop, caches and workers. The first migrates the fresh schema.
	for i := range nodes {
		nodeLog := log
		if nodes > 1 {
			nodeLog = log.With("node", i)
		}
		eng, err := ferry.Open(ctx, ferry.Config{Database: dsn, Migrate: i == 0, Concurrency: o.Concurrency, Logger: nodeLog, PublicURL: "http://127.0.0.1:0"})
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("node %d: %w", i, err)
		}
		engs = append(engs, eng)
		wg.Add(1)
		go func() { defer wg.Done(); _ = eng.Run(rctx) }()
	}
	eng := engs[0]
	var src worker.Source = eng
	var api *client.Client
	requests := new(atomic.Int64)
	stopServer := func() {}
	if o.Transport == "http" {
		if api, stopServer, err = serveAPI(ctx, eng, requests); err != nil {
			closeAll()
			return nil, err
		}
		src = api
	}
	e := &env{eng: eng, engs: engs, st: eng.Store(), api: api, requests: requests, backend: backend, rate: o.Rate, settings: map[string]any{
		"workers": o.Workers, "worker_prefetch": o.Workers, "engine_concurrency": o.Concurrency, "lease": "30s", "poll_wait": "1s", "trigger_clients": triggerClients,
		"transport": cmp.Or(o.Transport, "embedded"),
	}}
	// The handlers are shared out among the nodes (settings.
	// workers_per_node); each node's tasks handled are settings.node_tasks.
	perNode := make([]int, nodes)
	for i := range perNode {
		perNode[i] = o.Workers / nodes
		if i < o.Workers%nodes {
			perNode[i]++
		}
	}
	handled := make([]atomic.Int64, nodes)
	var workers []*worker.Worker
	for i := range nodes {
		if i > 0 {
			src = engs[i]
		}
		// No-op handlers finish a prefetched task long before its lease ends.
		w := worker.New(src, worker.Config{Types: []string{"bench.%"}, Concurrency: perNode[i], Prefetch: perNode[i], Lease: 30 * time.Second, PollWait: time.Second, WorkerID: fmt.Sprintf("bench-%d", i), Logger: log})
		w.Handle("bench.noop.v1", func(ctx context.Context, t *worker.Task) (any, error) {
			defer e.handled.Add(1)
			defer handled[i].Add(1)
			out, err := handler(ctx, t)
			if err != nil {
				e.failed.Add(1)
			}
			return out, err
		})
		workers = append(workers, w)
	}
	if nodes > 1 {
		e.settings["nodes"] = nodes
		e.settings["workers_per_node"] = perNode
		e.nodeTasks = func() []int64 {
			out := make([]int64, nodes)
			for i := range handled {
				out[i] = handled[i].Load()
			}
			return out
		}
	}
	if backend == "sqlite" {
		e.settings["sqlite_synchronous"] = sqliteSynchronous(dsn)
		e.settings["sqlite_group_commit_max"] = 128
	} else if u, err := url.Parse(o.Database); err == nil {
		maxConns := any(postgres.DefaultMaxConns)
		params := map[string]string{}
		for k, v := range u.Query() {
			if k == "ferry_max_conns" {
				maxConns = v[0]
				continue
			}
			params[k] = v[0]
		}
		e.settings["postgres_max_conns"] = maxConns
		if len(params) > 0 {
			e.settings["postgres_url_params"] = params
		}
	}
	e.settings["eager_dispatch"] = true // the worker SDK's default
	e.startWorkers = func() {
		for _, w := range workers {
			wg.Add(1)
			go func() { defer wg.Done(); _ = w.Run(rctx) }()
		}
	}
	e.stop = func() {
		cancel()
		wg.Wait()
		stopServer()
		closeAll()
	}
	return e, nil
}

func noop(context.Context, *worker.Task) (any, error) { return map[string]any{"ok": true}, nil }

// countEvery: see waitDone.
const countEvery = 10 * time.Second

// waitDone waits until n runs of the workflow are finished, and fails
// unless all of them completed with no task attempt failed. It counts
// runs in the database (a count reads every run of the workflow) every
// 20 ms once the handlers have been called calls times, and before that
// only every countEvery, in case runs end without their handlers: a count
// of 20,000 runs took Postgres ≈45 ms, ≈4 % of its statement time in
// `jobs` when it counted every second. The finish times reported come
// from the runs, not from when this notices.
func (e *env) waitDone(ctx context.Context, workflowID string, n int, calls int64, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	var counted time.Time
	for {
		if e.handled.Load() >= calls || time.Since(counted) >= countEvery || time.Now().After(deadline) {
			counted = time.Now()
			counts, err := e.st.CountRuns(ctx, workflowID)
			if err != nil {
				return 0, err
			}
			done := 0
			for st, c := range counts {
				if status.RunTerminal(st) {
					done += c
				}
			}
			if done >= n {
				// Figures of runs that failed, or whose tasks did, are
				// not the workload's: say so rather than report them.
				completed, failed := counts[status.RunCompleted], e.failed.Load()
				if completed < n || failed > 0 {
					return completed, fmt.Errorf("%d of %d runs completed and %d task attempts failed (%v)", completed, n, failed, counts)
				}
				return completed, nil
			}
			if time.Now().After(deadline) {
				return counts[status.RunCompleted], fmt.Errorf("timed out: %d of %d runs finished (%v)", done, n, counts)
			}
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// allRuns reads every run of a workflow with its steps.
func (e *env) allRuns(ctx context.Context, workflowID string, withSteps bool) ([]*store.Run, map[string][]*store.StepRun, error) {
	var runs []*store.Run
	steps := map[string][]*store.StepRun{}
	cursor := ""
	for {
		page, next, err := e.st.ListRuns(ctx, workflowID, store.Page{Cursor: cursor, Limit: 500})
		if err != nil {
			return nil, nil, err
		}
		runs = append(runs, page...)
		if next == "" {
			break
		}
		cursor = next
	}
	if withSteps {
		for _, r := range runs {
			_, ss, err := e.st.GetRun(ctx, r.ID)
			if err != nil {
				return nil, nil, err
			}
			steps[r.ID] = ss
		}
	}
	return runs, steps, nil
}

func pct(ms []float64) *Pct {
	if len(ms) == 0 {
		return nil
	}
	sort.Float64s(ms)
	at := func(q float64) float64 {
		i := int(q * float64(len(ms)-1))
		return round(ms[i])
	}
	return &Pct{P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: round(ms[len(ms)-1])}
}

func round(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

func msBetween(a, b time.Time) float64 { return float64(b.Sub(a).Microseconds()) / 1000 }

// triggerAll starts n runs from triggerClients goroutines (concurrent
// triggers are written in shared transactions) and returns when all are in.
func (e *env) triggerAll(ctx context.Context, workflow string, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, triggerClients)
	per := (n + triggerClients - 1) / triggerClients
	// With a rate, the k-th trigger of all the clients' waits for its
	// moment (an arrival schedule, not a synchronisation).
	var issued atomic.Int64
	first := time.Now()
	if e.rate > 0 {
		e.settings["trigger_rate"] = e.rate
	}
	for g := 0; g < triggerClients; g++ {
		lo, hi := g*per, min((g+1)*per, n)
		if lo >= hi {
			break
		}
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				if e.rate > 0 {
					k := issued.Add(1) - 1
					time.Sleep(time.Until(first.Add(time.Duration(float64(k) / e.rate * float64(time.Second)))))
				}
				if _, err := e.trigger(ctx, workflow, json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))); err != nil {
					errs <- err
					return
				}
			}
		}(lo, hi)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// trigger starts one run, through the API with transport http, and
// returns its id.
func (e *env) trigger(ctx context.Context, workflow string, input json.RawMessage) (string, error) {
	if e.api != nil {
		res, _, err := e.api.Trigger(ctx, workflow, input, "")
		if err != nil {
			return "", err
		}
		return res.RunID, nil
	}
	return e.node().Trigger(ctx, workflow, input, "")
}

// node is the engine of the next trigger: the nodes in turn.
func (e *env) node() *ferry.Engine {
	return e.engs[(e.turn.Add(1)-1)%uint64(len(e.engs))]
}

// triggerBatch starts one run per input in one call.
func (e *env) triggerBatch(ctx context.Context, workflow string, inputs []json.RawMessage) error {
	if e.api != nil {
		runs := make([]client.BatchRun, len(inputs))
		for i, in := range inputs {
			runs[i].Input = in
		}
		_, err := e.api.TriggerBatch(ctx, workflow, runs)
		return err
	}
	batch := make([]ferry.TriggerInput, len(inputs))
	for i, in := range inputs {
		batch[i].Input = in
	}
	_, err := e.node().TriggerBatch(ctx, workflow, batch)
	return err
}

// serveAPI serves the engine's HTTP API on a loopback port, as `ferry
// server` does, counting its requests, and returns a client of it with a
// fresh admin key and the function that stops the server.
func serveAPI(ctx context.Context, eng *ferry.Engine, requests *atomic.Int64) (*client.Client, func(), error) {
	key := "fry_" + rand.Text()
	if _, err := eng.EnsureAPIKey(ctx, key); err != nil {
		return nil, nil, fmt.Errorf("api key: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, fmt.Errorf("listen: %w", err)
	}
	h := eng.Handler()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		h.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 10 * time.Second}
	srv.RegisterOnShutdown(eng.Drain)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	// The client's settings, on a transport of its own: the server's
	// Shutdown waits up to 5 s for a connection that has not sent a
	// request yet (the transport dials ahead, and some such connections
	// go idle unused), so the client's idle connections are closed first.
	tr := client.NewTransport()
	stop := func() {
		tr.CloseIdleConnections()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}
	return client.New("http://"+ln.Addr().String(), key, client.WithHTTPClient(&http.Client{Transport: tr})), stop, nil
}

// triggerClients is how many goroutines trigger runs at once.
const triggerClients = 64

// jobsBatch runs per TriggerBatch call and jobsBatchClients concurrent
// callers create the jobs workload's runs ("created in batches first").
const (
	jobsBatch        = 1000
	jobsBatchClients = 4
)

// triggerBatches creates n runs in TriggerBatch calls of jobsBatch runs.
func (e *env) triggerBatches(ctx context.Context, workflow string, n int) error {
	next := make(chan int)
	go func() {
		defer close(next)
		for lo := 0; lo < n; lo += jobsBatch {
			select {
			case next <- lo:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, jobsBatchClients)
	for range jobsBatchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lo := range next {
				inputs := make([]json.RawMessage, 0, jobsBatch)
				for i := lo; i < min(lo+jobsBatch, n); i++ {
					inputs = append(inputs, json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)))
				}
				if err := e.triggerBatch(ctx, workflow, inputs); err != nil {
					errs <- err
					for range next {
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
