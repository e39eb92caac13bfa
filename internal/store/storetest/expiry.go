package storetest

import (
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

var expiryTests = []test{
	{"RunExpiresAtExpiresAt", testRunExpiry},
	{"ExpiryNotQueued", testExpiryNotQueued},
	{"FailedExpiryFailsTheCall", testExpiryFailure},
	{"LegacyExpiryRowsDropped", testLegacyExpiryRows},
	{"ExpiryAfterTheRunFinishedInTheSameCall", testExpiryAfterFinish},
	{"ConcurrentExpiriesExactlyOnce", testExpiryConcurrent},
	{"DueTimersSkipsRuns", testDueTimersSkip},
}

// testExpiryAfterFinish: a run whose wake-up, applied first in a call,
// finishes it is not expired by the same call; when the expiry comes
// first, the wake-up after it still sees the run (and finds it over).
func testExpiryAfterFinish(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	mk := func(wake time.Duration) *store.Run {
		r := baseRun(wf, "")
		r.ExpiresAt = at(2 * time.Second)
		return mkRun(t, s, &store.NewRun{Run: r, Steps: []*store.StepRun{{Name: "b", Position: 0, Type: "sleep", Status: status.StepSleeping}},
			Queue: []store.QueueItem{{Kind: store.KindWake, Step: "b", DueAt: at(wake)}}})
	}
	wakeFirst, expiryFirst := mk(time.Second), mk(3*time.Second)
	var fired []string
	n, errs, err := s.FireTimers(ctx, []string{wakeFirst.ID, expiryFirst.ID}, nil, at(5*time.Second), time.Minute, func(it *store.QueueItem, tx store.RunTx) error {
		fired = append(fired, it.RunID+" "+it.Kind)
		if status.RunTerminal(tx.Run().Status) {
			return nil
		}
		if it.Kind == store.KindRunExpire {
			return timeout(tx, at(5*time.Second))
		}
		u := *tx.Run()
		u.Status, u.FinishedAt = status.RunCompleted, ptr(at(5*time.Second))
		return tx.UpdateRun(&u)
	})
	must(t, err, "FireTimers")
	want := []string{wakeFirst.ID + " " + store.KindWake, expiryFirst.ID + " " + store.KindRunExpire, expiryFirst.ID + " " + store.KindWake}
	sort.Strings(fired)
	sort.Strings(want)
	diff(t, "fn calls", want, fired)
	if n != 3 || len(errs) != 0 {
		t.Errorf("FireTimers took %d items with errors %v, want 3 and none", n, errs)
	}
	for id, st := range map[string]string{wakeFirst.ID: status.RunCompleted, expiryFirst.ID: status.RunTimeout} {
		if r, _ := getRun(t, s, id); r.Status != st {
			t.Errorf("run %s = %s, want %s", id, r.Status, st)
		}
	}
}

// testExpiryConcurrent: four callers fire the same 40 expired runs in
// overlapping calls; each expiry is applied exactly once.
func testExpiryConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	var ids []string
	for i := range 40 {
		ids = append(ids, expiringRun(t, s, wf, status.RunRunning, at(time.Duration(i)*time.Millisecond)).ID)
	}
	count := fireConcurrently(t, s, ids, len(ids), at(time.Second), func(_ *store.QueueItem, tx store.RunTx) error {
		return timeout(tx, at(time.Second))
	})
	for _, id := range ids {
		if count[id] != 1 {
			t.Errorf("run %s expired %d times, want 1", id, count[id])
		}
	}
	if due, err := s.DueTimers(ctx, at(time.Second), at(time.Second), 100); err != nil || len(due) != 0 {
		t.Errorf("due after the calls: %d, %v; want none", len(due), err)
	}
}

// testDueTimersSkip: the runs a caller names are left out of the read,
// their queued timers and their expiries alike.
func testDueTimersSkip(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	sleeper := mkSimpleRun(t, s, wf, store.QueueItem{Kind: store.KindWake, Step: "b", DueAt: at(time.Second)})
	waiter := mkSimpleRun(t, s, wf, store.QueueItem{Kind: store.KindWaitTimeout, Step: "b", DueAt: at(2 * time.Second)})
	expired := expiringRun(t, s, wf, status.RunRunning, at(3*time.Second))
	other := expiringRun(t, s, wf, status.RunPaused, at(4*time.Second))
	due, err := s.DueTimers(ctx, at(5*time.Second), at(5*time.Second), 10, sleeper.ID, expired.ID)
	must(t, err, "DueTimers")
	var got []string
	for _, it := range due {
		got = append(got, it.RunID)
	}
	diff(t, "runs due, two skipped", []string{waiter.ID, other.ID}, got)
}

// expiringRun creates a run of wf in st that expires at exp.
func expiringRun(t *testing.T, s store.Store, wf *store.Workflow, st string, exp time.Time) *store.Run {
	t.Helper()
	r := baseRun(wf, "")
	r.Status, r.ExpiresAt = st, exp
	if status.RunTerminal(st) {
		r.FinishedAt = ptr(t0)
	}
	return mkRun(t, s, &store.NewRun{Run: r, Steps: []*store.StepRun{{Name: "a", Position: 0, Type: "sleep", Status: status.StepPending}}})
}

// timeout ends the run of tx as an expiry does.
func timeout(tx store.RunTx, now time.Time) error {
	u := *tx.Run()
	u.Status, u.FinishedAt = status.RunTimeout, &now
	return tx.UpdateRun(&u)
}

// testRunExpiry: a run not finished is due to expire at its ExpiresAt
// (running or paused), without a queue row; DueTimers, NextDue and
// FireTimers report it as a run_expire item with ID 0, and a run that
// finished is never due.
func testRunExpiry(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	a := expiringRun(t, s, wf, status.RunRunning, at(10*time.Second))
	b := expiringRun(t, s, wf, status.RunPaused, at(5*time.Second))
	c := expiringRun(t, s, wf, status.RunCompleted, at(time.Second))
	d := expiringRun(t, s, wf, status.RunRunning, at(time.Hour))

	next := func(what string, after, want time.Time) {
		t.Helper()
		got, ok, err := s.NextDue(ctx, after, store.KindRunExpire)
		must(t, err, "NextDue")
		if !ok || !got.Equal(want) {
			t.Errorf("NextDue of expiries %s = %v, %v; want %v", what, got, ok, want)
		}
	}
	next("from the start", time.Time{}, at(5*time.Second))
	next("after 5s", at(5*time.Second), at(10*time.Second))
	if got, ok, err := s.NextDue(ctx, time.Time{}); err != nil || ok {
		t.Errorf("NextDue of the queue's kinds = %v, %v, %v; want nothing (an expiry is no queue row)", got, ok, err)
	}

	due, err := s.DueTimers(ctx, at(20*time.Second), at(20*time.Second), 10)
	must(t, err, "DueTimers")
	want := []*store.QueueItem{
		{Kind: store.KindRunExpire, RunID: b.ID, DueAt: at(5 * time.Second)},
		{Kind: store.KindRunExpire, RunID: a.ID, DueAt: at(10 * time.Second)},
	}
	diff(t, "due expiries", want, due)

	var fired []*store.QueueItem
	n, errs, err := s.FireTimers(ctx, []string{a.ID, b.ID, c.ID, d.ID}, nil, at(20*time.Second), time.Minute, func(it *store.QueueItem, tx store.RunTx) error {
		fired = append(fired, it)
		return timeout(tx, at(20*time.Second))
	})
	must(t, err, "FireTimers")
	if n != 2 || len(errs) != 0 {
		t.Errorf("FireTimers took %d items with errors %v, want 2 and none", n, errs)
	}
	sort.Slice(fired, func(i, j int) bool { return fired[i].DueAt.Before(fired[j].DueAt) })
	diff(t, "fired expiries", want, fired)
	for _, id := range []string{a.ID, b.ID} {
		if r, _ := getRun(t, s, id); r.Status != status.RunTimeout {
			t.Errorf("run %s = %s after its expiry, want timeout", id, r.Status)
		}
	}
	if due, err := s.DueTimers(ctx, at(20*time.Second), at(20*time.Second), 10); err != nil || len(due) != 0 {
		t.Errorf("DueTimers after the expiries = %+v, %v; want none", due, err)
	}
	next("once both ended", time.Time{}, at(time.Hour))
	if left := claimAll(t, s, far); len(left) != 0 {
		t.Errorf("queue rows: %v, want none (expiries are read from the runs)", keysOf(left))
	}
}

// testExpiryNotQueued: a run_expire queue item is refused, at creation and
// in a run's transaction, and nothing of the write is kept.
func testExpiryNotQueued(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	nr := &store.NewRun{Run: baseRun(wf, ""), Queue: []store.QueueItem{{Kind: store.KindRunExpire, DueAt: at(time.Hour)}}}
	_, _, err := s.CreateRun(ctx, nr, t0)
	wantErr(t, err, store.ErrExpiryNotQueued, "CreateRun with a run_expire item")
	if runs, _, err := s.ListRuns(ctx, wf.ID, store.Page{}); err != nil || len(runs) != 0 {
		t.Errorf("runs after the refused create: %d, %v; want none", len(runs), err)
	}
	r := mkSimpleRun(t, s, wf)
	err = s.InRun(ctx, r.ID, t0, func(tx store.RunTx) error {
		if err := tx.Enqueue(store.QueueItem{Kind: store.KindWake, Step: "b", DueAt: at(time.Minute)}); err != nil {
			return err
		}
		return tx.Enqueue(store.QueueItem{Kind: store.KindRunExpire, DueAt: at(time.Hour)})
	})
	wantErr(t, err, store.ErrExpiryNotQueued, "Enqueue of a run_expire item")
	if left := claimAll(t, s, far); len(left) != 0 {
		t.Errorf("queue rows after the refused transaction: %v, want none", keysOf(left))
	}
}

// testExpiryFailure: an expiry has no row to hold for a lease, so one
// that fails fails the whole call: nothing of it commits, the other runs'
// timers included, and every timer is due again.
func testExpiryFailure(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	exp := expiringRun(t, s, wf, status.RunRunning, at(2*time.Second))
	sleeper := mkSimpleRun(t, s, wf, store.QueueItem{Kind: store.KindWake, Step: "b", DueAt: at(time.Second)})
	boom := errors.New("boom")
	_, _, err := s.FireTimers(ctx, []string{exp.ID, sleeper.ID}, nil, at(5*time.Second), time.Minute, func(it *store.QueueItem, tx store.RunTx) error {
		if it.Kind == store.KindRunExpire {
			return boom
		}
		st := tx.Step("b")
		st.Status = status.StepSuccess
		return tx.UpdateStep(st)
	})
	wantErr(t, err, boom, "FireTimers with a failing expiry")
	if _, steps := getRun(t, s, sleeper.ID); stepNamed(t, steps, "b").Status != status.StepPending {
		t.Errorf("the other run's wake-up committed with the failed call")
	}
	due, err := s.DueTimers(ctx, at(5*time.Second), at(5*time.Second), 10)
	must(t, err, "DueTimers")
	var got []string
	for _, it := range due {
		got = append(got, it.Kind+" "+it.RunID)
	}
	diff(t, "due after the failed call", []string{store.KindWake + " " + sleeper.ID, store.KindRunExpire + " " + exp.ID}, got)
}

// testLegacyExpiryRows: a database from before expiries were read from the
// runs holds a run_expire queue row per run; migrating drops them, and
// each run still expires once, at its expires_at.
func testLegacyExpiryRows(t *testing.T, s store.Store) {
	ctx := t.Context()
	raw := rawDB(t, s)
	wf := mkWorkflow(t, s, "wf")
	r := expiringRun(t, s, wf, status.RunRunning, at(3*time.Second))
	for _, q := range []string{
		fmt.Sprintf(`INSERT INTO queue (kind, run_id, step, attempt, due_at) VALUES ('run_expire', '%s', '', 0, %d)`, r.ID, r.ExpiresAt.UnixMicro()),
		`DELETE FROM ferry_migrations WHERE version = 7`,
	} {
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	must(t, s.Migrate(ctx), "Migrate over the legacy row")
	if left := claimAll(t, s, far); len(left) != 0 {
		t.Errorf("queue rows after migrating: %v, want none", keysOf(left))
	}
	due, err := s.DueTimers(ctx, at(5*time.Second), at(5*time.Second), 10)
	must(t, err, "DueTimers")
	diff(t, "due after migrating", []*store.QueueItem{{Kind: store.KindRunExpire, RunID: r.ID, DueAt: at(3 * time.Second)}}, due)
	calls := 0
	n, _, err := s.FireTimers(ctx, []string{r.ID}, nil, at(5*time.Second), time.Minute, func(it *store.QueueItem, tx store.RunTx) error {
		calls++
		return timeout(tx, at(5*time.Second))
	})
	must(t, err, "FireTimers")
	if n != 1 || calls != 1 {
		t.Errorf("the migrated run expired %d times (%d taken), want once", calls, n)
	}
}
