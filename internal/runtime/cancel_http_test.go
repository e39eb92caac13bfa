package runtime_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
)

// cancelAfterRead is a store whose next GetRun, once it has read the run,
// runs hook: the moment between the dispatcher's read of a run and its
// HTTP request.
type cancelAfterRead struct {
	store.Store
	hook atomic.Pointer[func()]
}

func (s *cancelAfterRead) GetRun(ctx context.Context, id string) (*store.Run, []*store.StepRun, error) {
	run, steps, err := s.Store.GetRun(ctx, id)
	if f := s.hook.Swap(nil); f != nil {
		(*f)()
	}
	return run, steps, err
}

// attempts records the outcomes of HTTP attempts.
type attempts struct {
	runtime.Observer
	outcomes chan string
}

func (a attempts) HTTPAttempt(outcome string, _ time.Duration) { a.outcomes <- outcome }

// TestCancelBetweenReadAndRequestSendsNothing: a run cancelled after the
// dispatcher read it and before its HTTP step's request went out. The
// cancel is acknowledged, so the request must not be sent: the attempt
// ends cancelled and the run stays cancelled. (Found by an audit: the
// attempt was registered for aborting only after the read, and the
// request went out.)
func TestCancelBetweenReadAndRequestSendsNothing(t *testing.T) {
	e := newEnv(t, openSQLite(t))
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
	}))
	defer srv.Close()
	st := &cancelAfterRead{Store: e.st}
	obs := attempts{Observer: nil, outcomes: make(chan string, 4)}
	rt := runtime.New(runtime.Config{Store: st, Clock: e.clk, PublicURL: "http://ferry.test", HTTP: httpstep.New(http.DefaultTransport), Logger: slog.New(slog.DiscardHandler), Observer: obs})
	t.Cleanup(rt.Close)
	e.workflow(t, `{"name": "charge", "tasks": {"charge": {"url": "`+srv.URL+`"}}}`)
	run, _, err := rt.Trigger(t.Context(), runtime.TriggerRequest{Workflow: "charge"})
	must(t, err, "Trigger")
	cancelled := make(chan string, 1)
	hook := func() {
		r, err := rt.Cancel(context.WithoutCancel(t.Context()), run.ID)
		if err != nil {
			t.Errorf("Cancel: %v", err)
			cancelled <- ""
			return
		}
		cancelled <- r.Status
	}
	st.hook.Store(&hook)
	startRuntime(t, rt)
	select {
	case got := <-cancelled:
		if got != status.RunCancelled {
			t.Fatalf("Cancel answered %q, want %q", got, status.RunCancelled)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the dispatcher never read the run")
	}
	select {
	case got := <-obs.outcomes:
		if got != "cancelled" {
			t.Errorf("the attempt ended %q, want cancelled", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the attempt never ended")
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the request was sent %d time(s) after the cancel was acknowledged", n)
	}
	got, steps := e.run(t, run.ID)
	if got.Status != status.RunCancelled || steps["charge"].Status != status.StepCancelled {
		t.Errorf("run %s, step %s; want cancelled, cancelled", got.Status, steps["charge"].Status)
	}
}
