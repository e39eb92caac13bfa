package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
)

// startRuntime runs the dispatcher and timer loop until the test ends.
func startRuntime(t *testing.T, rt *runtime.Runtime) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = rt.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// waitRuns waits (in real time, bounded) until every run of ids is
// completed.
func waitRuns(t *testing.T, st store.Store, ids []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range ids {
		for {
			r, _, err := st.GetRun(t.Context(), id)
			must(t, err, "GetRun")
			if r.Status == status.RunCompleted {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %s is %s after 30s, want completed", id, r.Status)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestTimerBurstFiresEachOnce: 300 wake-ups due at the same instant are
// fired by the timer loop (in several transactions at once on Postgres),
// each exactly once, none before it is due, each stamped with the moment
// it was applied.
func TestTimerBurstFiresEachOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		e.workflow(t, `{"name": "burst", "tasks": {"nap": {"sleep": "1s"}}}`)
		reqs := make([]runtime.TriggerRequest, 300)
		for i := range reqs {
			reqs[i] = runtime.TriggerRequest{Input: json.RawMessage(fmt.Sprintf(`{"i": %d}`, i))}
		}
		res, err := e.rt.TriggerBatch(t.Context(), "burst", reqs)
		must(t, err, "TriggerBatch")
		ids := make([]string, len(res))
		for i, r := range res {
			ids[i] = r.Run.ID
		}
		startRuntime(t, e.rt)
		// Nothing is due yet: the runs stay asleep until the clock moves.
		if due, err := e.st.DueTimers(t.Context(), e.clk.Now(), e.clk.Now(), 10); err != nil || len(due) != 0 {
			t.Fatalf("due before the wake time: %d items, err %v", len(due), err)
		}
		wake := e.clk.Now().Add(time.Second)
		e.clk.Advance(time.Second)
		e.rt.Nudge() // the fake clock fires timers; a nudge makes it prompt
		waitRuns(t, e.st, ids)
		for _, id := range ids {
			_, steps := e.run(t, id)
			nap := steps["nap"]
			if nap.Status != status.StepSuccess || nap.FinishedAt == nil || !nap.FinishedAt.Equal(wake) {
				t.Fatalf("run %s: nap %s finished at %v, want success at %v", id, nap.Status, nap.FinishedAt, wake)
			}
			evs, err := e.st.ListEvents(t.Context(), id, 0, 0)
			must(t, err, "ListEvents")
			n := 0
			for _, ev := range evs {
				if ev.Type == "step_succeeded" && ev.Step == "nap" {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("run %s: %d step_succeeded events for nap, want 1", id, n)
			}
		}
		if due, err := e.st.DueTimers(t.Context(), e.clk.Now().Add(time.Hour), e.clk.Now().Add(time.Hour), 10); err != nil || len(due) != 0 {
			t.Errorf("timers left after the burst: %d, err %v", len(due), err)
		}
	})
}

// TestTimersFireWhileHTTPSlotsBusy: with every processing slot held by an
// HTTP attempt in flight, a wake-up still fires: timers need no slot. (A
// guard: the dispatcher used to fire timers itself and had to keep this
// true; the timer loop makes it true by construction.)
func TestTimersFireWhileHTTPSlotsBusy(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		release := make(chan struct{})
		arrived := make(chan struct{}, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case arrived <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		defer srv.Close()
		defer close(release)
		rt := runtime.New(runtime.Config{
			Store: e.st, Clock: e.clk, PublicURL: "http://ferry.test", Concurrency: 1,
			HTTP:   httpstep.New(http.DefaultTransport),
			Logger: slog.New(slog.DiscardHandler),
		})
		t.Cleanup(rt.Close)
		e.workflow(t, `{"name": "slow", "tasks": {"call": {"url": "`+srv.URL+`", "timeout": "1h"}}}`)
		e.workflow(t, `{"name": "nap", "tasks": {"nap": {"sleep": "1s"}}}`)
		startRuntime(t, rt)
		if _, _, err := rt.Trigger(t.Context(), runtime.TriggerRequest{Workflow: "slow"}); err != nil {
			t.Fatalf("Trigger slow: %v", err)
		}
		select {
		case <-arrived: // the only slot is now busy
		case <-time.After(30 * time.Second):
			t.Fatal("the HTTP step never started")
		}
		r, _, err := rt.Trigger(t.Context(), runtime.TriggerRequest{Workflow: "nap"})
		must(t, err, "Trigger nap")
		e.clk.Advance(time.Second)
		rt.Nudge()
		waitRuns(t, e.st, []string{r.ID})
	})
}
