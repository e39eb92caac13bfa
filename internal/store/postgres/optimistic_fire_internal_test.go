package postgres

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// cachedRun creates a run of wf with these steps and queue items, and
// writes it once more (an event of type ev) so that s holds it in its
// version cache.
func cachedRun(t *testing.T, s *Store, wf *store.Workflow, now, expires time.Time, ev string, steps []*store.StepRun, queue ...store.QueueItem) *store.Run {
	t.Helper()
	ctx := t.Context()
	run, _, err := s.CreateRun(ctx, &store.NewRun{
		Run:   store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: expires, StartedAt: now.Add(-time.Minute)},
		Steps: steps, Queue: queue,
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.InRun(ctx, run.ID, now, func(tx store.RunTx) error {
		return tx.Append(store.NewEvent{Type: ev})
	}); err != nil {
		t.Fatal(err)
	}
	return run
}

// sleepingRun opens a store on dsn (migrating it) with a run whose step
// nap sleeps until now, its wake-up queued, written once more so that the
// store holds it in its version cache; read is the store's DueTimers read
// at now.
func sleepingRun(t *testing.T, dsn string) (s *Store, run *store.Run, read []*store.QueueItem, now time.Time) {
	t.Helper()
	ctx := t.Context()
	s, wf := withWorkflow(t, dsn, "nap")
	now = time.Now().UTC().Truncate(time.Microsecond)
	run = cachedRun(t, s, wf, now, now.Add(time.Hour), "step_started",
		[]*store.StepRun{{Name: "nap", Type: "sleep", Status: status.StepSleeping}},
		store.QueueItem{Kind: store.KindWake, Step: "nap", DueAt: now})
	var err error
	if read, err = s.DueTimers(ctx, now, now, 10); err != nil || len(read) != 1 {
		t.Fatalf("DueTimers = %d items, %v; want the wake-up", len(read), err)
	}
	return s, run, read, now
}

// wake is a fire's work on a wake-up: the step succeeds, with its event;
// with finish the run completes as well (and its queue is dropped, as the
// runtime does). calls counts the items decided and drops counts fn(nil,
// nil).
func wake(finish bool, calls, drops *int) func(*store.QueueItem, store.RunTx) error {
	return func(it *store.QueueItem, tx store.RunTx) error {
		if it == nil {
			*drops++
			return nil
		}
		*calls++
		st := tx.Step(it.Step)
		st.Status = status.StepSuccess
		if err := tx.UpdateStep(st); err != nil {
			return err
		}
		if err := tx.Append(store.NewEvent{Type: "step_succeeded", Step: it.Step}); err != nil {
			return err
		}
		if !finish {
			return nil
		}
		r := *tx.Run()
		r.Status = status.RunCompleted
		if err := tx.UpdateRun(&r); err != nil {
			return err
		}
		return tx.DropQueue()
	}
}

// TestOptimisticFireOneRoundTrip: a fire transaction given the timer
// loop's read of a run this store holds at its current version is decided
// without reading or locking anything and written in one round trip
// (BEGIN, the plan settings, the guarded write that also deletes the
// fired item, COMMIT); a fire that ends its run, and drops its queue in
// the same statement, is written so too.
func TestOptimisticFireOneRoundTrip(t *testing.T) {
	for _, finish := range []bool{false, true} {
		s, run, read, now := sleepingRun(t, pgtest.DSN(t))
		before := counts(s)
		ctx, recorded := spied(t.Context())
		var calls, drops int
		n, errs, err := s.FireTimers(ctx, []string{run.ID}, read, now, time.Minute, wake(finish, &calls, &drops))
		if err != nil || len(errs) > 0 || n != 1 {
			t.Fatalf("FireTimers = %d, %v, %v; want the one item fired", n, errs, err)
		}
		pipes := recorded()
		if len(pipes) != 1 {
			t.Fatalf("finish=%v: the fire sent %d pipelines, want one: %q", finish, len(pipes), pipes)
		}
		p := pipes[0]
		if len(p) != 4 || p[0] != "BEGIN" || p[1] != genericPlans || !strings.HasPrefix(p[2], "WITH ") ||
			!strings.Contains(p[2], "xmin") || !strings.Contains(p[2], "DELETE FROM queue WHERE id") || p[3] != "COMMIT" {
			t.Fatalf("finish=%v: pipeline = %q; want BEGIN, the plan settings, one guarded write and COMMIT", finish, p)
		}
		if got := counts(s); got.written != before.written+1 || got.stale != before.stale {
			t.Errorf("finish=%v: optimistic batches %+v after %+v, want one more written", finish, got, before)
		}
		if calls != 1 || drops != 0 {
			t.Errorf("finish=%v: the item was decided %d times with %d drops, want once", finish, calls, drops)
		}
		wantSteps(t, s, run.ID, map[string]string{"nap": status.StepSuccess})
		if r, _, err := s.GetRun(t.Context(), run.ID); err != nil || (finish != (r.Status == status.RunCompleted)) {
			t.Errorf("finish=%v: run = %+v, %v", finish, r, err)
		}
		if due, err := s.DueTimers(t.Context(), now, now, 10); err != nil || len(due) != 0 {
			t.Errorf("finish=%v: due after the fire: %d items, %v; want none", finish, len(due), err)
		}
	}
}

// TestOptimisticFireItemHeldElsewhere: the item the read listed is held
// for its lease by another node's failed fire since, which wrote nothing
// of the run: the run's version alone cannot tell, the guarded delete of
// the item does. The fire is decided again under locks, where the item is
// not due, and fn is told to drop its first decision.
func TestOptimisticFireItemHeldElsewhere(t *testing.T) {
	dsn := pgtest.DSN(t)
	a, run, read, now := sleepingRun(t, oneWriter(t, dsn))
	b := openNode(t, dsn)
	_, errs, err := b.FireTimers(t.Context(), []string{run.ID}, nil, now, time.Minute, func(*store.QueueItem, store.RunTx) error {
		return errStaleToken // any failure: the item is held
	})
	if err != nil || len(errs) != 1 {
		t.Fatalf("the other node's fire: %v, %v; want its item failed", errs, err)
	}
	before, sessions := counts(a), backends(t, a)
	var calls, drops int
	n, errs, err := a.FireTimers(t.Context(), []string{run.ID}, read, now, time.Minute, wake(false, &calls, &drops))
	if err != nil || len(errs) > 0 || n != 0 {
		t.Fatalf("FireTimers = %d, %v, %v; want nothing fired", n, errs, err)
	}
	if got := counts(a); got.stale != before.stale+1 || got.written != before.written {
		t.Errorf("optimistic batches %+v after %+v, want one more found stale", got, before)
	}
	if calls != 1 || drops != 1 {
		t.Errorf("decided %d items with %d drops, want 1 and 1 (the cached decision, dropped)", calls, drops)
	}
	if got := backends(t, a); !slices.Equal(got, sessions) {
		t.Errorf("the store's sessions went from %v to %v: a connection was dropped", sessions, got)
	}
	wantSteps(t, a, run.ID, map[string]string{"nap": status.StepSleeping})
}

// TestOptimisticFireRunWrittenElsewhere: another node wrote the run after
// this store cached it; the fire is decided again under locks and both
// writes are kept, in order.
func TestOptimisticFireRunWrittenElsewhere(t *testing.T) {
	dsn := pgtest.DSN(t)
	a, run, read, now := sleepingRun(t, oneWriter(t, dsn))
	b := openNode(t, dsn)
	if err := b.InRun(t.Context(), run.ID, now, func(tx store.RunTx) error {
		return tx.Append(store.NewEvent{Type: "noted elsewhere"})
	}); err != nil {
		t.Fatal(err)
	}
	before := counts(a)
	var calls, drops int
	n, errs, err := a.FireTimers(t.Context(), []string{run.ID}, read, now, time.Minute, wake(false, &calls, &drops))
	if err != nil || len(errs) > 0 || n != 1 {
		t.Fatalf("FireTimers = %d, %v, %v; want the item fired", n, errs, err)
	}
	if got := counts(a); got.stale != before.stale+1 {
		t.Errorf("optimistic batches %+v after %+v, want one more found stale", got, before)
	}
	if calls != 2 || drops != 1 {
		t.Errorf("decided %d items with %d drops, want 2 and 1", calls, drops)
	}
	evs, err := a.ListEvents(t.Context(), run.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
	}
	if strings.Join(types, ",") != "step_started,noted elsewhere,step_succeeded" {
		t.Errorf("run events %q, want both nodes' in order", types)
	}
	wantSteps(t, a, run.ID, map[string]string{"nap": status.StepSuccess})
}

// TestOptimisticFireExpiryInTheRead: a run's expiry the read lists is
// applied in the one round trip, dropping the run's queue; one the read
// did not reach is left for a later call (the run's timers it did not
// reach may be due first).
func TestOptimisticFireExpiryInTheRead(t *testing.T) {
	ctx := t.Context()
	s, wf := withWorkflow(t, pgtest.DSN(t), "exp")
	now := time.Now().UTC().Truncate(time.Microsecond)
	run := cachedRun(t, s, wf, now, now.Add(-time.Second), "cached",
		[]*store.StepRun{{Name: "nap", Type: "sleep", Status: status.StepSleeping}},
		store.QueueItem{Kind: store.KindWake, Step: "nap", DueAt: now.Add(-2 * time.Second)})
	var kinds []string
	expire := func(it *store.QueueItem, tx store.RunTx) error {
		if it == nil {
			kinds = nil
			return nil
		}
		kinds = append(kinds, it.Kind)
		if it.Kind != store.KindRunExpire {
			return wake(false, new(int), new(int))(it, tx)
		}
		r := *tx.Run()
		r.Status, r.FinishedAt = status.RunTimeout, &now
		if err := tx.UpdateRun(&r); err != nil {
			return err
		}
		return tx.DropQueue()
	}
	// The read reaches the wake-up only: the expiry waits.
	read, err := s.DueTimers(ctx, now, now, 1)
	if err != nil || len(read) != 1 || read[0].Kind != store.KindWake {
		t.Fatalf("DueTimers = %+v, %v; want the wake-up alone", read, err)
	}
	before := counts(s)
	if _, _, err := s.FireTimers(ctx, []string{run.ID}, read, now, time.Minute, expire); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(kinds, []string{store.KindWake}) {
		t.Errorf("a read of the wake-up alone applied %v, want the wake-up alone", kinds)
	}
	if got := counts(s); got.written != before.written+1 {
		t.Errorf("optimistic batches %+v after %+v, want one more written", got, before)
	}
	// Now the read lists the expiry: one round trip.
	read, err = s.DueTimers(ctx, now, now, 10)
	if err != nil || len(read) != 1 || read[0].Kind != store.KindRunExpire {
		t.Fatalf("DueTimers = %+v, %v; want the expiry", read, err)
	}
	kinds, before = nil, counts(s)
	sctx, recorded := spied(ctx)
	if _, _, err := s.FireTimers(sctx, []string{run.ID}, read, now, time.Minute, expire); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(kinds, []string{store.KindRunExpire}) {
		t.Errorf("applied %v, want the expiry", kinds)
	}
	if got := counts(s); got.written != before.written+1 || len(recorded()) != 1 {
		t.Errorf("optimistic batches %+v after %+v, %d pipelines; want one more written, in one", got, before, len(recorded()))
	}
	if r, _, err := s.GetRun(ctx, run.ID); err != nil || r.Status != status.RunTimeout {
		t.Errorf("run = %+v, %v; want timed out", r, err)
	}
}

// TestOptimisticFireWithATimerThatChangesNothing: a fire whose timer of
// one run changes nothing (its step moved on: a webhook's timeout after
// the callback) is still written in the one round trip with the other
// runs', that run's row written as it stands, and both timers are gone.
func TestOptimisticFireWithATimerThatChangesNothing(t *testing.T) {
	ctx := t.Context()
	s, a, _, now := sleepingRun(t, pgtest.DSN(t))
	wf, err := s.GetWorkflow(ctx, "nap")
	if err != nil {
		t.Fatal(err)
	}
	b := cachedRun(t, s, wf, now, now.Add(time.Hour), "cached",
		[]*store.StepRun{{Name: "nap", Type: "sleep", Status: status.StepSuccess}},
		store.QueueItem{Kind: store.KindWake, Step: "nap", DueAt: now})
	read, err := s.DueTimers(ctx, now, now, 10)
	if err != nil || len(read) != 2 {
		t.Fatalf("DueTimers = %d items, %v; want both wake-ups", len(read), err)
	}
	var calls, drops int
	w := wake(false, &calls, &drops)
	before := counts(s)
	sctx, recorded := spied(ctx)
	n, errs, err := s.FireTimers(sctx, []string{a.ID, b.ID}, read, now, time.Minute, func(it *store.QueueItem, tx store.RunTx) error {
		if it != nil && it.RunID == b.ID {
			return nil // its step is no longer asleep
		}
		return w(it, tx)
	})
	if err != nil || len(errs) > 0 || n != 2 {
		t.Fatalf("FireTimers = %d, %v, %v; want both items taken", n, errs, err)
	}
	if got := counts(s); got.written != before.written+1 || got.redecided != before.redecided || len(recorded()) != 1 {
		t.Errorf("optimistic batches %+v after %+v in %d pipelines; want one more written, in one", got, before, len(recorded()))
	}
	wantSteps(t, s, a.ID, map[string]string{"nap": status.StepSuccess})
	wantSteps(t, s, b.ID, map[string]string{"nap": status.StepSuccess})
	if due, err := s.DueTimers(ctx, now, now, 10); err != nil || len(due) != 0 {
		t.Errorf("due after the fire: %d items, %v; want none", len(due), err)
	}
	evs, err := s.ListEvents(ctx, b.ID, 0, 0)
	if err != nil || len(evs) != 1 {
		t.Errorf("run b's events %v, %v; want only its own", evs, err)
	}
}
