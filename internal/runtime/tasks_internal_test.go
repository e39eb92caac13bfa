package runtime

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/sqlite"
)

func newInternal(t *testing.T) (*Runtime, store.Store, *clock.Fake) {
	t.Helper()
	s := openSQLite(t)
	r, clk := newOn(t, s)
	return r, s, clk
}

// openSQLite is a migrated store on a fresh file, closed after the test.
func openSQLite(t *testing.T) store.Store {
	t.Helper()
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// newOn is a runtime on s with a fake clock, closed after the test.
func newOn(t *testing.T, s store.Store) (*Runtime, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC))
	r := New(Config{Store: s, Clock: clk, HTTP: httpstep.New(nil), Logger: slog.New(slog.DiscardHandler), PublicURL: "http://ferry.test"})
	t.Cleanup(r.Close)
	return r, clk
}

func claimOne(t *testing.T, r *Runtime, lease time.Duration) *store.Task {
	t.Helper()
	got, err := r.ClaimTasks(t.Context(), ClaimRequest{Types: []string{"t.%"}, WorkerID: "w", Lease: lease, Max: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %v (%d tasks)", err, len(got))
	}
	return got[0]
}

func eventTypes(t *testing.T, s store.Store, id string) []string {
	t.Helper()
	evs, err := s.ListEvents(t.Context(), id, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// TestSweepFailsTaskWhoseFinalLeaseExpired: with no worker left to reclaim
// it, a task whose last attempt's lease ran out is failed by the sweep, so
// its step does not stay running forever. A task with attempts left is not.
func TestSweepFailsTaskWhoseFinalLeaseExpired(t *testing.T) {
	r, s, clk := newInternal(t)
	last, _, err := r.CreateTask(t.Context(), NewTask{Type: "t.last.v1", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	claimOne(t, r, time.Minute)
	spare, _, err := r.CreateTask(t.Context(), NewTask{Type: "t.spare.v1", MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	claimOne(t, r, time.Minute)

	clk.Advance(59 * time.Second)
	r.failExhaustedLeases(t.Context())
	if got, _ := s.GetTask(t.Context(), last.ID); got.Status != status.TaskLeased {
		t.Fatalf("failed before its lease ended: %s", got.Status)
	}
	clk.Advance(2 * time.Second)
	r.failExhaustedLeases(t.Context())
	got, _ := s.GetTask(t.Context(), last.ID)
	if got.Status != status.TaskFailed || got.Attempt != 1 {
		t.Errorf("exhausted task: status %s attempt %d, want failed at 1", got.Status, got.Attempt)
	}
	if ev := eventTypes(t, s, last.ID); ev[len(ev)-2] != "lease_expired" || ev[len(ev)-1] != "failed" {
		t.Errorf("events %v: want ... lease_expired, failed", ev)
	}
	if got, _ := s.GetTask(t.Context(), spare.ID); got.Status != status.TaskLeased {
		t.Errorf("a task with attempts left was touched: %s", got.Status)
	}
}

// TestReleaseTasksUndoesUndeliveredClaim: a claim whose worker hung up is
// handed back: pending, attempt not counted, claimable again.
func TestReleaseTasksUndoesUndeliveredClaim(t *testing.T) {
	r, s, _ := newInternal(t)
	k, _, err := r.CreateTask(t.Context(), NewTask{Type: "t.rel.v1"})
	if err != nil {
		t.Fatal(err)
	}
	c := claimOne(t, r, time.Minute)
	r.ReleaseTasks(t.Context(), []*store.Task{c})
	got, _ := s.GetTask(t.Context(), k.ID)
	if got.Status != status.TaskPending || got.Attempt != 0 || got.LeaseToken != "" {
		t.Fatalf("after release: status %s attempt %d token %q", got.Status, got.Attempt, got.LeaseToken)
	}
	if ev := eventTypes(t, s, k.ID); ev[len(ev)-1] != "released" {
		t.Errorf("events %v: want a released event last", ev)
	}
	again := claimOne(t, r, time.Minute)
	if again.ID != k.ID || again.Attempt != 1 {
		t.Errorf("reclaimed %s at attempt %d", again.ID, again.Attempt)
	}
	// A stale release (the task was claimed again) changes nothing.
	r.ReleaseTasks(t.Context(), []*store.Task{c})
	if got, _ := s.GetTask(t.Context(), k.ID); got.Status != status.TaskLeased || got.LeaseToken != again.LeaseToken {
		t.Errorf("stale release touched the new lease: %s %q", got.Status, got.LeaseToken)
	}
}

// TestDrainEndsWaitingClaims: a long-poll returns empty at once when the
// server starts shutting down.
func TestDrainEndsWaitingClaims(t *testing.T) {
	r, _, _ := newInternal(t)
	done := make(chan error, 1)
	go func() {
		got, err := r.ClaimTasks(t.Context(), ClaimRequest{Types: []string{"t.%"}, WorkerID: "w", Max: 1, Wait: 60 * time.Second})
		if err == nil && len(got) != 0 {
			err = errUnexpected
		}
		done <- err
	}()
	r.Drain()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("claim still waiting after Drain")
	}
}

var errUnexpected = errorString("claim returned tasks")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestCloseAnswersQueuedReports: a report submitted before Close is
// answered (written, or refused as closed), never left waiting; one after
// Close is refused at once.
func TestCloseAnswersQueuedReports(t *testing.T) {
	r, _, _ := newInternal(t)
	k, _, err := r.CreateTask(t.Context(), NewTask{Type: "t.close.v1"})
	if err != nil {
		t.Fatal(err)
	}
	c := claimOne(t, r, time.Minute)
	if c.ID != k.ID {
		t.Fatalf("claimed %s, want %s", c.ID, k.ID)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.CompleteTask(context.Background(), c.ID, c.LeaseToken, nil)
		done <- err
	}()
	r.Close()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, errClosed) {
			t.Errorf("report racing Close: %v, want success or errClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a report submitted around Close was never answered")
	}
	if _, err := r.CompleteTask(t.Context(), c.ID, c.LeaseToken, nil); !errors.Is(err, errClosed) {
		t.Errorf("report after Close: %v, want errClosed", err)
	}
}

// TestReportsYieldToLateTimers: while late timers are being written a
// report batch waits (bounded by yieldBound), so wake-ups are not queued
// behind the reports of the steps earlier wake-ups started; once the
// timers are written it goes through.
func TestReportsYieldToLateTimers(t *testing.T) {
	r, _, _ := newInternal(t)
	if _, _, err := r.CreateTask(t.Context(), NewTask{Type: "t.yield.v1"}); err != nil {
		t.Fatal(err)
	}
	c := claimOne(t, r, time.Minute)
	r.yield.hold() // a late chunk of timers is being written
	done := make(chan error, 1)
	go func() {
		_, err := r.CompleteTask(context.Background(), c.ID, c.LeaseToken, nil)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("report answered (%v) while late timers were being written", err)
	case <-time.After(50 * time.Millisecond): // negative check: give it a chance to go wrong
	}
	r.yield.release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("report after the timers: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("report not written after the late timers were")
	}
}

// TestYieldGate: trigger and report batches pass at once unless late
// timers are being written; then they wait for the timers, or at most the
// bound.
func TestYieldGate(t *testing.T) {
	var g yieldGate
	clk := clock.NewFake(time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC))
	g.wait(clk, time.Hour) // nothing begun: returns at once

	// Two holds (two late chunks in flight): closed until both release.
	g.hold()
	g.hold()
	passed := make(chan struct{})
	go func() { g.wait(clk, time.Hour); close(passed) }()
	select {
	case <-passed:
		t.Fatal("wait returned while late timers were being written")
	case <-time.After(50 * time.Millisecond): // negative check: give it a chance to go wrong
	}
	g.release()
	select {
	case <-passed:
		t.Fatal("wait returned while one late chunk was still being written")
	case <-time.After(50 * time.Millisecond): // negative check
	}
	g.release()
	select {
	case <-passed:
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not return after the last release")
	}

	g.hold()
	defer g.release()
	bounded := make(chan struct{})
	go func() { g.wait(clk, time.Second); close(bounded) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		clk.Advance(time.Second) // until the waiter's timer exists and fires
		select {
		case <-bounded:
			return
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("wait was not bounded by its limit")
		}
	}
}
