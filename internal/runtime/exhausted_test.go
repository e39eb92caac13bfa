package runtime_test

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
)

// exhaust leaves a task of max_attempts 1 whose only lease ran out, and a
// fresh ready task of its type behind it in claim order.
func exhaust(t *testing.T, e *env) (exhausted, fresh string) {
	t.Helper()
	k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", MaxAttempts: 1})
	if got := e.claim(t, "billing.%"); len(got) != 1 {
		t.Fatalf("first claim: %d tasks", len(got))
	}
	e.clk.Advance(31 * time.Second)
	return k.ID, e.create(t, runtime.NewTask{Type: "billing.invoice.v1"}).ID
}

// TestExhaustedTaskDoesNotTakeTheClaimsPlace: a claim of one task that
// meets a task whose final attempt's lease ran out fails that task and
// hands out the ready one behind it, at once and with no wait; the failed
// task keeps its one attempt. (Found by an audit: the claim spent its
// place on the exhausted task and answered nothing, or waited out its
// whole wait, while a task was ready.)
func TestExhaustedTaskDoesNotTakeTheClaimsPlace(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		for _, wait := range []time.Duration{0, 20 * time.Second} {
			old, fresh := exhaust(t, e)
			done := make(chan []string, 1)
			go func() {
				got, err := e.rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: []string{"billing.%"}, WorkerID: "w2", Lease: 30 * time.Second, Max: 1, Wait: wait})
				if err != nil {
					t.Error(err)
				}
				var ids []string
				for _, k := range got {
					ids = append(ids, k.ID)
				}
				done <- ids
			}()
			select {
			case got := <-done:
				if len(got) != 1 || got[0] != fresh {
					t.Errorf("wait %v: claim of one got %v, want the ready task %s", wait, got, fresh)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("wait %v: the claim did not answer with the ready task (the clock stands still)", wait)
			}
			if k := e.get(t, old); k.Status != status.TaskFailed || k.Attempt != 1 {
				t.Errorf("wait %v: the exhausted task is %s at attempt %d, want failed at 1", wait, k.Status, k.Attempt)
			}
			if got := e.claim(t, "billing.%"); len(got) != 0 {
				t.Fatalf("left over: %d tasks", len(got))
			}
			e.clk.Advance(time.Hour) // the fresh task's lease ends: out of the next round's way
			for _, k := range e.claim(t, "billing.%") {
				if _, err := e.rt.CompleteTask(t.Context(), k.ID, k.LeaseToken, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// TestExhaustedStepKeepsItsAttempt: a task step with no retries whose one
// attempt's lease ran out fails with attempt 1, the attempt made.
func TestExhaustedStepKeepsItsAttempt(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		e.workflow(t, `{"name": "ex", "tasks": {"a": {"task": {"type": "content.upload.v1"}, "retries": 0}}}`)
		r := e.trigger(t, "ex", `{}`)
		e.claimOne(t, "content.%")
		e.clk.Advance(31 * time.Second)
		if got := e.claim(t, "content.%"); len(got) != 0 {
			t.Fatalf("handed out again")
		}
		run, steps := e.run(t, r.ID)
		// A lone failed step ends its run completed (nothing is blocked).
		if run.Status != status.RunCompleted || steps["a"].Status != status.StepFailed || steps["a"].Attempt != 1 {
			t.Errorf("run %s, step %s at attempt %d; want completed, failed at 1", run.Status, steps["a"].Status, steps["a"].Attempt)
		}
	})
}

// TestClaimAfterFailingExhaustedTasksClaimsAgain: a claim of one whose
// only candidate was a task on its final attempt (failed, not handed out)
// claims again at once and gets the next task behind it, an expired lease
// with attempts left, with or without a wait.
func TestClaimAfterFailingExhaustedTasksClaimsAgain(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		for _, wait := range []time.Duration{0, 20 * time.Second} {
			a := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", MaxAttempts: 1})
			b := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", MaxAttempts: 3})
			if got := e.claim(t, "billing.%"); len(got) != 2 {
				t.Fatalf("first claim: %d tasks", len(got))
			}
			e.clk.Advance(31 * time.Second) // both leases run out; nothing is pending
			got, err := e.rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: []string{"billing.%"}, WorkerID: "w2", Lease: 30 * time.Second, Max: 1, Wait: wait})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].ID != b.ID || got[0].Attempt != 2 {
				t.Fatalf("wait %v: claim of one got %+v, want %s at attempt 2", wait, got, b.ID)
			}
			if k := e.get(t, a.ID); k.Status != status.TaskFailed || k.Attempt != 1 {
				t.Errorf("wait %v: the exhausted task is %s at attempt %d, want failed at 1", wait, k.Status, k.Attempt)
			}
			if _, err := e.rt.CompleteTask(t.Context(), got[0].ID, got[0].LeaseToken, nil); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// restarted is a runtime on e's store and clock that has seen nothing yet:
// the server after a restart.
func restarted(t *testing.T, e *env) *runtime.Runtime {
	t.Helper()
	rt := runtime.New(runtime.Config{Store: e.st, Clock: e.clk, PublicURL: "http://ferry.test", HTTP: httpstep.New(nil), Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(rt.Close)
	return rt
}

// TestExhaustedAfterRestartKeepsItsAttempt: after a restart (no task type
// known yet), a claim that meets a task whose final attempt's lease ran
// out fails it at that attempt, whether the limit is the default or its
// type's registry entry, and leases at once a task of an unknown type
// with attempts left. (Found by an audit: the restarted server's first
// claim leased the exhausted task again, recording a claim of attempt 6
// of 5 for a worker that never got it, before failing it.)
func TestExhaustedAfterRestartKeepsItsAttempt(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		if _, err := e.st.PutTaskType(t.Context(), &store.TaskType{Type: "reg.short.v1", Enabled: true, MaxAttempts: 2}); err != nil {
			t.Fatal(err)
		}
		def := e.create(t, runtime.NewTask{Type: "billing.invoice.v1"})
		reg := e.create(t, runtime.NewTask{Type: "reg.short.v1"})
		for i := 0; i < runtime.DefaultTaskMaxAttempts; i++ {
			types := []string{"billing.%"}
			if i < 2 {
				types = append(types, "reg.%")
			}
			if got := e.claim(t, types...); len(got) != len(types) {
				t.Fatalf("claim %d: %d tasks, want %d", i+1, len(got), len(types))
			}
			e.clk.Advance(31 * time.Second)
		}
		left := e.create(t, runtime.NewTask{Type: "content.upload.v1"})
		e.claimOne(t, "content.%")
		e.clk.Advance(31 * time.Second)

		rt := restarted(t, e)
		got, err := rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: []string{"billing.%", "reg.%", "content.%"}, WorkerID: "w2", Lease: 30 * time.Second, Max: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].ID != left.ID || got[0].Attempt != 2 {
			t.Fatalf("claim after the restart got %+v, want %s at attempt 2", got, left.ID)
		}
		for _, c := range []struct {
			id   string
			want int
		}{{def.ID, runtime.DefaultTaskMaxAttempts}, {reg.ID, 2}} {
			if k := e.get(t, c.id); k.Status != status.TaskFailed || k.Attempt != c.want {
				t.Errorf("task %s is %s at attempt %d, want failed at %d", k.Type, k.Status, k.Attempt, c.want)
			}
			evs := e.events(t, c.id)
			var types []string
			for _, ev := range evs[len(evs)-3:] {
				types = append(types, ev.Type)
			}
			if want := []string{"claimed", "lease_expired", "failed"}; !slices.Equal(types, want) {
				t.Errorf("task %s: events end %v, want %v", c.id, types, want)
			}
		}
	})
}

// TestRetryPastALoweredLimitFailsWithItsError: a task waiting for a retry
// whose type's max_attempts is lowered to the attempts it has made fails
// when a claim meets it, at the attempt it made and with that attempt's
// error, and the claim takes the ready task behind it. (It was leased for
// an attempt past its limit, a claim no worker got, and failed as if that
// attempt's lease had run out: "lease expired on the final attempt; the
// worker never reported", its error lost.)
func TestRetryPastALoweredLimitFailsWithItsError(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", RetryDelay: time.Second})
		ct := e.claimOne(t, "billing.%")
		if _, err := e.rt.FailTask(t.Context(), k.ID, ct.LeaseToken, "smtp down", true); err != nil {
			t.Fatal(err)
		}
		// As PUT /api/v1/task-types/{type} does.
		if _, err := e.st.PutTaskType(t.Context(), &store.TaskType{Type: "billing.invoice.v1", Enabled: true, MaxAttempts: 1}); err != nil {
			t.Fatal(err)
		}
		e.rt.TaskTypesChanged()
		e.clk.Advance(2 * time.Second) // the retry is due
		fresh := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", MaxAttempts: 3})

		got, err := e.rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: []string{"billing.%"}, WorkerID: "w2", Lease: 30 * time.Second, Max: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].ID != fresh.ID {
			t.Fatalf("claim of one got %+v, want the ready task %s", got, fresh.ID)
		}
		if k := e.get(t, k.ID); k.Status != status.TaskFailed || k.Attempt != 1 || k.LastError != "smtp down" {
			t.Errorf("the retry is %s at attempt %d with %q, want failed at 1 with %q", k.Status, k.Attempt, k.LastError, "smtp down")
		}
		if got := types(e.events(t, k.ID)); got != "created,claimed,retried,failed" {
			t.Errorf("events %s", got)
		}
	})
}
