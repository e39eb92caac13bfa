package runtime

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/testwait"
)

// TestStaleLeaseSendsNoRequest: an executor that reaches an HTTP attempt
// after its lease ran out sends nothing when another executor has taken
// the item meanwhile (the attempt would run twice), and sends the request
// when nobody has (its lease, taken again under its token, is still its
// own). With most of the lease left it sends without asking.
func TestStaleLeaseSendsNoRequest(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Write([]byte(`{"ok": true}`))
	}))
	defer srv.Close()
	s := openSQLite(t)
	clk := clock.NewFake(time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC))
	const lease = 30 * time.Second
	r := New(Config{Store: s, Clock: clk, HTTP: httpstep.New(http.DefaultTransport), Lease: lease, Logger: slog.New(slog.DiscardHandler), PublicURL: "http://ferry.test"})
	t.Cleanup(r.Close)
	ids := triggered(t, r, s, `{"name": "call", "tasks": {"call": {"url": "`+srv.URL+`"}}}`, 3)
	ctx := t.Context()
	claim := func() *store.QueueItem {
		t.Helper()
		items, err := s.Claim(ctx, clk.Now(), lease, 1, store.KindHTTP)
		if err != nil || len(items) != 1 {
			t.Fatalf("claim: %d items, %v", len(items), err)
		}
		return items[0]
	}
	stepOf := func(runID string) string {
		t.Helper()
		_, steps, err := s.GetRun(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		return steps[0].Status
	}

	// Taken over: the first executor stalls past its lease, another
	// claims the item, then the first goes on.
	stale := claim()
	clk.Advance(lease + time.Second)
	fresh := claim()
	if fresh.ID != stale.ID {
		t.Fatalf("the second claim took item %d, want the stale %d", fresh.ID, stale.ID)
	}
	if err := r.runHTTP(ctx, stale); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("stale executor: %v, want ErrLeaseLost", err)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the stale executor sent %d requests", n)
	}
	if err := r.runHTTP(ctx, fresh); err != nil {
		t.Fatalf("the executor holding the lease: %v", err)
	}
	if n, st := calls.Load(), stepOf(fresh.RunID); n != 1 || st != status.StepSuccess {
		t.Fatalf("after the holder: %d requests, step %s; want 1, success", n, st)
	}

	// Run out but not taken: the lease is taken again and the request
	// sent.
	late := claim()
	clk.Advance(lease - time.Second)
	if err := r.runHTTP(ctx, late); err != nil {
		t.Fatalf("late executor nobody overtook: %v", err)
	}
	if n, st := calls.Load(), stepOf(late.RunID); n != 2 || st != status.StepSuccess {
		t.Fatalf("after the late executor: %d requests, step %s; want 2, success", n, st)
	}

	// Most of the lease left: sent.
	prompt := claim()
	if err := r.runHTTP(ctx, prompt); err != nil {
		t.Fatalf("prompt executor: %v", err)
	}
	if n, st := calls.Load(), stepOf(prompt.RunID); n != 3 || st != status.StepSuccess {
		t.Fatalf("after the prompt executor: %d requests, step %s; want 3, success", n, st)
	}
	if len(ids) != 3 {
		t.Fatalf("%d runs", len(ids))
	}
}

// notifierStore is a store whose wake-ups (store.Notifier) end only when
// the test lets them, after Run's context ended: as a Postgres listener
// ends with its goodbye to the other servers.
type notifierStore struct {
	store.Store
	release chan struct{}
	ended   atomic.Bool
}

func (n *notifierStore) Wakeups(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		<-ctx.Done()
		<-n.release
		n.ended.Store(true)
	}()
	return ch
}

// TestRunWaitsForItsWakeups: Run returns only once its store's wake-ups
// have ended (on Postgres, the node's goodbye is out: a Run started after
// it must not have its hello followed by that goodbye), and a second Run
// while one runs is refused.
func TestRunWaitsForItsWakeups(t *testing.T) {
	n := &notifierStore{Store: openSQLite(t), release: make(chan struct{})}
	r := New(Config{Store: n, Clock: clock.NewFake(time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC)), HTTP: httpstep.New(http.DefaultTransport), Logger: slog.New(slog.DiscardHandler), PublicURL: "http://ferry.test"})
	t.Cleanup(r.Close)
	var once sync.Once
	release := func() { once.Do(func() { close(n.release) }) }
	t.Cleanup(release) // first: a failed check must not leave Run blocked
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testwait.Until(t, 10*time.Second, "Run running", r.running.Load)
	if err := r.Run(t.Context()); !errors.Is(err, ErrRunning) {
		t.Fatalf("a second Run while one runs: %v, want ErrRunning", err)
	}
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) before its wake-ups ended", err)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !n.ended.Load() {
		t.Fatal("Run returned before its wake-ups ended")
	}
	if r.running.Load() {
		t.Fatal("Run still counts as running after it returned")
	}
}
