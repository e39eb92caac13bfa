package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// scaleProbes is how many chain10 runs and single claims each level measures.
const scaleProbes = 100

// scale retains ever more finished runs (default 10k, 100k, 1M; with -n N:
// N/100, N/10, N) and at each level measures chain10 hand-off latency and the
// latency of claiming one task: finished work must not slow the hot path.
// One result per level: n is the retained count, handoff_ms the chain10
// hand-off, latency_ms the claim latency.
func scale(ctx context.Context, o Options) ([]Result, error) {
	levels := []int{10_000, 100_000, 1_000_000}
	if o.N > 0 {
		levels = []int{max(o.N/100, 1), max(o.N/10, 1), o.N}
	}
	if o.Workers <= 0 {
		o.Workers = defaultWorkers("scale")
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Hour
	}
	h := newHandoffs()
	e, err := start(ctx, o, h.handle)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	chainID, _, err := e.eng.ApplyWorkflow(ctx, []byte(chain10Def()))
	if err != nil {
		return nil, err
	}
	keptID, keptVersion, err := e.eng.ApplyWorkflow(ctx, []byte(`{"name": "bench-retained", "tasks": {"job": {"task": {"type": "bench.retained.v1"}}}}`))
	if err != nil {
		return nil, err
	}
	e.startWorkers()
	var out []Result
	retained, chained := 0, 0
	for _, level := range levels {
		if err := e.retain(ctx, keptID, keptVersion, level-retained); err != nil {
			return out, err
		}
		retained = level
		if err := e.settle(ctx); err != nil {
			return out, err
		}
		h.reset()
		chained += scaleProbes
		calls := e.handled.Load() + scaleProbes*10
		if err := e.triggerAll(ctx, "bench-chain10", scaleProbes); err != nil {
			return out, err
		}
		if _, err := e.waitDone(ctx, chainID, chained, calls, o.Timeout); err != nil {
			return out, err
		}
		claims, err := e.claimLatency(ctx)
		if err != nil {
			return out, err
		}
		r := Result{Workload: "scale", Backend: e.backend, N: level, Completed: retained, HandoffMS: pct(h.chain10()), LatencyMS: pct(claims), PeakRSSMB: peakRSS(), Settings: map[string]any{}}
		for k, v := range e.settings {
			r.Settings[k] = v
		}
		r.Settings["retained_runs"] = retained
		r.Settings["probe_runs"] = scaleProbes
		r.Settings["latency"] = "claim of one task (ms)"
		if e.backend == "postgres" {
			r.Settings["settle"] = "VACUUM (ANALYZE) after retaining"
		}
		out = append(out, r)
		if o.progress != nil {
			o.progress(r)
		}
	}
	return out, nil
}

// retain writes n finished one-step runs (run, step, succeeded task and
// events), as years of history would leave them.
func (e *env) retain(ctx context.Context, workflowID string, version, n int) error {
	const batch = 256 // runs per transaction
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				hi := next.Add(batch)
				lo := hi - batch
				if lo >= int64(n) {
					return
				}
				now := time.Now()
				var nrs []*store.NewRun
				for i := lo; i < min(hi, int64(n)); i++ {
					fin := now
					nrs = append(nrs, &store.NewRun{
						Run:    store.Run{ID: uuid.Must(uuid.NewV7()).String(), WorkflowID: workflowID, Version: version, Status: status.RunCompleted, Input: json.RawMessage(`{"kept":true}`), StartedAt: now, FinishedAt: &fin, ExpiresAt: now.Add(30 * 24 * time.Hour)},
						Steps:  []*store.StepRun{{Name: "job", Type: "task", Status: status.StepSuccess, Attempt: 1, Body: []byte(`{"ok":true}`), StartedAt: &fin, FinishedAt: &fin}},
						Tasks:  []*store.Task{{Type: "bench.retained.v1", Payload: json.RawMessage(`{}`), Status: status.TaskSucceeded, Priority: 100, RunAt: now, Attempt: 1, Result: json.RawMessage(`{"ok":true}`), Step: "job", FinishedAt: &fin}},
						Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_succeeded", Step: "job"}, {Type: "run_completed"}},
					})
				}
				if _, err := e.st.CreateRuns(ctx, nrs, now); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// settle lets the database finish the upkeep a bulk load starts, so the
// probes measure steady state rather than an autovacuum of the tables just
// filled: on Postgres it vacuums and analyzes them (what autovacuum does
// within a minute or two anyway). SQLite has no such upkeep.
func (e *env) settle(ctx context.Context) error {
	if e.backend != "postgres" {
		return nil
	}
	db, ok := e.st.(interface{ DB() *sql.DB })
	if !ok {
		return nil
	}
	_, err := db.DB().ExecContext(ctx, "VACUUM (ANALYZE) runs, step_runs, tasks, queue, events")
	return err
}

// claimLatency times single-task claims with many finished tasks around.
func (e *env) claimLatency(ctx context.Context) ([]float64, error) {
	for i := 0; i < scaleProbes; i++ {
		if _, _, err := e.eng.CreateTask(ctx, client.NewTask{Type: "scale.probe.v1"}); err != nil {
			return nil, err
		}
	}
	var lat []float64
	for i := 0; i < scaleProbes; i++ {
		t0 := time.Now()
		got, err := e.eng.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"scale.%"}, WorkerID: "probe", Lease: time.Minute, Max: 1})
		if err != nil {
			return nil, err
		}
		lat = append(lat, msBetween(t0, time.Now()))
		for _, t := range got {
			if err := e.eng.CompleteTask(ctx, t.ID, t.LeaseToken, map[string]any{}); err != nil {
				return nil, err
			}
		}
	}
	return lat, nil
}
