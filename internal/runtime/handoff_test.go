package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/testwait"
)

// claimResult is what a claim started in the background returned.
type claimResult struct {
	ts  []*store.Task
	err error
}

// waitingClaim starts a claim that long-polls for wait and returns once it
// is waiting (writes can hand it tasks; its timer may start a little later).
func (e *env) waitingClaim(t *testing.T, ctx context.Context, wait time.Duration, types ...string) <-chan claimResult {
	t.Helper()
	return e.waitingClaimOf(t, ctx, wait, 5, types...)
}

// waitingClaimOf is waitingClaim for at most max tasks.
func (e *env) waitingClaimOf(t *testing.T, ctx context.Context, wait time.Duration, max int, types ...string) <-chan claimResult {
	t.Helper()
	n := e.rt.WaitingClaims()
	done := make(chan claimResult, 1)
	go func() {
		ts, err := e.rt.ClaimTasks(ctx, runtime.ClaimRequest{Types: types, WorkerID: "waiter", Lease: time.Minute, Max: max, Wait: wait})
		done <- claimResult{ts, err}
	}()
	e.waitForClaims(t, n+1)
	return done
}

// waitForClaims waits (in real time, bounded) until n claims are waiting.
func (e *env) waitForClaims(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.rt.WaitingClaims() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d claims waiting after 10s, want %d", e.rt.WaitingClaims(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// recvClaim waits (bounded, in real time) for the claim's answer.
func recvClaim(t *testing.T, done <-chan claimResult) claimResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting claim did not return within 10s")
		return claimResult{}
	}
}

// wantHandedOver checks that k, returned by a waiting claim, is stored
// leased to it with the token it got, and that its claimed event says it
// was handed to a waiting claim in the transaction that created it.
func wantHandedOver(t *testing.T, e *env, k *store.Task, step string) {
	t.Helper()
	if k.Step != step || k.Status != status.TaskLeased || k.Attempt != 1 || k.LeasedBy != "waiter" || k.LeaseToken == "" ||
		k.LeaseUntil == nil || !k.LeaseUntil.Equal(e.clk.Now().Add(time.Minute)) {
		t.Fatalf("handed task = %+v, want step %s leased to the waiter for a minute", k, step)
	}
	stored := e.get(t, k.ID)
	if stored.Status != status.TaskLeased || stored.LeaseToken != k.LeaseToken || stored.Attempt != 1 {
		t.Fatalf("stored task = {Status:%s Attempt:%d}, want leased attempt 1 with the handed token", stored.Status, stored.Attempt)
	}
	evs := e.events(t, k.ID)
	if got := types(evs); got != "created,claimed" {
		t.Fatalf("events = %s, want created,claimed (one transaction, no claim of its own)", got)
	}
	if d := string(evs[1].Data); !strings.Contains(d, `"waiting_claim":true`) || strings.Contains(d, `"eager"`) {
		t.Errorf("claimed event data = %s, want waiting_claim", d)
	}
}

// TestHandoffToWaitingClaim: a claim waiting on this server gets the tasks
// a trigger, a completion (without eager dispatch) and a timer's wake-up
// create, leased to it in the transaction that creates them.
func TestHandoffToWaitingClaim(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		startRuntime(t, e.rt)
		e.workflow(t, `{"name": "handoff", "tasks": {
			"a": {"task": {"type": "hand.a.v1"}},
			"nap": {"needs": ["a"], "sleep": "1s"},
			"b": {"needs": ["nap"], "task": {"type": "hand.b.v1"}}}}`)

		// Trigger.
		done := e.waitingClaim(t, ctx, 7*time.Second, "hand.%")
		r := e.trigger(t, "handoff", `{}`)
		got := recvClaim(t, done)
		if got.err != nil || len(got.ts) != 1 {
			t.Fatalf("claim = %d tasks, %v; want the trigger's task", len(got.ts), got.err)
		}
		wantHandedOver(t, e, got.ts[0], "a")

		// A timer's wake-up: the completion of a starts the sleep, which
		// creates no task; at its wake-up b is handed over.
		_, err := e.rt.CompleteTask(ctx, got.ts[0].ID, got.ts[0].LeaseToken, json.RawMessage(`{}`))
		must(t, err, "CompleteTask a")
		done = e.waitingClaim(t, ctx, 7*time.Second, "hand.%")
		wake := e.clk.Now().Add(time.Second)
		testwait.Until(t, 10*time.Second, "the timer loop waiting for the wake-up", func() bool { return e.clk.HasTimerBy(wake) })
		e.clk.Advance(time.Second)
		got = recvClaim(t, done)
		if got.err != nil || len(got.ts) != 1 {
			t.Fatalf("claim = %d tasks, %v; want the wake-up's task", len(got.ts), got.err)
		}
		wantHandedOver(t, e, got.ts[0], "b")
		_, steps := e.run(t, r.ID)
		if nap := steps["nap"]; nap.Status != status.StepSuccess || nap.FinishedAt == nil || !nap.FinishedAt.Equal(e.clk.Now()) {
			t.Fatalf("nap = %+v, want succeeded at the wake-up", nap)
		}
		_, err = e.rt.CompleteTask(ctx, got.ts[0].ID, got.ts[0].LeaseToken, nil)
		must(t, err, "CompleteTask b")

		// A completion that does not take what it starts; the claim
		// waiting longest is for other types and is passed over.
		e.workflow(t, `{"name": "handoff2", "tasks": {
			"a": {"task": {"type": "hand.a.v1"}},
			"b": {"needs": ["a"], "task": {"type": "hand.b.v1"}}}}`)
		r2 := e.trigger(t, "handoff2", `{}`)
		a := e.claimOne(t, "hand.%")
		octx, stopOther := context.WithCancel(ctx)
		defer stopOther()
		other := e.waitingClaim(t, octx, 8*time.Second, "other.%")
		done = e.waitingClaim(t, ctx, 7*time.Second, "hand.b.v1")
		_, err = e.rt.CompleteTask(ctx, a.ID, a.LeaseToken, json.RawMessage(`{}`))
		must(t, err, "CompleteTask a of handoff2")
		got = recvClaim(t, done)
		if got.err != nil || len(got.ts) != 1 || got.ts[0].RunID != r2.ID {
			t.Fatalf("claim = %+v, %v; want the completion's next task", got.ts, got.err)
		}
		wantHandedOver(t, e, got.ts[0], "b")
		stopOther()
		if r := recvClaim(t, other); len(r.ts) != 0 {
			t.Fatalf("the claim for other types got %d tasks", len(r.ts))
		}
	})
}

// TestHandoffNotWhatTheCommitCancels: a wake-up that starts a task and
// the run's expiry fire in one transaction; the task is created (leased
// to the waiting claim) and cancelled with its run there, and the claim
// is not handed it.
func TestHandoffNotWhatTheCommitCancels(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		startRuntime(t, e.rt)
		e.workflow(t, `{"name": "expiring", "max_duration": "3s", "tasks": {
			"nap": {"sleep": "2s"},
			"b": {"needs": ["nap"], "task": {"type": "exp.b.v1"}}}}`)
		r := e.trigger(t, "expiring", `{}`)
		done := e.waitingClaim(t, ctx, 7*time.Second, "exp.%")
		// The timer loop must be asleep until the wake-up (the only timer
		// due that early) before the clock moves, or it would set that
		// timer after the move, from the new now, and sleep past both.
		testwait.Until(t, 10*time.Second, "the timer loop waiting for the wake-up", func() bool { return e.clk.HasTimerBy(t0.Add(2 * time.Second)) })
		e.clk.Advance(3 * time.Second) // the wake-up and the expiry are both due
		deadline := time.Now().Add(10 * time.Second)
		for {
			run, _ := e.run(t, r.ID)
			if run.Status == status.RunTimeout {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("run is %s 10s after its expiry, want timeout", run.Status)
			}
			time.Sleep(5 * time.Millisecond)
		}
		_, steps := e.run(t, r.ID)
		// The write that reserved the claim settled with nothing for it:
		// it waits again, for the rest of its wait (a timer of 4s), then
		// ends.
		e.waitForClaims(t, 1)
		for i := 0; e.clk.waitTimer(t) != 4*time.Second; i++ {
			if i == 50 {
				t.Fatal("the claim did not wait again for the rest of its wait (4s)")
			}
		}
		e.clk.Advance(4 * time.Second)
		if got := recvClaim(t, done); got.err != nil || len(got.ts) != 0 {
			t.Fatalf("claim = %+v, %v; want nothing: the run ended in the commit that created its task", got.ts, got.err)
		}
		if b := steps["b"]; b.Status == status.StepRunning || b.Status == status.StepSuccess {
			t.Fatalf("step b = %s after the run timed out", b.Status)
		}
	})
}

// TestHandoffOnlyWhatCommitted: a batch whose idempotency key repeats
// builds a run (and its task) that is not created; the waiting claim gets
// only the task that was written, and nothing else is left leased.
func TestHandoffOnlyWhatCommitted(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		e.workflow(t, `{"name": "keyed", "tasks": {"a": {"task": {"type": "keyed.a.v1"}}}}`)
		done := e.waitingClaim(t, ctx, 7*time.Second, "keyed.%")
		res, err := e.rt.TriggerBatch(ctx, "keyed", []runtime.TriggerRequest{
			{Input: json.RawMessage(`{"i": 1}`), IdempotencyKey: "k"},
			{Input: json.RawMessage(`{"i": 2}`), IdempotencyKey: "k"},
		})
		must(t, err, "TriggerBatch")
		if !res[0].Created || res[1].Created || res[1].Run.ID != res[0].Run.ID {
			t.Fatalf("batch = %+v, want one run created and the repeat pointing at it", res)
		}
		got := recvClaim(t, done)
		if got.err != nil || len(got.ts) != 1 || got.ts[0].RunID != res[0].Run.ID {
			t.Fatalf("claim = %+v, %v; want the one task written", got.ts, got.err)
		}
		wantHandedOver(t, e, got.ts[0], "a")
		if more := e.claim(t, "keyed.%"); len(more) != 0 {
			t.Fatalf("a further claim found %d tasks, want none", len(more))
		}
	})
}

// gatedStore holds CreateRuns until the test opens the gate.
type gatedStore struct {
	store.Store
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedStore) CreateRuns(ctx context.Context, nrs []*store.NewRun, now time.Time) ([]store.CreateResult, error) {
	g.entered <- struct{}{}
	<-g.gate
	return g.Store.CreateRuns(ctx, nrs, now)
}

// TestHandoffCallerGone: a claim whose caller goes away while a write that
// reserved it is in flight waits for that write and hands the task back:
// it is pending again, its attempt not counted, for the next claim.
func TestHandoffCallerGone(t *testing.T) {
	forEachStore(t, func(t *testing.T, base *env) {
		g := &gatedStore{Store: base.st, entered: make(chan struct{}, 1), gate: make(chan struct{})}
		e := newEnv(t, g)
		e.workflow(t, `{"name": "gone", "tasks": {"a": {"task": {"type": "gone.a.v1"}}}}`)
		cctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := e.waitingClaim(t, cctx, 7*time.Second, "gone.%")
		trig := make(chan error, 1)
		go func() {
			_, _, err := e.rt.Trigger(t.Context(), runtime.TriggerRequest{Workflow: "gone", Input: json.RawMessage(`{}`)})
			trig <- err
		}()
		select {
		case <-g.entered: // the claim is reserved, the write held
		case <-time.After(10 * time.Second):
			t.Fatal("the trigger did not reach the store within 10s")
		}
		cancel()
		// A bounded window for something that must not happen: the claim
		// may not leave while the write that reserved it is in flight.
		select {
		case r := <-done:
			t.Fatalf("the claim returned (%d tasks, %v) while the write that reserved it was in flight", len(r.ts), r.err)
		case <-time.After(200 * time.Millisecond):
		}
		close(g.gate)
		got := recvClaim(t, done)
		if !errors.Is(got.err, context.Canceled) || len(got.ts) != 0 {
			t.Fatalf("claim of a caller gone = %d tasks, %v; want none and context.Canceled", len(got.ts), got.err)
		}
		must(t, <-trig, "Trigger")
		k := e.claimOne(t, "gone.%")
		if k.Attempt != 1 {
			t.Errorf("reclaimed task attempt = %d, want 1 (the handed-back lease is not counted)", k.Attempt)
		}
		if got := types(e.events(t, k.ID)); got != "created,claimed,released,claimed" {
			t.Errorf("events = %s, want created,claimed,released,claimed", got)
		}
	})
}

// twiceStore decides every report batch twice, the first decision
// abandoned, as a store does when rows it decided on changed since it
// cached them (store.InTasks).
type twiceStore struct {
	store.Store
}

var errAbandoned = errors.New("abandoned decision")

func (s twiceStore) InTasks(ctx context.Context, ids []string, runs map[string]string, now time.Time, fn func(i int, tx store.TaskTx) error) ([]error, error) {
	if _, err := s.Store.InTasks(ctx, ids, runs, now, func(i int, tx store.TaskTx) error {
		if err := fn(i, tx); err != nil {
			return err
		}
		return errAbandoned // nothing of it is written
	}); err != nil {
		return nil, err
	}
	return s.Store.InTasks(ctx, ids, runs, now, fn)
}

// FireTimers decides each fire transaction twice as well: first fn is
// given the items read under their runs' locks in transactions rolled
// back, then fn(nil, nil) drops that decision, as a store does when rows
// it decided on changed since it read them (store.FireTimers).
func (s twiceStore) FireTimers(ctx context.Context, runIDs []string, read []*store.QueueItem, now time.Time, lease time.Duration, fn func(*store.QueueItem, store.RunTx) error) (int, []error, error) {
	called := false
	for _, id := range runIDs {
		err := s.Store.InRun(ctx, id, now, func(tx store.RunTx) error {
			for _, it := range read {
				if it.RunID == id && !it.DueAt.After(now) {
					called = true
					if err := fn(it, tx); err != nil {
						return err
					}
				}
			}
			return errAbandoned // nothing of it is written
		})
		if err != nil && !errors.Is(err, errAbandoned) {
			return 0, nil, err
		}
	}
	if called {
		if err := fn(nil, nil); err != nil {
			return 0, nil, err
		}
	}
	return s.Store.FireTimers(ctx, runIDs, read, now, lease, fn)
}

// TestHandoffAfterAWakeUpDecidedTwice: a wake-up decided twice lends the
// task it starts to a waiting claim in each decision; the claim, room for
// one task, gets the one the last decision committed.
func TestHandoffAfterAWakeUpDecidedTwice(t *testing.T) {
	forEachStore(t, func(t *testing.T, base *env) {
		e := newEnv(t, twiceStore{base.st})
		ctx := t.Context()
		startRuntime(t, e.rt)
		e.workflow(t, `{"name": "twice-nap", "tasks": {
			"nap": {"sleep": "1s"},
			"b": {"needs": ["nap"], "task": {"type": "twice.b.v1"}}}}`)
		r := e.trigger(t, "twice-nap", `{}`)
		done := e.waitingClaimOf(t, ctx, 7*time.Second, 1, "twice.b.v1")
		wake := e.clk.Now().Add(time.Second)
		testwait.Until(t, 10*time.Second, "the timer loop waiting for the wake-up", func() bool { return e.clk.HasTimerBy(wake) })
		e.clk.Advance(time.Second)
		got := recvClaim(t, done)
		if got.err != nil || len(got.ts) != 1 || got.ts[0].RunID != r.ID {
			t.Fatalf("claim = %+v, %v; want the wake-up's task", got.ts, got.err)
		}
		wantHandedOver(t, e, got.ts[0], "b")
	})
}

// TestHandoffAfterADecisionAbandoned: a completion decided twice lends the
// task it starts to a waiting claim in each decision; the claim, room for
// one task, gets the one the last decision committed, handed over in that
// commit.
func TestHandoffAfterADecisionAbandoned(t *testing.T) {
	forEachStore(t, func(t *testing.T, base *env) {
		e := newEnv(t, twiceStore{base.st})
		ctx := t.Context()
		e.workflow(t, `{"name": "twice", "tasks": {
			"a": {"task": {"type": "twice.a.v1"}},
			"b": {"needs": ["a"], "task": {"type": "twice.b.v1"}}}}`)
		r := e.trigger(t, "twice", `{}`)
		a := e.claimOne(t, "twice.a.v1")
		done := e.waitingClaimOf(t, ctx, 7*time.Second, 1, "twice.b.v1")
		_, err := e.rt.CompleteTask(ctx, a.ID, a.LeaseToken, json.RawMessage(`{}`))
		must(t, err, "CompleteTask a")
		got := recvClaim(t, done)
		if got.err != nil || len(got.ts) != 1 || got.ts[0].RunID != r.ID {
			t.Fatalf("claim = %+v, %v; want the completion's next task", got.ts, got.err)
		}
		wantHandedOver(t, e, got.ts[0], "b")
		if n := e.rt.WaitingClaims(); n != 0 {
			t.Errorf("%d claims still waiting", n)
		}
	})
}

// TestWaitingClaimWatchesLeasesHandedOutAfter: a claim waiting on this
// node wakes when the lease of a task handed out after it began waiting
// ends, and takes the task over if its worker never reported. It had set
// its wait from the leases out when it began, and slept on to the end of
// its wait (50 s here, against a 10 s lease).
func TestWaitingClaimWatchesLeasesHandedOutAfter(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		e.workflow(t, `{"name": "lw", "tasks": {
			"a": {"task": {"type": "lw.a.v1"}},
			"b": {"needs": ["a"], "task": {"type": "lw.b.v1"}}}}`)
		e.trigger(t, "lw", `{}`)
		a := e.claimOne(t, "lw.a.v1")
		done := e.waitingClaimOf(t, ctx, 50*time.Second, 1, "lw.b.v1")
		if d := e.clk.waitTimer(t); d != 50*time.Second {
			t.Fatalf("the claim waits %v, want 50s", d)
		}
		// The completing worker takes b with its completion (eager
		// dispatch), for 10 s, and then dies.
		_, got, err := e.rt.CompleteTaskAndClaim(ctx, a.ID, a.LeaseToken, nil, runtime.ClaimRequest{Types: []string{"lw.b.v1"}, WorkerID: "dies", Lease: 10 * time.Second, Max: 1})
		must(t, err, "CompleteTaskAndClaim")
		if len(got) != 1 {
			t.Fatalf("the completing worker took %d tasks, want b", len(got))
		}
		if d := e.clk.waitTimer(t); d != 10*time.Second {
			t.Fatalf("the waiting claim now waits %v, want the 10s to b's lease end", d)
		}
		e.clk.Advance(10 * time.Second)
		r := recvClaim(t, done)
		if r.err != nil || len(r.ts) != 1 || r.ts[0].ID != got[0].ID || r.ts[0].Attempt != 2 {
			t.Fatalf("the waiting claim got %d tasks, %v; want b taken over at attempt 2", len(r.ts), r.err)
		}
	})
}
