package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/worker"
)

func runOne(ctx context.Context, name string, o Options) (Result, error) {
	if o.N <= 0 {
		o.N = defaultN[name]
	}
	if o.Workers <= 0 {
		o.Workers = defaultWorkers(name)
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Minute
	}
	resetPeakRSS(!o.repeated)
	switch name {
	case "jobs":
		return jobs(ctx, o)
	case "chain10":
		return chain(ctx, o)
	case "fanout":
		return fanout(ctx, o)
	case "sleep-rss":
		return sleepRSS(ctx, o)
	case "start":
		return starts(ctx, o)
	default:
		return sleepers(ctx, o)
	}
}

// sleepRSS holds N runs asleep (1 h) and reports the process's peak RSS:
// a sleeping run is a row with a due time, not memory. completed counts the
// runs found sleeping; units_per_s is the creation rate.
func sleepRSS(ctx context.Context, o Options) (Result, error) {
	e, err := start(ctx, o, noop)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	id, _, err := e.eng.ApplyWorkflow(ctx, []byte(`{"name": "bench-sleep-rss", "tasks": {"nap": {"sleep": "1h"}, "after": {"needs": ["nap"], "task": {"type": "bench.noop.v1"}}}}`))
	if err != nil {
		return Result{}, err
	}
	e.startWorkers()
	began := time.Now()
	if err := e.triggerAll(ctx, "bench-sleep-rss", o.N); err != nil {
		return Result{}, err
	}
	took := time.Since(began)
	counts, err := e.st.CountRuns(ctx, id)
	if err != nil {
		return Result{}, err
	}
	r := result("sleep-rss", e, o)
	r.Completed = counts[status.RunRunning]
	r.TotalS = took.Seconds()
	r.UnitsPerS = round(float64(o.N) / took.Seconds())
	r.PeakRSSMB = peakRSS()
	return r, nil
}

// startGap is the time between triggers in the start workload: 200 runs a
// second, a light load, so each run's first step finds the worker waiting.
const startGap = 5 * time.Millisecond

// starts: N one-step runs triggered one at a time, one every startGap;
// latency_ms is the trigger call → its step's handler starting, the time a
// run takes to reach a waiting worker.
func starts(ctx context.Context, o Options) (Result, error) {
	var mu sync.Mutex
	began := make(map[string]time.Time, o.N) // run id → handler start
	e, err := start(ctx, o, func(_ context.Context, t *worker.Task) (any, error) {
		now := time.Now()
		mu.Lock()
		began[t.RunID] = now
		mu.Unlock()
		return map[string]any{"ok": true}, nil
	})
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	id, _, err := e.eng.ApplyWorkflow(ctx, []byte(`{"name": "bench-start", "tasks": {"job": {"task": {"type": "bench.noop.v1"}}}}`))
	if err != nil {
		return Result{}, err
	}
	e.startWorkers()
	e.settings["trigger_clients"] = 1
	e.settings["trigger_gap"] = startGap.String()
	called := make(map[string]time.Time, o.N)
	first := time.Now()
	for i := range o.N {
		next := first.Add(time.Duration(i) * startGap)
		time.Sleep(time.Until(next)) // the arrival rate, not a synchronisation
		t0 := time.Now()
		runID, err := e.trigger(ctx, "bench-start", json.RawMessage(`{}`))
		if err != nil {
			return Result{}, err
		}
		called[runID] = t0
	}
	completed, err := e.waitDone(ctx, id, o.N, int64(o.N), o.Timeout)
	if err != nil {
		return Result{}, err
	}
	r := result("start", e, o)
	mu.Lock()
	lat := make([]float64, 0, len(called))
	for run, t0 := range called {
		if b, ok := began[run]; ok {
			lat = append(lat, msBetween(t0, b))
		}
	}
	mu.Unlock()
	r.Completed, r.TotalS = completed, time.Since(first).Seconds()
	r.UnitsPerS = round(float64(completed) / r.TotalS)
	r.StepsPerS = r.UnitsPerS
	r.LatencyMS = pct(lat)
	r.PeakRSSMB = peakRSS()
	return r, nil
}

func result(name string, e *env, o Options) Result {
	e.settings["n"] = o.N
	if e.api != nil {
		e.settings["http_requests"] = e.requests.Load()
	}
	if e.nodeTasks != nil {
		e.settings["node_tasks"] = e.nodeTasks()
	}
	if ob := optimisticBatches(e.engs); ob != nil {
		e.settings["optimistic_batches"] = ob
	}
	return Result{Workload: name, Backend: e.backend, N: o.N, Settings: e.settings}
}

// optimisticBatches sums the engines' report batches and fire
// transactions decided on cached rows (Postgres; nil on SQLite), by
// outcome: written, found stale at their write, decided again the locking
// way first, decided again on cached runs read afresh (see the metric
// ferry_optimistic_batches_total). Several nodes writing the same runs
// show as stale and reread ones.
func optimisticBatches(engs []*ferry.Engine) map[string]int64 {
	var out map[string]int64
	for _, eng := range engs {
		s, ok := eng.Store().(interface {
			OptimisticBatches() (written, stale, redecided int64)
			OptimisticRereads() int64
		})
		if !ok || eng.Store().Dialect() != "postgres" {
			continue
		}
		if out == nil {
			out = map[string]int64{}
		}
		w, st, r := s.OptimisticBatches()
		out["written"] += w
		out["stale"] += st
		out["redecided"] += r
		out["reread"] += s.OptimisticRereads()
	}
	return out
}

// drive applies a workflow, creates o.N runs, waits for all of them and
// fills the common figures. With drainAfter (the jobs workload), every run
// is created before the workers start, in batches (TriggerBatch).
func (e *env) drive(ctx context.Context, o Options, name, def string, stepsPerRun, tasksPerRun int, drainAfter, withSteps bool) (Result, map[string][]*store.StepRun, error) {
	id, _, err := e.eng.ApplyWorkflow(ctx, []byte(def))
	if err != nil {
		return Result{}, nil, err
	}
	wfName := "bench-" + name
	if !drainAfter {
		e.startWorkers()
	}
	trigger := e.triggerAll
	if drainAfter {
		trigger = e.triggerBatches
		e.settings["trigger_clients"] = jobsBatchClients
		e.settings["trigger_batch"] = jobsBatch
	}
	// The handlers' calls so far, before the triggers: with the workers
	// already running, some of this workload's are made while it triggers.
	calls := e.handled.Load() + int64(o.N*tasksPerRun)
	createStart := time.Now()
	if err := trigger(ctx, wfName, o.N); err != nil {
		return Result{}, nil, err
	}
	if drainAfter {
		// How the span splits: creating every run, then draining them.
		e.settings["create_s"] = round(time.Since(createStart).Seconds())
		e.startWorkers()
	}
	completed, err := e.waitDone(ctx, id, o.N, calls, o.Timeout)
	if err != nil {
		return Result{}, nil, err
	}
	runs, steps, err := e.allRuns(ctx, id, withSteps)
	if err != nil {
		return Result{}, nil, err
	}
	r := result(name, e, o)
	first, last, lat := span(runs)
	r.Completed, r.TotalS = completed, last.Sub(first).Seconds()
	r.UnitsPerS = round(float64(completed) / r.TotalS)
	r.StepsPerS = round(float64(completed*stepsPerRun) / r.TotalS)
	r.LatencyMS = pct(lat)
	r.PeakRSSMB = peakRSS()
	return r, steps, nil
}

// jobs: N one-step runs created first, then drained.
func jobs(ctx context.Context, o Options) (Result, error) {
	e, err := start(ctx, o, noop)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	r, _, err := e.drive(ctx, o, "jobs", `{"name": "bench-jobs", "tasks": {"job": {"task": {"type": "bench.noop.v1"}}}}`, 1, 1, true, false)
	return r, err
}

// handoffs records, inside the handlers, when each step of each run starts
// and ends.
type handoffs struct {
	mu    sync.Mutex
	marks map[string]map[string]*mark // run id -> step -> times
}

type mark struct{ start, end time.Time }

func newHandoffs() *handoffs { return &handoffs{marks: map[string]map[string]*mark{}} }

func (h *handoffs) handle(_ context.Context, t *worker.Task) (any, error) {
	start := time.Now()
	h.mu.Lock()
	m := h.marks[t.RunID]
	if m == nil {
		m = map[string]*mark{}
		h.marks[t.RunID] = m
	}
	m[t.Step] = &mark{start: start, end: time.Now()}
	h.mu.Unlock()
	return map[string]any{"ok": true}, nil
}

func (h *handoffs) reset() {
	h.mu.Lock()
	clear(h.marks)
	h.mu.Unlock()
}

// chain10 is every step k end → step k+1 start of the chain10 runs seen.
func (h *handoffs) chain10() []float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []float64
	for _, m := range h.marks {
		for k := 1; k < 10; k++ {
			a, b := m["s"+strconv.Itoa(k)], m["s"+strconv.Itoa(k+1)]
			if a != nil && b != nil {
				out = append(out, msBetween(a.end, b.start))
			}
		}
	}
	return out
}

// chain10Def is ten sequential no-op task steps, s1 … s10.
func chain10Def() string {
	var steps []string
	for i := 1; i <= 10; i++ {
		need := ""
		if i > 1 {
			need = fmt.Sprintf(`"needs": ["s%d"], `, i-1)
		}
		steps = append(steps, fmt.Sprintf(`"s%d": {%s"task": {"type": "bench.noop.v1"}}`, i, need))
	}
	return `{"name": "bench-chain10", "tasks": {` + strings.Join(steps, ",") + `}}`
}

// chain10: runs of 10 sequential steps, all in flight at once; hand-off is
// measured inside the handlers (step k ends → step k+1 starts).
func chain(ctx context.Context, o Options) (Result, error) {
	h := newHandoffs()
	e, err := start(ctx, o, h.handle)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	r, _, err := e.drive(ctx, o, "chain10", chain10Def(), 10, 10, false, false)
	if err != nil {
		return Result{}, err
	}
	r.HandoffMS = pct(h.chain10())
	return r, nil
}

// fanout: A → 8 parallel steps → Z.
func fanout(ctx context.Context, o Options) (Result, error) {
	e, err := start(ctx, o, noop)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	parts := []string{`"a": {"task": {"type": "bench.noop.v1"}}`}
	var mids []string
	for i := 1; i <= 8; i++ {
		parts = append(parts, fmt.Sprintf(`"m%d": {"needs": ["a"], "task": {"type": "bench.noop.v1"}}`, i))
		mids = append(mids, fmt.Sprintf(`"m%d"`, i))
	}
	parts = append(parts, `"z": {"needs": [`+strings.Join(mids, ",")+`], "task": {"type": "bench.noop.v1"}}`)
	r, _, err := e.drive(ctx, o, "fanout", `{"name": "bench-fanout", "tasks": {`+strings.Join(parts, ",")+`}}`, 10, 10, false, false)
	return r, err
}

// sleep: runs that sleep 1s and then run one no-op step; lateness is the
// sleep step's actual end minus its intended wake time.
func sleepers(ctx context.Context, o Options) (Result, error) {
	e, err := start(ctx, o, noop)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	r, steps, err := e.drive(ctx, o, "sleep", `{"name": "bench-sleep", "tasks": {"nap": {"sleep": "1s"}, "after": {"needs": ["nap"], "task": {"type": "bench.noop.v1"}}}}`, 2, 1, false, true)
	if err != nil {
		return Result{}, err
	}
	var late []float64
	for _, ss := range steps {
		for _, s := range ss {
			if s.Name == "nap" && s.Status == status.StepSuccess && s.WakeAt != nil && s.FinishedAt != nil {
				late = append(late, msBetween(*s.WakeAt, *s.FinishedAt))
			}
		}
	}
	r.LatenessMS = pct(late)
	return r, nil
}

// span is the first start, the last finish and each run's latency.
func span(runs []*store.Run) (time.Time, time.Time, []float64) {
	var first, last time.Time
	lat := make([]float64, 0, len(runs))
	for _, r := range runs {
		if first.IsZero() || r.StartedAt.Before(first) {
			first = r.StartedAt
		}
		if r.FinishedAt != nil {
			if r.FinishedAt.After(last) {
				last = *r.FinishedAt
			}
			lat = append(lat, msBetween(r.StartedAt, *r.FinishedAt))
		}
	}
	return first, last, lat
}

// resetPeakRSS restarts the kernel's high-water mark of this process at
// what it holds now. With free, the heap a workload before freed is given
// back to the system first: the Go runtime keeps freed pages resident and
// returns them only slowly, so without it the next workload's peak starts
// at the last one's (chain10 after jobs 146 MB, alone 58). A repeat of the
// same workload keeps the heap, as a server running that work does: given
// back, every page had to be faulted in again (≈5 µs each on this host:
// three Postgres jobs runs took 110,000 minor faults against 60,000 kept,
// and 1.72 s of system CPU against 1.38), while the peers' repeats run
// warm.
func resetPeakRSS(free bool) {
	if free {
		debug.FreeOSMemory()
	}
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// peakRSS is the process's resident high-water mark in MB.
func peakRSS() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return round(kb / 1024)
		}
	}
	return 0
}
