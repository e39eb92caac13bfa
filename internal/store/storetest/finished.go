package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// testFinishedTold: OnFinished tells each step and run a committed write
// ended, once, with its times, attempt, error and the run's trigger
// headers: a step skipped as its run was created, a task step finished
// through a report batch, a step and its run failed together. Nothing is
// told of a write that rolled back, of a finished step rewritten later, or
// of a step that only started.
func testFinishedTold(t *testing.T, s store.Store) {
	var mu sync.Mutex
	var got [][]store.Finished
	s.OnFinished(func(f []store.Finished) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, append([]store.Finished(nil), f...))
	})
	take := func() [][]store.Finished {
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}
	wf := mkWorkflow(t, s, "wf")
	t1 := t0
	r := mkRun(t, s, &store.NewRun{
		Run: baseRun(wf, ""),
		Steps: []*store.StepRun{
			{Name: "a", Position: 0, Type: "task", Status: status.StepRunning, StartedAt: &t1},
			{Name: "b", Position: 1, Type: "http", Status: status.StepPending},
			{Name: "c", Position: 2, Type: "sleep", Status: status.StepSkipped, FinishedAt: &t1},
		},
		Tasks: []*store.Task{
			{Type: "finished.a.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: t0, Step: "a"},
		},
		Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_started", Step: "a"}, {Type: "step_skipped", Step: "c"}},
	})
	headers := map[string]string{"X-Request-Id": "req-1"}
	base := store.Finished{RunID: r.ID, WorkflowID: wf.ID, Version: wf.Version, TriggerHeaders: headers}
	with := func(f store.Finished) store.Finished {
		f.RunID, f.WorkflowID, f.Version, f.TriggerHeaders = base.RunID, base.WorkflowID, base.Version, base.TriggerHeaders
		return f
	}
	diff(t, "told as the run was created", [][]store.Finished{{with(store.Finished{Step: "c", Type: "sleep", Status: status.StepSkipped, FinishedAt: t0})}}, take())

	k := claimTasks(t, s, []string{"finished.a.v1"}, "w", t0, time.Minute, 1)
	if len(k) != 1 {
		t.Fatalf("claimed %d tasks, want 1", len(k))
	}
	done := at(time.Second)
	errs, err := s.InTasks(t.Context(), []string{k[0].ID}, nil, done, func(_ int, tx store.TaskTx) error {
		if err := succeedTask(tx); err != nil {
			return err
		}
		rt := tx.Run()
		a := *rt.Step("a")
		a.Status, a.Attempt, a.FinishedAt = status.StepSuccess, 1, &done
		if err := rt.UpdateStep(&a); err != nil {
			return err
		}
		return rt.Append(store.NewEvent{Type: "step_succeeded", Step: "a"})
	})
	must(t, err, "InTasks")
	must(t, errs[0], "InTasks's report")
	diff(t, "told as the task step succeeded", [][]store.Finished{{with(store.Finished{Step: "a", Type: "task", Status: status.StepSuccess, Attempt: 1, StartedAt: t0, FinishedAt: done})}}, take())

	started := at(2 * time.Second)
	inRun(t, s, r.ID, started, func(tx store.RunTx) error {
		a := *tx.Step("a")
		a.Error = "rewritten" // a finished step written again: not told again
		b := *tx.Step("b")
		b.Status, b.Attempt, b.StartedAt = status.StepRunning, 1, &started
		if err := tx.UpdateStep(&a); err != nil {
			return err
		}
		if err := tx.UpdateStep(&b); err != nil {
			return err
		}
		return tx.Append(store.NewEvent{Type: "step_started", Step: "b"})
	})
	boom := errors.New("boom")
	if err := s.InRun(t.Context(), r.ID, at(3*time.Second), func(tx store.RunTx) error {
		b := *tx.Step("b")
		now := at(3 * time.Second)
		b.Status, b.FinishedAt = status.StepSuccess, &now
		if err := tx.UpdateStep(&b); err != nil {
			return err
		}
		if err := tx.Append(store.NewEvent{Type: "step_succeeded", Step: "b"}); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("InRun error = %v, want fn's error", err)
	}
	if g := take(); len(g) != 0 {
		t.Errorf("told %+v of a started step, a rewritten one and a rolled-back write, want nothing", g)
	}

	failed := at(4 * time.Second)
	inRun(t, s, r.ID, failed, func(tx store.RunTx) error {
		b := *tx.Step("b")
		b.Status, b.Attempt, b.Error, b.FinishedAt = status.StepFailed, 2, "HTTP 500", &failed
		if err := tx.UpdateStep(&b); err != nil {
			return err
		}
		run := *tx.Run()
		run.Status, run.Error, run.FinishedAt = status.RunFailed, "step b failed", &failed
		if err := tx.UpdateRun(&run); err != nil {
			return err
		}
		return tx.Append(store.NewEvent{Type: "step_failed", Step: "b"}, store.NewEvent{Type: "run_failed"})
	})
	diff(t, "told as the step and its run failed", [][]store.Finished{{
		with(store.Finished{Step: "b", Type: "http", Status: status.StepFailed, Attempt: 2, Error: "HTTP 500", StartedAt: started, FinishedAt: failed}),
		with(store.Finished{Status: status.RunFailed, Error: "step b failed", StartedAt: t0, FinishedAt: failed}),
	}}, take())

	// A run cancelled while a step is under way: the step ends with it,
	// told with the run; a step that never started is not told.
	r2 := mkRun(t, s, &store.NewRun{
		Run: baseRun(wf, ""),
		Steps: []*store.StepRun{
			{Name: "x", Position: 0, Type: "sleep", Status: status.StepSleeping, StartedAt: &t1},
			{Name: "y", Position: 1, Type: "task", Status: status.StepPending},
		},
		Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_sleeping", Step: "x"}},
	})
	cancelled := at(5 * time.Second)
	inRun(t, s, r2.ID, cancelled, func(tx store.RunTx) error {
		for _, name := range []string{"x", "y"} {
			st := *tx.Step(name)
			st.Status, st.Error, st.FinishedAt = status.StepCancelled, "run cancelled", &cancelled
			if err := tx.UpdateStep(&st); err != nil {
				return err
			}
		}
		run := *tx.Run()
		run.Status, run.Error, run.FinishedAt = status.RunCancelled, "cancelled by request", &cancelled
		if err := tx.UpdateRun(&run); err != nil {
			return err
		}
		return tx.Append(store.NewEvent{Type: "run_cancelled"})
	})
	base.RunID = r2.ID
	diff(t, "told as the run was cancelled", [][]store.Finished{{
		with(store.Finished{Status: status.RunCancelled, Error: "cancelled by request", StartedAt: t0, FinishedAt: cancelled}),
		with(store.Finished{Step: "x", Type: "sleep", Status: status.StepCancelled, Error: "run cancelled", StartedAt: t0, FinishedAt: cancelled}),
	}}, take())

	// A step told by its own event in the write that cancels its run is
	// told once, whichever event comes first.
	for _, stepFirst := range []bool{true, false} {
		r3 := mkRun(t, s, &store.NewRun{
			Run:    baseRun(wf, ""),
			Steps:  []*store.StepRun{{Name: "z", Position: 0, Type: "task", Status: status.StepRunning, StartedAt: &t1}},
			Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_started", Step: "z"}},
		})
		inRun(t, s, r3.ID, cancelled, func(tx store.RunTx) error {
			z := *tx.Step("z")
			z.Status, z.Error, z.FinishedAt = status.StepCancelled, "task cancelled", &cancelled
			if err := tx.UpdateStep(&z); err != nil {
				return err
			}
			run := *tx.Run()
			run.Status, run.Error, run.FinishedAt = status.RunCancelled, "cancelled by request", &cancelled
			if err := tx.UpdateRun(&run); err != nil {
				return err
			}
			evs := []store.NewEvent{{Type: "step_failed", Step: "z"}, {Type: "run_cancelled"}}
			if !stepFirst {
				evs[0], evs[1] = evs[1], evs[0]
			}
			return tx.Append(evs...)
		})
		base.RunID = r3.ID
		step := with(store.Finished{Step: "z", Type: "task", Status: status.StepCancelled, Error: "task cancelled", StartedAt: t0, FinishedAt: cancelled})
		run := with(store.Finished{Status: status.RunCancelled, Error: "cancelled by request", StartedAt: t0, FinishedAt: cancelled})
		want := []store.Finished{step, run}
		if !stepFirst {
			want = []store.Finished{run, step}
		}
		diff(t, fmt.Sprintf("told as a step and its run were cancelled together (step's event first: %v)", stepFirst), [][]store.Finished{want}, take())
	}
}
