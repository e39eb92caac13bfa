package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/store/sqlite"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
	"github.com/ferryhq/ferry/internal/testwait"
)

// t0 has microsecond precision, the stores' resolution, so times read back
// equal times written.
var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 891011000, time.UTC)

// testClock is a fake clock that reports every timer the runtime starts, so
// a test knows when a long-poll claim is waiting without sleeping.
type testClock struct {
	*clock.Fake
	timers chan time.Duration
}

func (c *testClock) NewTimer(d time.Duration) clock.Timer {
	tm := c.Fake.NewTimer(d)
	select {
	case c.timers <- d:
	default:
	}
	return tm
}

// waitTimer waits (in real time, bounded) until the runtime starts a timer
// and returns its duration.
func (c *testClock) waitTimer(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.timers:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the runtime started no timer within 10s")
		return 0
	}
}

type env struct {
	rt  *runtime.Runtime
	st  store.Store
	clk *testClock
}

// forEachStore runs fn on a fresh SQLite store and, when the test server is
// reachable, a fresh Postgres schema.
func forEachStore(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		s := openSQLite(t)
		fn(t, newEnv(t, s))
		if err := s.VerifyRunCache(context.WithoutCancel(t.Context())); err != nil {
			t.Errorf("run cache differs from the tables: %v", err)
		}
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		dsn := pgtest.DSN(t) // skips when no server is reachable (fails under CI)
		s, err := postgres.Open(t.Context(), dsn)
		if err != nil {
			t.Fatalf("postgres.Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		fn(t, newEnv(t, s))
	})
}

// openSQLite opens a fresh SQLite store, closed when the test ends.
func openSQLite(t *testing.T) *sqlstore.Store {
	t.Helper()
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "ferry.db"))
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newEnv(t *testing.T, s store.Store) *env {
	t.Helper()
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	clk := &testClock{Fake: clock.NewFake(t0), timers: make(chan time.Duration, 64)}
	rt := runtime.New(runtime.Config{
		Store:     s,
		Clock:     clk,
		PublicURL: "http://ferry.test",
		HTTP:      httpstep.New(nil),
		Logger:    slog.New(slog.DiscardHandler),
	})
	t.Cleanup(rt.Close) // before the store's own cleanup, registered earlier
	return &env{rt: rt, st: s, clk: clk}
}

func (e *env) create(t *testing.T, nt runtime.NewTask) *store.Task {
	t.Helper()
	k, created, err := e.rt.CreateTask(t.Context(), nt)
	if err != nil {
		t.Fatalf("CreateTask %s: %v", nt.Type, err)
	}
	if !created {
		t.Fatalf("CreateTask %s: created=false", nt.Type)
	}
	return k
}

// claim claims without waiting.
func (e *env) claim(t *testing.T, types ...string) []*store.Task {
	t.Helper()
	got, err := e.rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: types, WorkerID: "worker-1", Lease: 30 * time.Second, Max: 10})
	if err != nil {
		t.Fatalf("ClaimTasks: %v", err)
	}
	return got
}

// claimOne claims and fails unless exactly one task comes back.
func (e *env) claimOne(t *testing.T, types ...string) *store.Task {
	t.Helper()
	got := e.claim(t, types...)
	if len(got) != 1 {
		t.Fatalf("claimed %d tasks, want 1", len(got))
	}
	return got[0]
}

func (e *env) get(t *testing.T, id string) *store.Task {
	t.Helper()
	k, err := e.st.GetTask(t.Context(), id)
	if err != nil {
		t.Fatalf("GetTask: %v", err)
	}
	return k
}

func (e *env) events(t *testing.T, id string) []*store.Event {
	t.Helper()
	evs, err := e.st.ListEvents(t.Context(), id, 0, 0)
	if err != nil {
		t.Fatalf("ListEvents: %v", err)
	}
	return evs
}

func types(evs []*store.Event) string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return strings.Join(out, ",")
}

func wantIs(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: error %v, want errors.Is(err, %v)", what, err, target)
	}
}

func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// jsonEq reports whether a and b hold the same JSON value.
func jsonEq(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("invalid JSON %q: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("invalid JSON %q: %v", b, err)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

func TestTaskBackoffFunction(t *testing.T) {
	zero := func() float64 { return 0 }
	one := func() float64 { return 1 }
	half := func() float64 { return 0.5 }
	for attempt, want := range map[int]time.Duration{1: time.Minute, 2: 4 * time.Minute, 3: 9 * time.Minute, 4: 16 * time.Minute} {
		if got := runtime.TaskBackoff(attempt, time.Minute, zero); got != want {
			t.Errorf("TaskBackoff(%d, 1m, 0) = %v, want %v", attempt, got, want)
		}
		if got := runtime.TaskBackoff(attempt, time.Minute, one); got != want+want/10 {
			t.Errorf("TaskBackoff(%d, 1m, 1) = %v, want %v (+10%%)", attempt, got, want+want/10)
		}
	}
	if got := runtime.TaskBackoff(3, time.Minute, half); got != 9*time.Minute+27*time.Second {
		t.Errorf("TaskBackoff(3, 1m, 0.5) = %v, want 9m27s", got)
	}
	if got := runtime.TaskBackoff(1000, time.Hour, zero); got != runtime.MaxTaskRetryDelay {
		t.Errorf("TaskBackoff(1000, 1h) = %v, want the cap %v", got, runtime.MaxTaskRetryDelay)
	}
	if got := runtime.TaskBackoff(1<<20, time.Hour, zero); got != runtime.MaxTaskRetryDelay {
		t.Errorf("TaskBackoff overflowing = %v, want the cap %v", got, runtime.MaxTaskRetryDelay)
	}
	// 9 × this base is 2^64 ns + ≈1 s: a product taken first wraps to a
	// second, under the cap.
	if got := runtime.TaskBackoff(3, 2049638230523283513, zero); got != runtime.MaxTaskRetryDelay {
		t.Errorf("TaskBackoff whose product wraps = %v, want the cap %v", got, runtime.MaxTaskRetryDelay)
	}
	if got := runtime.TaskBackoff(0, time.Minute, one); got != 0 {
		t.Errorf("TaskBackoff(0, 1m) = %v, want 0", got)
	}
}

// TestTaskBackoffSchedule fails a task retryably three times: each retry is
// due base×attempt² (+≤10%) later, not claimable a microsecond before and
// claimable at that time; the fourth (last) failure fails the task.
func TestTaskBackoffSchedule(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", MaxAttempts: 4, RetryDelay: time.Minute})
		for attempt := 1; attempt <= 3; attempt++ {
			c := e.claimOne(t, "billing.%")
			if c.ID != k.ID || c.Attempt != attempt {
				t.Fatalf("claimed %s attempt %d, want %s attempt %d", c.ID, c.Attempt, k.ID, attempt)
			}
			e.clk.Advance(7 * time.Second) // the worker works a while
			failedAt := e.clk.Now()
			got, err := e.rt.FailTask(ctx, k.ID, c.LeaseToken, "boom", true)
			must(t, err, "FailTask")
			base := time.Duration(attempt*attempt) * time.Minute
			lo, hi := failedAt.Add(base), failedAt.Add(base+base/10)
			if got.RunAt.Before(lo) || got.RunAt.After(hi) {
				t.Fatalf("attempt %d: run_at = now+%v, want within [%v, %v]", attempt, got.RunAt.Sub(failedAt), base, base+base/10)
			}
			// What FailTask returns is what was stored (the stores keep
			// microseconds).
			stored := e.get(t, k.ID)
			if stored.Status != status.TaskPending || stored.LastError != "boom" || stored.LeaseToken != "" || stored.LeaseUntil != nil || !stored.RunAt.Equal(got.RunAt) || stored.Attempt != attempt {
				t.Fatalf("attempt %d: stored task = %+v, want pending, last_error boom, no lease, run_at %v", attempt, stored, got.RunAt)
			}
			evs := e.events(t, k.ID)
			last := evs[len(evs)-1]
			var d map[string]any
			_ = json.Unmarshal(last.Data, &d)
			if last.Type != "retried" || d["attempt"] != float64(attempt) || d["error"] != "boom" {
				t.Errorf("attempt %d: last event %s %s, want retried with attempt and error", attempt, last.Type, last.Data)
			}

			if got := e.claim(t, "billing.%"); len(got) != 0 {
				t.Fatalf("attempt %d: claimable right after the failure", attempt)
			}
			e.clk.Advance(stored.RunAt.Sub(e.clk.Now()) - time.Microsecond)
			if got := e.claim(t, "billing.%"); len(got) != 0 {
				t.Fatalf("attempt %d: claimable 1µs before run_at", attempt)
			}
			e.clk.Advance(time.Microsecond)
			// Claimed at the top of the next iteration (or below).
		}
		c := e.claimOne(t, "billing.%")
		if c.Attempt != 4 {
			t.Fatalf("fourth claim attempt = %d, want 4", c.Attempt)
		}
		got, err := e.rt.FailTask(ctx, k.ID, c.LeaseToken, "still broken", true)
		must(t, err, "FailTask on the last attempt")
		if got.Status != status.TaskFailed || got.LastError != "still broken" || got.FinishedAt == nil || !got.FinishedAt.Equal(e.clk.Now()) {
			t.Fatalf("after the last attempt = %+v, want failed with last_error", got)
		}
		evs := e.events(t, k.ID)
		if want := "created,claimed,retried,claimed,retried,claimed,retried,claimed,failed"; types(evs) != want {
			t.Errorf("events = %s, want %s", types(evs), want)
		}
		for i, ev := range evs {
			if ev.Seq != int64(i+1) {
				t.Errorf("event %d (%s) seq %d, want %d", i, ev.Type, ev.Seq, i+1)
			}
		}
		e.clk.Advance(48 * time.Hour)
		if got := e.claim(t, "billing.%"); len(got) != 0 {
			t.Errorf("a failed task was claimed")
		}
	})
}

func TestTaskNonRetryableFailsAtOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1"}) // 5 attempts by default
		c := e.claimOne(t, "billing.%")
		got, err := e.rt.FailTask(t.Context(), k.ID, c.LeaseToken, "card declined", false)
		must(t, err, "FailTask")
		if got.Status != status.TaskFailed || got.Attempt != 1 || got.LastError != "card declined" {
			t.Fatalf("task = {Status:%s Attempt:%d LastError:%q}, want failed at attempt 1", got.Status, got.Attempt, got.LastError)
		}
		if s := types(e.events(t, k.ID)); s != "created,claimed,failed" {
			t.Errorf("events = %s", s)
		}
		e.clk.Advance(48 * time.Hour)
		if got := e.claim(t, "billing.%"); len(got) != 0 {
			t.Errorf("a non-retryably failed task was claimed again")
		}
		// An empty message gets a default.
		k2 := e.create(t, runtime.NewTask{Type: "billing.invoice.v1"})
		c2 := e.claimOne(t, "billing.%")
		got, err = e.rt.FailTask(t.Context(), k2.ID, c2.LeaseToken, "", false)
		must(t, err, "FailTask")
		if got.LastError == "" {
			t.Error("FailTask with no message left last_error empty")
		}
	})
}

func TestTaskDefaultsResolution(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		_, err := e.st.PutTaskType(ctx, &store.TaskType{Type: "reg.full.v1", Enabled: true, MaxAttempts: 7, RetryDelay: 30 * time.Second})
		must(t, err, "PutTaskType")
		_, err = e.st.PutTaskType(ctx, &store.TaskType{Type: "reg.empty.v1", Enabled: true})
		must(t, err, "PutTaskType")
		cases := []struct {
			name      string
			task      store.Task
			wantMax   int
			wantDelay time.Duration
		}{
			{"task's own over the registry", store.Task{Type: "reg.full.v1", MaxAttempts: 3, RetryDelay: 2 * time.Minute}, 3, 2 * time.Minute},
			{"registry when the task has none", store.Task{Type: "reg.full.v1"}, 7, 30 * time.Second},
			{"mixed: task's attempts, registry's delay", store.Task{Type: "reg.full.v1", MaxAttempts: 2}, 2, 30 * time.Second},
			{"mixed: registry's attempts, task's delay", store.Task{Type: "reg.full.v1", RetryDelay: 5 * time.Second}, 7, 5 * time.Second},
			{"registry entry without defaults", store.Task{Type: "reg.empty.v1"}, runtime.DefaultTaskMaxAttempts, runtime.DefaultTaskRetryDelay},
			{"no registry entry", store.Task{Type: "unregistered.x.v1"}, 5, time.Minute},
		}
		for _, tc := range cases {
			gotMax, gotDelay := e.rt.TaskDefaults(ctx, &tc.task)
			if gotMax != tc.wantMax || gotDelay != tc.wantDelay {
				t.Errorf("%s: TaskDefaults = (%d, %v), want (%d, %v)", tc.name, gotMax, gotDelay, tc.wantMax, tc.wantDelay)
			}
		}

		// The registry's policy drives FailTask.
		_, err = e.st.PutTaskType(ctx, &store.TaskType{Type: "reg.short.v1", Enabled: true, MaxAttempts: 2, RetryDelay: 10 * time.Second})
		must(t, err, "PutTaskType")
		k := e.create(t, runtime.NewTask{Type: "reg.short.v1"})
		c := e.claimOne(t, "reg.short.v1")
		now := e.clk.Now()
		got, err := e.rt.FailTask(ctx, k.ID, c.LeaseToken, "x", true)
		must(t, err, "FailTask 1")
		if got.Status != status.TaskPending || got.RunAt.Before(now.Add(10*time.Second)) || got.RunAt.After(now.Add(11*time.Second)) {
			t.Fatalf("after attempt 1: status %s run_at now+%v, want pending in [10s, 11s]", got.Status, got.RunAt.Sub(now))
		}
		e.clk.Advance(11 * time.Second)
		c = e.claimOne(t, "reg.short.v1")
		got, err = e.rt.FailTask(ctx, k.ID, c.LeaseToken, "x", true)
		must(t, err, "FailTask 2")
		if got.Status != status.TaskFailed {
			t.Fatalf("after attempt 2 of the registry's 2: status %s, want failed", got.Status)
		}
	})
}

// TestTaskStaleToken: after the lease expired and the task was reclaimed,
// the first worker's heartbeat, completion and failure are refused and
// change nothing.
func TestTaskStaleToken(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1"})
		first := e.claimOne(t, "billing.%")
		e.clk.Advance(30 * time.Second)
		second := e.claimOne(t, "billing.%")
		if second.LeaseToken == first.LeaseToken || second.Attempt != 2 {
			t.Fatalf("reclaim = token %q attempt %d, want a new token and attempt 2", second.LeaseToken, second.Attempt)
		}
		before := e.get(t, k.ID)
		evsBefore := types(e.events(t, k.ID))

		for _, tok := range []string{first.LeaseToken, "", "made-up"} {
			_, err := e.rt.Heartbeat(ctx, k.ID, tok, time.Minute)
			wantIs(t, err, runtime.ErrStaleLease, "Heartbeat with a stale token")
			_, err = e.rt.CompleteTask(ctx, k.ID, tok, json.RawMessage(`{"stale":true}`))
			wantIs(t, err, runtime.ErrStaleLease, "CompleteTask with a stale token")
			_, err = e.rt.FailTask(ctx, k.ID, tok, "stale", true)
			wantIs(t, err, runtime.ErrStaleLease, "FailTask with a stale token (retryable)")
			_, err = e.rt.FailTask(ctx, k.ID, tok, "stale", false)
			wantIs(t, err, runtime.ErrStaleLease, "FailTask with a stale token (final)")
		}
		after := e.get(t, k.ID)
		if after.Status != before.Status || after.LeaseToken != before.LeaseToken || !after.LeaseUntil.Equal(*before.LeaseUntil) ||
			after.Attempt != before.Attempt || after.Result != nil || after.LastError != "" || !after.UpdatedAt.Equal(before.UpdatedAt) {
			t.Errorf("stale reports changed the task:\nbefore %+v\nafter  %+v", before, after)
		}
		if got := types(e.events(t, k.ID)); got != evsBefore {
			t.Errorf("stale reports appended events: %s -> %s", evsBefore, got)
		}

		// The current holder is unaffected.
		done, err := e.rt.CompleteTask(ctx, k.ID, second.LeaseToken, json.RawMessage(`{"ok":true}`))
		must(t, err, "CompleteTask with the current token")
		if done.Status != status.TaskSucceeded || string(done.Result) != `{"ok":true}` {
			t.Errorf("completed = %s %s", done.Status, done.Result)
		}
		// And the stale worker is still refused afterwards.
		_, err = e.rt.CompleteTask(ctx, k.ID, first.LeaseToken, json.RawMessage(`{}`))
		wantIs(t, err, runtime.ErrStaleLease, "CompleteTask with the first token after completion")
		_, err = e.rt.Heartbeat(ctx, "0190c3a2-0000-7000-8000-000000000000", "x", time.Minute)
		wantIs(t, err, store.ErrNotFound, "Heartbeat of an unknown task")
	})
}

func TestTaskCompleteTwice(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1"})
		c := e.claimOne(t, "billing.%")
		e.clk.Advance(time.Second)
		done, err := e.rt.CompleteTask(ctx, k.ID, c.LeaseToken, json.RawMessage(`{"invoice":"inv-1"}`))
		must(t, err, "CompleteTask")
		now := e.clk.Now()
		if done.Status != status.TaskSucceeded || string(done.Result) != `{"invoice":"inv-1"}` || done.FinishedAt == nil || !done.FinishedAt.Equal(now) || done.LeaseUntil != nil {
			t.Fatalf("completed task = %+v", done)
		}
		stored := e.get(t, k.ID)
		if stored.Status != status.TaskSucceeded || string(stored.Result) != `{"invoice":"inv-1"}` {
			t.Fatalf("stored = %+v", stored)
		}
		evs := e.events(t, k.ID)
		if types(evs) != "created,claimed,succeeded" {
			t.Fatalf("events = %s", types(evs))
		}

		e.clk.Advance(time.Second)
		_, err = e.rt.CompleteTask(ctx, k.ID, c.LeaseToken, json.RawMessage(`{"invoice":"inv-2"}`))
		wantIs(t, err, runtime.ErrTaskFinished, "CompleteTask twice")
		_, err = e.rt.FailTask(ctx, k.ID, c.LeaseToken, "late", true)
		wantIs(t, err, runtime.ErrTaskFinished, "FailTask after completion")
		_, err = e.rt.Heartbeat(ctx, k.ID, c.LeaseToken, time.Minute)
		wantIs(t, err, runtime.ErrTaskFinished, "Heartbeat after completion")
		after := e.get(t, k.ID)
		if string(after.Result) != `{"invoice":"inv-1"}` || !after.UpdatedAt.Equal(stored.UpdatedAt) || after.Status != status.TaskSucceeded {
			t.Errorf("a refused report changed the task: %+v", after)
		}
		if got := types(e.events(t, k.ID)); got != "created,claimed,succeeded" {
			t.Errorf("events after refused reports = %s", got)
		}
		// An empty result is stored as JSON null.
		k2 := e.create(t, runtime.NewTask{Type: "billing.invoice.v1"})
		c2 := e.claimOne(t, "billing.%")
		done, err = e.rt.CompleteTask(ctx, k2.ID, c2.LeaseToken, nil)
		must(t, err, "CompleteTask without a result")
		if string(done.Result) != "null" {
			t.Errorf("empty result stored as %q, want null", done.Result)
		}
	})
}

func TestTaskHeartbeat(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1"})
		c := e.claimOne(t, "billing.%") // lease 30s
		e.clk.Advance(20 * time.Second)
		res, err := e.rt.Heartbeat(ctx, k.ID, c.LeaseToken, time.Minute)
		must(t, err, "Heartbeat")
		want := e.clk.Now().Add(time.Minute)
		if !res.LeaseUntil.Equal(want) || res.CancelRequested {
			t.Fatalf("Heartbeat = %+v, want lease until %v, no cancel", res, want)
		}
		stored := e.get(t, k.ID)
		if stored.LeaseUntil == nil || !stored.LeaseUntil.Equal(want) || stored.LeaseToken != c.LeaseToken || stored.Status != status.TaskLeased {
			t.Fatalf("stored after heartbeat = %+v", stored)
		}
		// The old lease end has passed but the extended lease holds.
		e.clk.Advance(15 * time.Second)
		if got := e.claim(t, "billing.%"); len(got) != 0 {
			t.Fatal("task reclaimed after its lease was extended")
		}
		// A default lease when none is given.
		res, err = e.rt.Heartbeat(ctx, k.ID, c.LeaseToken, 0)
		must(t, err, "Heartbeat without a lease")
		if !res.LeaseUntil.Equal(e.clk.Now().Add(30 * time.Second)) {
			t.Errorf("default heartbeat lease until %v, want now+30s", res.LeaseUntil)
		}
		if s := types(e.events(t, k.ID)); s != "created,claimed,heartbeat,heartbeat" {
			t.Errorf("events = %s", s)
		}

		cancelled, err := e.rt.CancelTask(ctx, k.ID)
		must(t, err, "CancelTask")
		if cancelled.Status != status.TaskCancelled || !cancelled.CancelRequested {
			t.Fatalf("cancelled task = %+v", cancelled)
		}
		res, err = e.rt.Heartbeat(ctx, k.ID, c.LeaseToken, time.Minute)
		must(t, err, "Heartbeat after cancel")
		if !res.CancelRequested {
			t.Error("Heartbeat after CancelTask does not report CancelRequested")
		}
		if s := types(e.events(t, k.ID)); s != "created,claimed,heartbeat,heartbeat,cancelled" {
			t.Errorf("events after cancel = %s (a heartbeat on a cancelled task records nothing)", s)
		}
		_, err = e.rt.CompleteTask(ctx, k.ID, c.LeaseToken, json.RawMessage(`{}`))
		wantIs(t, err, runtime.ErrTaskFinished, "CompleteTask after cancel")
		_, err = e.rt.FailTask(ctx, k.ID, c.LeaseToken, "x", true)
		wantIs(t, err, runtime.ErrTaskFinished, "FailTask after cancel")
		if got := e.get(t, k.ID); got.Status != status.TaskCancelled {
			t.Errorf("status after refused reports = %s", got.Status)
		}
	})
}

func TestTaskCancel(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1"})
		e.clk.Advance(time.Second)
		got, err := e.rt.CancelTask(ctx, k.ID)
		must(t, err, "CancelTask")
		if got.Status != status.TaskCancelled || !got.CancelRequested || got.FinishedAt == nil || !got.FinishedAt.Equal(e.clk.Now()) {
			t.Fatalf("cancelled = %+v", got)
		}
		if s := types(e.events(t, k.ID)); s != "created,cancelled" {
			t.Errorf("events = %s", s)
		}
		for _, d := range []time.Duration{0, time.Hour, 48 * time.Hour} {
			e.clk.Advance(d)
			if got := e.claim(t, "billing.%"); len(got) != 0 {
				t.Fatalf("a cancelled task was claimed")
			}
		}
		_, err = e.rt.CancelTask(ctx, k.ID)
		wantIs(t, err, runtime.ErrTaskFinished, "CancelTask twice")

		k2 := e.create(t, runtime.NewTask{Type: "billing.invoice.v1"})
		c := e.claimOne(t, "billing.%")
		_, err = e.rt.CompleteTask(ctx, k2.ID, c.LeaseToken, json.RawMessage(`{}`))
		must(t, err, "CompleteTask")
		_, err = e.rt.CancelTask(ctx, k2.ID)
		wantIs(t, err, runtime.ErrTaskFinished, "CancelTask of a succeeded task")
		if got := e.get(t, k2.ID); got.Status != status.TaskSucceeded || got.CancelRequested {
			t.Errorf("refused cancel changed the task: %+v", got)
		}
		_, err = e.rt.CancelTask(ctx, "0190c3a2-0000-7000-8000-000000000000")
		wantIs(t, err, store.ErrNotFound, "CancelTask of an unknown task")
	})
}

func TestCreateTaskValidationAndIdempotency(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		for _, nt := range []runtime.NewTask{{Type: ""}, {Type: "billing"}, {Type: "Billing.Invoice.v1"}, {Type: "billing.invoice"}, {Type: "a.v1", MaxAttempts: -1}, {Type: "a.v1", MaxAttempts: 101}} {
			_, _, err := e.rt.CreateTask(ctx, nt)
			wantIs(t, err, runtime.ErrInvalidTask, "CreateTask "+nt.Type)
		}
		prio := 3
		runAt := t0.Add(time.Hour)
		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", Priority: &prio, RunAt: &runAt, IdempotencyKey: "key-1"})
		if k.Priority != 3 || !k.RunAt.Equal(runAt) || string(k.Payload) != "{}" || k.Status != status.TaskPending {
			t.Errorf("created = %+v, want priority 3, run_at %v, payload {}", k, runAt)
		}
		again, created, err := e.rt.CreateTask(ctx, runtime.NewTask{Type: "billing.invoice.v1", IdempotencyKey: "key-1", Payload: json.RawMessage(`{"x":1}`)})
		must(t, err, "CreateTask again")
		if created || again.ID != k.ID || string(again.Payload) != "{}" {
			t.Errorf("repeated key = created %v id %s payload %s; want the first task", created, again.ID, again.Payload)
		}
		// A run_at in the past means now.
		past := t0.Add(-time.Hour)
		p := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", RunAt: &past})
		if !p.RunAt.Equal(e.clk.Now()) {
			t.Errorf("past run_at stored as %v, want now %v", p.RunAt, e.clk.Now())
		}
	})
}

// TestClaimLongPollWakesOnNewTask: a waiting claim returns as soon as a
// matching task is created, long before its wait ends (the fake clock never
// moves, so only the wake-up can end it).
func TestClaimLongPollWakesOnNewTask(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		type result struct {
			ts  []*store.Task
			err error
		}
		done := make(chan result, 1)
		go func() {
			ts, err := e.rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: []string{"billing.%"}, WorkerID: "w", Lease: time.Minute, Max: 5, Wait: 5 * time.Second})
			done <- result{ts, err}
		}()
		if d := e.clk.waitTimer(t); d != 5*time.Second {
			t.Errorf("claim waits %v, want the 5s it asked for", d)
		}
		// A task of another type wakes the claim, which finds nothing and
		// waits again (a new timer), without returning.
		e.create(t, runtime.NewTask{Type: "payments.x.v1"})
		e.clk.waitTimer(t)
		select {
		case r := <-done:
			t.Fatalf("claim returned %d tasks, %v for a non-matching task", len(r.ts), r.err)
		default:
		}

		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1"})
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("ClaimTasks: %v", r.err)
			}
			if len(r.ts) != 1 || r.ts[0].ID != k.ID || r.ts[0].LeaseToken == "" {
				t.Fatalf("woken claim returned %+v, want task %s", r.ts, k.ID)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting claim did not return within 10s of a matching task being created")
		}
		if !e.clk.Now().Equal(t0) {
			t.Fatalf("the fake clock moved")
		}
	})
}

func TestClaimLongPollTimesOut(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		done := make(chan []*store.Task, 1)
		errc := make(chan error, 1)
		go func() {
			ts, err := e.rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: []string{"billing.%"}, WorkerID: "w", Wait: 5 * time.Second})
			errc <- err
			done <- ts
		}()
		if d := e.clk.waitTimer(t); d != 5*time.Second {
			t.Errorf("claim waits %v, want 5s", d)
		}
		e.clk.Advance(4 * time.Second)
		select {
		case <-errc:
			t.Fatal("claim returned before its wait ended")
		default:
		}
		e.clk.Advance(time.Second)
		select {
		case err := <-errc:
			must(t, err, "ClaimTasks")
			if ts := <-done; len(ts) != 0 {
				t.Fatalf("claim with nothing ready returned %d tasks", len(ts))
			}
		case <-time.After(10 * time.Second):
			t.Fatal("claim did not return within 10s after its wait ended")
		}

		// The wait is capped.
		go func() {
			_, err := e.rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: []string{"billing.%"}, Wait: time.Hour})
			errc <- err
		}()
		if d := e.clk.waitTimer(t); d != runtime.MaxClaimWait {
			t.Errorf("claim asked to wait 1h waits %v, want the cap %v", d, runtime.MaxClaimWait)
		}
		e.clk.Advance(runtime.MaxClaimWait)
		select {
		case err := <-errc:
			must(t, err, "ClaimTasks")
		case <-time.After(10 * time.Second):
			t.Fatal("capped claim did not return")
		}
	})
}

// TestClaimLongPollWakesAtRunAt: a claim waiting while a matching task is
// scheduled for later wakes when it comes due, not at the end of its wait.
func TestClaimLongPollWakesAtRunAt(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		runAt := t0.Add(2 * time.Second)
		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", RunAt: &runAt})
		type result struct {
			ts  []*store.Task
			err error
		}
		done := make(chan result, 1)
		go func() {
			ts, err := e.rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: []string{"billing.%"}, WorkerID: "w", Wait: 5 * time.Second})
			done <- result{ts, err}
		}()
		if d := e.clk.waitTimer(t); d != 2*time.Second {
			t.Errorf("claim waits %v, want 2s (until the task's run_at)", d)
		}
		e.clk.Advance(2 * time.Second)
		select {
		case r := <-done:
			if r.err != nil || len(r.ts) != 1 || r.ts[0].ID != k.ID {
				t.Fatalf("claim at run_at = %+v, %v; want task %s", r.ts, r.err, k.ID)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("claim did not return within 10s of the task's run_at")
		}
	})
}

// TestClaimLongPollWakesAtRunAtAfterAFullClaim: after a claim that got
// all it asked for, the store claims without first reading whether
// anything is claimable, so a claim that then finds nothing has not read
// when the next task comes due: the wait still ends at that task's run_at.
func TestClaimLongPollWakesAtRunAtAfterAFullClaim(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		e.create(t, runtime.NewTask{Type: "billing.invoice.v1"})
		full, err := e.rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: []string{"billing.%"}, WorkerID: "w", Lease: 30 * time.Second, Max: 1})
		if err != nil || len(full) != 1 {
			t.Fatalf("first claim = %d tasks, %v; want the one task", len(full), err)
		}
		runAt := t0.Add(2 * time.Second)
		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", RunAt: &runAt})
		done := make(chan []*store.Task, 1)
		go func() {
			ts, err := e.rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: []string{"billing.%"}, WorkerID: "w", Wait: 5 * time.Second})
			if err != nil {
				t.Error(err)
			}
			done <- ts
		}()
		if d := e.clk.waitTimer(t); d != 2*time.Second {
			t.Errorf("claim waits %v, want 2s (until the task's run_at)", d)
		}
		e.clk.Advance(2 * time.Second)
		select {
		case ts := <-done:
			if len(ts) != 1 || ts[0].ID != k.ID {
				t.Fatalf("claim at run_at = %+v; want task %s", ts, k.ID)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("claim did not return within 10s of the task's run_at")
		}
	})
}

func TestClaimLongPollContextCancelled(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			_, err := e.rt.ClaimTasks(ctx, runtime.ClaimRequest{Types: []string{"billing.%"}, Wait: 5 * time.Second})
			errc <- err
		}()
		e.clk.waitTimer(t)
		cancel()
		select {
		case err := <-errc:
			if err == nil {
				t.Fatal("claim with a cancelled context returned no error")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("claim did not return after its context was cancelled")
		}
	})
}

// TestExhaustedTaskFailed: a task whose final attempt's lease expired is
// failed when reclaimed, not handed out again.
func TestExhaustedTaskFailed(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		k := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", MaxAttempts: 1})
		c := e.claimOne(t, "billing.%")
		if c.Attempt != 1 {
			t.Fatalf("attempt %d", c.Attempt)
		}
		e.clk.Advance(31 * time.Second)
		if got := e.claim(t, "billing.%"); len(got) != 0 {
			t.Fatalf("an exhausted task was handed out again: %+v", got[0])
		}
		got := e.get(t, k.ID)
		if got.Status != status.TaskFailed || got.LastError == "" || got.FinishedAt == nil || got.LeaseUntil != nil || got.Attempt != 1 {
			t.Fatalf("exhausted task = %+v, want failed with an error on its one attempt", got)
		}
		// No claim of an attempt that was never made: the claim that met
		// it failed it as it was.
		if s := types(e.events(t, k.ID)); s != "created,claimed,lease_expired,failed" {
			t.Errorf("events = %s", s)
		}
		// The worker that crashed cannot report now either: its attempt
		// is the one that ended.
		_, err := e.rt.CompleteTask(t.Context(), k.ID, c.LeaseToken, nil)
		if !errors.Is(err, runtime.ErrTaskFinished) {
			t.Errorf("late CompleteTask: %v, want ErrTaskFinished", err)
		}
		e.clk.Advance(time.Hour)
		if got := e.claim(t, "billing.%"); len(got) != 0 {
			t.Fatal("failed task claimed")
		}

		// With an attempt left, the reclaim is handed out (control).
		k2 := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", MaxAttempts: 2})
		e.claimOne(t, "billing.%")
		e.clk.Advance(31 * time.Second)
		c2 := e.claimOne(t, "billing.%")
		if c2.ID != k2.ID || c2.Attempt != 2 || !c2.Reclaimed {
			t.Fatalf("reclaim with an attempt left = %+v", c2)
		}
		// Exhausted tasks are dropped from a batch without losing the
		// rest: k2 (now on its last attempt) and k3 both expire.
		k3 := e.create(t, runtime.NewTask{Type: "billing.invoice.v1", MaxAttempts: 1})
		if c3 := e.claimOne(t, "billing.%"); c3.ID != k3.ID {
			t.Fatalf("claimed %s, want %s", c3.ID, k3.ID)
		}
		e.clk.Advance(31 * time.Second)
		fresh := e.create(t, runtime.NewTask{Type: "billing.invoice.v1"})
		batch := e.claim(t, "billing.%")
		if len(batch) != 1 || batch[0].ID != fresh.ID {
			t.Errorf("batch = %+v, want only the fresh task %s", batch, fresh.ID)
		}
		for _, id := range []string{k2.ID, k3.ID} {
			if got := e.get(t, id); got.Status != status.TaskFailed {
				t.Errorf("exhausted task %s in a batch = %s, want failed", id, got.Status)
			}
		}
	})
}

// ---- workflow integration ----

func (e *env) workflow(t *testing.T, src string) *store.Workflow {
	t.Helper()
	def, err := spec.Parse([]byte(src), spec.Limits{})
	if err != nil {
		t.Fatalf("spec.Parse: %v", err)
	}
	wf, err := e.st.CreateWorkflow(t.Context(), &store.Workflow{Name: def.Name, Definition: def.Source, Fingerprint: def.Fingerprint(), Enabled: def.Enabled})
	if err != nil {
		t.Fatalf("CreateWorkflow: %v", err)
	}
	return wf
}

func (e *env) trigger(t *testing.T, wf string, input string) *store.Run {
	t.Helper()
	r, created, err := e.rt.Trigger(t.Context(), runtime.TriggerRequest{Workflow: wf, Input: json.RawMessage(input)})
	if err != nil {
		t.Fatalf("Trigger: %v", err)
	}
	if !created {
		t.Fatal("Trigger: created=false")
	}
	return r
}

func (e *env) run(t *testing.T, id string) (*store.Run, map[string]*store.StepRun) {
	t.Helper()
	r, steps, err := e.st.GetRun(t.Context(), id)
	if err != nil {
		t.Fatalf("GetRun: %v", err)
	}
	m := map[string]*store.StepRun{}
	for _, s := range steps {
		m[s.Name] = s
	}
	return r, m
}

const thumbnailFlow = `{
  "name": "thumbnails",
  "tasks": {
    "upload": {"task": {"type": "content.upload.v1", "payload": {"file": "{{trigger.body.file}}"}}},
    "resize": {"needs": ["upload"], "task": {"type": "content.thumbnail.v1", "payload": {"id": "{{tasks.upload.body.id}}"}, "priority": 5}, "retries": 4}
  }
}`

func TestWorkflowTaskStepCompletes(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		e.workflow(t, thumbnailFlow)
		r := e.trigger(t, "thumbnails", `{"file":"cat.png"}`)
		_, steps := e.run(t, r.ID)
		if steps["upload"].Status != status.StepRunning || steps["resize"].Status != status.StepPending {
			t.Fatalf("after trigger: upload %s, resize %s; want running, pending", steps["upload"].Status, steps["resize"].Status)
		}

		up := e.claimOne(t, "content.%")
		if up.RunID != r.ID || up.Step != "upload" || up.Type != "content.upload.v1" || !jsonEq(t, up.Payload, []byte(`{"file":"cat.png"}`)) {
			t.Fatalf("claimed %+v (payload %s), want run %s step upload with the rendered payload", up, up.Payload, r.ID)
		}
		e.clk.Advance(3 * time.Second)
		_, err := e.rt.CompleteTask(ctx, up.ID, up.LeaseToken, json.RawMessage(`{"id": 7}`))
		must(t, err, "CompleteTask upload")

		run, steps := e.run(t, r.ID)
		u := steps["upload"]
		if u.Status != status.StepSuccess || !jsonEq(t, u.Body, []byte(`{"id":7}`)) || u.Attempt != 1 || u.FinishedAt == nil || !u.FinishedAt.Equal(e.clk.Now()) {
			t.Fatalf("upload step = {Status:%s Body:%s Attempt:%d FinishedAt:%v}, want success with body {\"id\":7}", u.Status, u.Body, u.Attempt, u.FinishedAt)
		}
		if steps["resize"].Status != status.StepRunning || run.Status != status.RunRunning {
			t.Fatalf("resize %s run %s, want running, running", steps["resize"].Status, run.Status)
		}

		rs := e.claimOne(t, "content.%")
		if rs.Step != "resize" || rs.Type != "content.thumbnail.v1" || rs.Priority != 5 {
			t.Fatalf("claimed %+v, want the resize task with priority 5", rs)
		}
		if !jsonEq(t, rs.Payload, []byte(`{"id":7}`)) {
			t.Errorf("resize payload = %s, want {\"id\":7} (tasks.upload.body.id rendered)", rs.Payload)
		}
		if maxAttempts, _ := e.rt.TaskDefaults(ctx, rs); maxAttempts != 5 {
			t.Errorf("resize max attempts = %d, want 5 (retries 4 + 1)", maxAttempts)
		}
		// A retry of the step keeps it running and records the attempt.
		_, err = e.rt.FailTask(ctx, rs.ID, rs.LeaseToken, "decoder busy", true)
		must(t, err, "FailTask resize")
		_, steps = e.run(t, r.ID)
		if s := steps["resize"]; s.Status != status.StepRunning || s.Attempt != 1 || s.Error != "decoder busy" {
			t.Errorf("resize after a retryable failure = {Status:%s Attempt:%d Error:%q}", s.Status, s.Attempt, s.Error)
		}
		e.clk.Advance(2 * time.Minute)
		rs = e.claimOne(t, "content.%")
		if rs.Attempt != 2 {
			t.Fatalf("retry attempt = %d, want 2", rs.Attempt)
		}
		_, err = e.rt.CompleteTask(ctx, rs.ID, rs.LeaseToken, json.RawMessage(`{"thumb":"cat-small.png"}`))
		must(t, err, "CompleteTask resize")

		run, steps = e.run(t, r.ID)
		if run.Status != status.RunCompleted || run.FinishedAt == nil {
			t.Fatalf("run = %s, want completed", run.Status)
		}
		if s := steps["resize"]; s.Status != status.StepSuccess || s.Attempt != 2 || s.Error != "" || !jsonEq(t, s.Body, []byte(`{"thumb":"cat-small.png"}`)) {
			t.Errorf("resize step = {Status:%s Attempt:%d Error:%q Body:%s}", s.Status, s.Attempt, s.Error, s.Body)
		}
		evs, err := e.st.ListEvents(ctx, r.ID, 0, 0)
		must(t, err, "ListEvents")
		if got, want := types(evs), "run_started,step_started,step_succeeded,step_started,step_retrying,step_succeeded,run_completed"; got != want {
			t.Errorf("run events = %s, want %s", got, want)
		}
		// Nothing is left to claim.
		e.clk.Advance(time.Hour)
		if got := e.claim(t, "%"); len(got) != 0 {
			t.Errorf("%d tasks left after the run completed", len(got))
		}
	})
}

func TestWorkflowTaskStepFails(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		e.workflow(t, `{
  "name": "fails",
  "tasks": {
    "upload": {"task": {"type": "content.upload.v1"}, "retries": 1, "retry_delay": "10s"},
    "notify": {"needs": ["upload"], "url": "https://example.com/notify", "method": "POST"},
    "thumb": {"needs": ["upload"], "task": {"type": "content.thumbnail.v1"}}
  }
}`)
		r := e.trigger(t, "fails", `{}`)
		c := e.claimOne(t, "content.%")
		if c.RetryDelay != 10*time.Second {
			t.Errorf("task retry delay = %v, want the step's 10s", c.RetryDelay)
		}
		failedAt := e.clk.Now()
		got, err := e.rt.FailTask(ctx, c.ID, c.LeaseToken, "disk full", true)
		must(t, err, "FailTask 1")
		if got.Status != status.TaskPending || got.RunAt.Before(failedAt.Add(10*time.Second)) || got.RunAt.After(failedAt.Add(11*time.Second)) {
			t.Fatalf("after attempt 1 of 2: %s run_at now+%v, want pending in [10s, 11s]", got.Status, got.RunAt.Sub(failedAt))
		}
		run, steps := e.run(t, r.ID)
		if run.Status != status.RunRunning || steps["upload"].Status != status.StepRunning {
			t.Fatalf("after a retryable failure run %s upload %s", run.Status, steps["upload"].Status)
		}
		e.clk.Advance(11 * time.Second)
		c = e.claimOne(t, "content.%")
		_, err = e.rt.FailTask(ctx, c.ID, c.LeaseToken, "disk still full", true)
		must(t, err, "FailTask 2")

		run, steps = e.run(t, r.ID)
		if s := steps["upload"]; s.Status != status.StepFailed || s.Error != "disk still full" || s.Attempt != 2 {
			t.Errorf("upload step = {Status:%s Error:%q Attempt:%d}, want failed", s.Status, s.Error, s.Attempt)
		}
		for _, name := range []string{"notify", "thumb"} {
			if s := steps[name]; s.Status != status.StepSkipped || !s.Blocked {
				t.Errorf("%s = {Status:%s Blocked:%v}, want skipped and blocked", name, s.Status, s.Blocked)
			}
		}
		if run.Status != status.RunFailed || !strings.Contains(run.Error, "notify") || run.FinishedAt == nil {
			t.Errorf("run = {Status:%s Error:%q}, want failed naming the blocked steps", run.Status, run.Error)
		}
		// No task was created for the blocked task step.
		e.clk.Advance(time.Hour)
		if got := e.claim(t, "%"); len(got) != 0 {
			t.Errorf("claimable after the run failed: %+v", got[0])
		}

		// Non-retryable on the first attempt fails the step at once.
		r2 := e.trigger(t, "fails", `{}`)
		c = e.claimOne(t, "content.%")
		_, err = e.rt.FailTask(ctx, c.ID, c.LeaseToken, "bad input", false)
		must(t, err, "FailTask non-retryable")
		run, steps = e.run(t, r2.ID)
		if run.Status != status.RunFailed || steps["upload"].Status != status.StepFailed || steps["upload"].Attempt != 1 {
			t.Errorf("run %s upload %s attempt %d, want failed, failed, 1", run.Status, steps["upload"].Status, steps["upload"].Attempt)
		}
	})
}

func TestWorkflowCancelRunCancelsTask(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		e.workflow(t, thumbnailFlow)
		r := e.trigger(t, "thumbnails", `{"file":"x"}`)
		c := e.claimOne(t, "content.%")
		e.clk.Advance(time.Second)
		run, err := e.rt.Cancel(ctx, r.ID)
		must(t, err, "Cancel")
		if run.Status != status.RunCancelled {
			t.Fatalf("run = %s, want cancelled", run.Status)
		}
		k := e.get(t, c.ID)
		if k.Status != status.TaskCancelled || !k.CancelRequested {
			t.Fatalf("task after the run was cancelled = {Status:%s CancelRequested:%v}, want cancelled", k.Status, k.CancelRequested)
		}
		if s := types(e.events(t, c.ID)); s != "created,claimed,cancelled" {
			t.Errorf("task events = %s", s)
		}
		// The worker learns it at its heartbeat and its report is refused.
		hb, err := e.rt.Heartbeat(ctx, c.ID, c.LeaseToken, time.Minute)
		must(t, err, "Heartbeat")
		if !hb.CancelRequested {
			t.Error("heartbeat does not report the cancellation")
		}
		_, err = e.rt.CompleteTask(ctx, c.ID, c.LeaseToken, json.RawMessage(`{"id":1}`))
		if !errors.Is(err, runtime.ErrTaskFinished) {
			t.Fatalf("CompleteTask of a cancelled run's task: %v, want ErrTaskFinished", err)
		}
		run, steps := e.run(t, r.ID)
		if run.Status != status.RunCancelled || steps["upload"].Status != status.StepCancelled || steps["upload"].Body != nil || steps["resize"].Status != status.StepCancelled {
			t.Errorf("after the refused completion: run %s upload %s (body %s) resize %s", run.Status, steps["upload"].Status, steps["upload"].Body, steps["resize"].Status)
		}
		if got := e.get(t, c.ID); got.Status != status.TaskCancelled || got.Result != nil {
			t.Errorf("task after the refused completion = %+v", got)
		}
		e.clk.Advance(time.Hour)
		if got := e.claim(t, "%"); len(got) != 0 {
			t.Errorf("claimable after the run was cancelled: %+v", got[0])
		}
	})
}

// TestWorkflowCancelTaskFailsStep: cancelling a run's task directly cancels
// its step, which blocks its dependents like any failure.
func TestWorkflowCancelTaskFailsStep(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		e.workflow(t, thumbnailFlow)
		r := e.trigger(t, "thumbnails", `{"file":"x"}`)
		c := e.claimOne(t, "content.%")
		_, err := e.rt.CancelTask(t.Context(), c.ID)
		must(t, err, "CancelTask")
		run, steps := e.run(t, r.ID)
		if steps["upload"].Status != status.StepCancelled || steps["resize"].Status != status.StepSkipped || !steps["resize"].Blocked || run.Status != status.RunFailed {
			t.Errorf("after cancelling the task: upload %s, resize %s (blocked %v), run %s; want cancelled, skipped+blocked, failed",
				steps["upload"].Status, steps["resize"].Status, steps["resize"].Blocked, run.Status)
		}
	})
}

// TestConcurrentReportsBatched sends many reports at once, so they are
// applied in shared transactions: parallel steps of one run and of many
// runs all advance their runs, and a stale report among them is refused
// without failing the others.
func TestConcurrentReportsBatched(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		e.workflow(t, `{"name": "fan", "tasks": {
			"p1": {"task": {"type": "fan.step.v1"}}, "p2": {"task": {"type": "fan.step.v1"}},
			"p3": {"task": {"type": "fan.step.v1"}}, "p4": {"task": {"type": "fan.step.v1"}},
			"z": {"needs": ["p1", "p2", "p3", "p4"], "task": {"type": "fan.last.v1"}}}}`)
		const runs = 12
		ids := map[string]bool{}
		for i := range runs {
			ids[e.trigger(t, "fan", fmt.Sprintf(`{"i": %d}`, i)).ID] = true
		}
		got, err := e.rt.ClaimTasks(ctx, runtime.ClaimRequest{Types: []string{"fan.step.v1"}, WorkerID: "w", Lease: time.Minute, Max: 100})
		must(t, err, "ClaimTasks")
		if len(got) != 4*runs {
			t.Fatalf("claimed %d parallel tasks, want %d", len(got), 4*runs)
		}
		var wg sync.WaitGroup
		errs := make([]error, len(got)+1)
		for i, k := range got {
			wg.Go(func() {
				_, errs[i] = e.rt.CompleteTask(ctx, k.ID, k.LeaseToken, json.RawMessage(fmt.Sprintf(`{"n": %d}`, i)))
			})
		}
		wg.Go(func() { _, errs[len(got)] = e.rt.CompleteTask(ctx, got[0].ID, "stale-token", nil) })
		wg.Wait()
		for i, err := range errs[:len(got)] {
			must(t, err, "CompleteTask "+got[i].Step)
		}
		wantIs(t, errs[len(got)], runtime.ErrStaleLease, "a report with a stale token")

		last, err := e.rt.ClaimTasks(ctx, runtime.ClaimRequest{Types: []string{"fan.last.v1"}, WorkerID: "w", Lease: time.Minute, Max: 100})
		must(t, err, "ClaimTasks last")
		if len(last) != runs {
			t.Fatalf("claimed %d join tasks, want one per run (%d)", len(last), runs)
		}
		for _, k := range last {
			if !ids[k.RunID] {
				t.Errorf("join task of unknown run %s", k.RunID)
			}
			_, err := e.rt.CompleteTask(ctx, k.ID, k.LeaseToken, nil)
			must(t, err, "CompleteTask z")
		}
		for id := range ids {
			run, steps := e.run(t, id)
			if run.Status != status.RunCompleted {
				t.Errorf("run %s = %s, want completed", id, run.Status)
			}
			for name, s := range steps {
				if s.Status != status.StepSuccess {
					t.Errorf("run %s step %s = %s, want success", id, name, s.Status)
				}
			}
			evs, err := e.st.ListEvents(ctx, id, 0, 0)
			must(t, err, "ListEvents")
			for i, ev := range evs {
				if ev.Seq != int64(i+1) {
					t.Fatalf("run %s event %d has seq %d: sequence broken by batching", id, i, ev.Seq)
				}
			}
		}
	})
}

// TestCompleteTaskAndClaim: a completion hands the worker the tasks it
// starts when their types match, leased and with a claimed event; others
// stay pending for any claim; max bounds what is taken.
func TestCompleteTaskAndClaim(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		e.workflow(t, `{"name": "eager", "tasks": {
			"a": {"task": {"type": "eager.a.v1"}},
			"b1": {"needs": ["a"], "task": {"type": "eager.b.v1", "payload": {"from": "{{tasks.a.body.v}}"}}},
			"b2": {"needs": ["a"], "task": {"type": "eager.b.v1"}},
			"c": {"needs": ["a"], "task": {"type": "other.c.v1"}}}}`)
		r := e.trigger(t, "eager", `{}`)
		a := e.claimOne(t, "eager.%")
		next := runtime.ClaimRequest{Types: []string{"eager.%"}, WorkerID: "w-eager", Lease: time.Minute, Max: 1}

		_, got, err := e.rt.CompleteTaskAndClaim(ctx, a.ID, "wrong-token", json.RawMessage(`{"v": 1}`), next)
		wantIs(t, err, runtime.ErrStaleLease, "CompleteTaskAndClaim with a stale token")
		if len(got) != 0 {
			t.Fatalf("a refused completion handed out %d tasks", len(got))
		}

		done, got, err := e.rt.CompleteTaskAndClaim(ctx, a.ID, a.LeaseToken, json.RawMessage(`{"v": 1}`), next)
		must(t, err, "CompleteTaskAndClaim")
		if done.Status != status.TaskSucceeded {
			t.Errorf("completed task = %s, want succeeded", done.Status)
		}
		if len(got) != 1 {
			t.Fatalf("handed %d tasks, want 1 (max 1; b1 and b2 match, c does not)", len(got))
		}
		k := got[0]
		if k.RunID != r.ID || (k.Step != "b1" && k.Step != "b2") || k.Status != status.TaskLeased || k.Attempt != 1 ||
			k.LeasedBy != "w-eager" || k.LeaseToken == "" || k.LeaseUntil == nil || !k.LeaseUntil.Equal(e.clk.Now().Add(time.Minute)) {
			t.Fatalf("handed task = %+v, want a b step leased to w-eager for a minute", k)
		}
		stored := e.get(t, k.ID)
		if stored.Status != status.TaskLeased || stored.LeaseToken != k.LeaseToken || stored.Attempt != 1 {
			t.Errorf("stored handed task = {Status:%s Attempt:%d}, want leased attempt 1 with the handed token", stored.Status, stored.Attempt)
		}
		if got := types(e.events(t, k.ID)); got != "created,claimed" {
			t.Errorf("handed task events = %s, want created,claimed", got)
		}
		if k.Step == "b1" && !jsonEq(t, k.Payload, []byte(`{"from":1}`)) {
			t.Errorf("b1 payload = %s, want the rendered template", k.Payload)
		}
		// The other b and c were left for claims.
		rest := e.claim(t, "eager.%", "other.%")
		var steps []string
		for _, x := range rest {
			steps = append(steps, x.Step)
		}
		if len(rest) != 2 {
			t.Fatalf("left for claims: %v, want the other b step and c", steps)
		}
		// The handed task is the worker's: it completes with its token.
		_, err = e.rt.CompleteTask(ctx, k.ID, k.LeaseToken, nil)
		must(t, err, "CompleteTask of the handed task")
		for _, x := range rest {
			_, err := e.rt.CompleteTask(ctx, x.ID, x.LeaseToken, nil)
			must(t, err, "CompleteTask "+x.Step)
		}
		if run, _ := e.run(t, r.ID); run.Status != status.RunCompleted {
			t.Errorf("run = %s, want completed", run.Status)
		}
	})
}

// TestCompleteTaskAndClaimDisabledType: a task of a disabled type is not
// handed out eagerly, as a claim would not hand it out.
func TestCompleteTaskAndClaimDisabledType(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		e.workflow(t, `{"name": "eager2", "tasks": {"a": {"task": {"type": "eager.a.v1"}}, "b": {"needs": ["a"], "task": {"type": "eager.off.v1"}}}}`)
		_, err := e.st.PutTaskType(ctx, &store.TaskType{Type: "eager.off.v1", Enabled: false})
		must(t, err, "PutTaskType")
		e.rt.TaskTypesChanged()
		e.trigger(t, "eager2", `{}`)
		a := e.claimOne(t, "eager.%")
		_, got, err := e.rt.CompleteTaskAndClaim(ctx, a.ID, a.LeaseToken, nil, runtime.ClaimRequest{Types: []string{"eager.%"}, WorkerID: "w", Lease: time.Minute, Max: 5})
		must(t, err, "CompleteTaskAndClaim")
		if len(got) != 0 {
			t.Fatalf("handed %d tasks of a disabled type", len(got))
		}
	})
}

func TestCheckClaim(t *testing.T) {
	for _, c := range []struct {
		req  runtime.ClaimRequest
		path string
	}{
		{runtime.ClaimRequest{}, "types"},
		{runtime.ClaimRequest{Types: []string{"a.%.b"}}, "types[0]"},
		{runtime.ClaimRequest{Types: []string{"a.v1", ""}}, "types[1]"},
		{runtime.ClaimRequest{Types: []string{"a.%"}, Lease: time.Millisecond}, "lease_seconds"},
		{runtime.ClaimRequest{Types: []string{"a.%"}, Max: 101}, "max"},
		{runtime.ClaimRequest{Types: []string{"a.%"}, Wait: 61 * time.Second}, "wait_seconds"},
	} {
		fe := runtime.CheckClaim(&c.req)
		if fe == nil || fe.Path != c.path {
			t.Errorf("CheckClaim(%+v) = %v, want an error at %s", c.req, fe, c.path)
		}
	}
	req := runtime.ClaimRequest{Types: []string{"a.%"}}
	if fe := runtime.CheckClaim(&req); fe != nil || req.Lease != 30*time.Second || req.Max != 1 || req.WorkerID != "anonymous" {
		t.Errorf("CheckClaim defaults: %v %+v", fe, req)
	}
}

// claimCounter is a store that counts claims.
type claimCounter struct {
	store.Store
	claims atomic.Int64
}

func (c *claimCounter) ClaimOrNext(ctx context.Context, req store.ClaimTasks) (store.Claim, error) {
	c.claims.Add(1)
	return c.Store.ClaimOrNext(ctx, req)
}

// TestWaitingClaimSleepsThroughTasksScheduledAhead: a task created
// scheduled ahead (as a retry's backoff makes one) does not make a
// waiting claim read the database at once: the claim waits until the
// task's run_at, then claims it. A task due at once still wakes it.
func TestWaitingClaimSleepsThroughTasksScheduledAhead(t *testing.T) {
	cs := &claimCounter{Store: openSQLite(t)}
	e := newEnv(t, cs)
	const wait = 57 * time.Second
	claimed := e.waitingClaimOf(t, t.Context(), wait, 1, "later.%")
	if d := e.clk.waitTimer(t); d != wait {
		t.Fatalf("the claim waits %v, want %v", d, wait)
	}
	reads := cs.claims.Load()
	runAt := t0.Add(10 * time.Second)
	k := e.create(t, runtime.NewTask{Type: "later.a.v1", RunAt: &runAt})
	// The claim waits again, until the task's run_at, without a read.
	if d := e.clk.waitTimer(t); d != 10*time.Second {
		t.Fatalf("after a task 10s ahead the claim waits %v, want 10s", d)
	}
	if n := cs.claims.Load(); n != reads {
		t.Errorf("a task scheduled ahead made the waiting claim read %d times", n-reads)
	}
	e.clk.Advance(10 * time.Second)
	wantClaimed(t, claimed, k, "at its run_at")

	claimed = e.waitingClaimOf(t, t.Context(), wait, 1, "later.%")
	if d := e.clk.waitTimer(t); d != wait {
		t.Fatalf("the second claim waits %v, want %v", d, wait)
	}
	k = e.create(t, runtime.NewTask{Type: "later.b.v1"})
	wantClaimed(t, claimed, k, "a task due at once")
}

// wantClaimed checks that a waiting claim returns (bounded, in real time)
// with k alone.
func wantClaimed(t *testing.T, claimed <-chan claimResult, k *store.Task, when string) {
	t.Helper()
	r := recvClaim(t, claimed)
	if r.err != nil || len(r.ts) != 1 || r.ts[0].ID != k.ID {
		t.Fatalf("%s: the claim got %d tasks, %v; want the task %s", when, len(r.ts), r.err, k.ID)
	}
}

// TestWaitingClaimIgnoresOtherTypesAhead: a task scheduled ahead of a type
// the claim does not take leaves its wait as it is (no new timer), and a
// task due at once that follows it still wakes the claim: the claim moved
// on to the wake-up after the one it passed by.
func TestWaitingClaimIgnoresOtherTypesAhead(t *testing.T) {
	e := newEnv(t, openSQLite(t))
	const wait = 57 * time.Second
	claimed := e.waitingClaimOf(t, t.Context(), wait, 1, "mine.%")
	if d := e.clk.waitTimer(t); d != wait {
		t.Fatalf("the claim waits %v, want %v", d, wait)
	}
	runAt := t0.Add(10 * time.Second)
	e.create(t, runtime.NewTask{Type: "theirs.a.v1", RunAt: &runAt})
	k := e.create(t, runtime.NewTask{Type: "mine.a.v1"})
	wantClaimed(t, claimed, k, "a task due at once after one of another type ahead")
	select {
	case d := <-e.clk.timers:
		t.Errorf("the claim set a timer of %v for a task of a type it does not take", d)
	default:
	}
}

// TestWaitingClaimTimerNotPutOff: a commit of tasks scheduled ahead, just
// before a waiting claim's timer is due, leaves that timer as it is: the
// claim takes the task that came due at its time. (A timer set again at
// each such commit was put off by a stream of them.)
func TestWaitingClaimTimerNotPutOff(t *testing.T) {
	e := newEnv(t, openSQLite(t))
	soon := t0.Add(5 * time.Second)
	k := e.create(t, runtime.NewTask{Type: "due.a.v1", RunAt: &soon})
	claimed := e.waitingClaimOf(t, t.Context(), 57*time.Second, 1, "due.%")
	if d := e.clk.waitTimer(t); d != 5*time.Second {
		t.Fatalf("the claim waits %v, want 5s (its task's run_at)", d)
	}
	e.clk.Advance(5*time.Second - 500*time.Microsecond)
	later := t0.Add(time.Hour)
	e.create(t, runtime.NewTask{Type: "due.b.v1", RunAt: &later})
	e.clk.Advance(500 * time.Microsecond)
	wantClaimed(t, claimed, k, "at its timer, after a commit of a task ahead")
}

// TestReportPastMaxDurationRefused: a worker's report that comes after its
// run's expires_at, before the expiry's timer has fired (a backlog, a
// restart after downtime), is refused as it is once the timer has, and
// the run then ends as timeout. It completed the step and the run, past
// the deadline, while the same report a moment later was refused.
func TestReportPastMaxDurationRefused(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		e.workflow(t, `{"name": "late", "max_duration": "10m", "tasks": {"a": {"task": {"type": "late.a.v1"}}}}`)
		r := e.trigger(t, "late", `{}`)
		k := e.claimOne(t, "late.%")
		e.clk.Advance(20 * time.Minute) // no timer loop runs yet: the expiry is due, not applied
		_, err := e.rt.CompleteTask(ctx, k.ID, k.LeaseToken, json.RawMessage(`{"ok": true}`))
		wantIs(t, err, runtime.ErrTaskFinished, "a completion past the run's expires_at")
		if run, steps := e.run(t, r.ID); run.Status != status.RunRunning || steps["a"].Status != status.StepRunning {
			t.Fatalf("after the refused report the run is %s, its step %s; want both as they were", run.Status, steps["a"].Status)
		}
		startRuntime(t, e.rt)
		testwait.Until(t, 10*time.Second, "the expiry to end the run", func() bool {
			run, _ := e.run(t, r.ID)
			return run.Status == status.RunTimeout
		})
		if got := e.get(t, k.ID); got.Status != status.TaskCancelled {
			t.Errorf("the task is %s, want cancelled with its run", got.Status)
		}
	})
}
