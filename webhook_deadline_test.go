package ferry_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// waiting is an engine on a fake clock that does not run (no timer
// fires), with one run of a workflow of wait steps started.
type waiting struct {
	eng    *ferry.Engine
	clk    *clock.Fake
	run    string
	tokens map[string]string // step -> callback token
}

func startWaiting(t *testing.T, db, def string) *waiting {
	t.Helper()
	ctx := context.Background()
	w := &waiting{clk: clock.NewFake(time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC)), tokens: map[string]string{}}
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "f.db")
	if db == "postgres" {
		dsn = pgtest.DSN(t)
	}
	eng, err := ferry.Open(ctx, ferry.Config{Database: dsn, Migrate: true, Clock: w.clk, PublicURL: "http://127.0.0.1:1", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	w.eng = eng
	if _, _, err := eng.ApplyWorkflow(ctx, []byte(def)); err != nil {
		t.Fatal(err)
	}
	if w.run, err = eng.Trigger(ctx, "w", []byte(`{}`), ""); err != nil {
		t.Fatal(err)
	}
	_, steps, err := eng.Store().GetRun(ctx, w.run)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		w.tokens[s.Name] = s.CallbackToken
	}
	return w
}

// call delivers a callback to step's token: the status and error code.
func (w *waiting) call(step string) (int, string) {
	rec := httptest.NewRecorder()
	w.eng.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/wh/"+w.tokens[step], strings.NewReader(`{"status": "paid"}`)))
	var body struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	return rec.Code, body.Error.Code
}

// TestCallbackAfterItsDeadlineIsRefused: a callback that comes after its
// wait step's timeout, or after its run's max_duration, is refused (409)
// even when the timer that applies the deadline has not fired yet (here
// the engine does not run its timer loop at all; in production a backlog
// or a restart after downtime), and it changes nothing. (Found by an
// audit: such a callback was accepted and completed the run.)
func TestCallbackAfterItsDeadlineIsRefused(t *testing.T) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			// One wait with a timeout of its own, one that waits for the
			// run's max_duration.
			w := startWaiting(t, db, `{"name": "w", "max_duration": "2h", "tasks": {
				"pay": {"wait_for_webhook": {"timeout": "1h"}},
				"ship": {"wait_for_webhook": {}}}}`)
			unchanged := func(when string) {
				t.Helper()
				run, steps, err := w.eng.Store().GetRun(context.Background(), w.run)
				if err != nil {
					t.Fatal(err)
				}
				if run.Status != status.RunRunning {
					t.Errorf("%s: run %s, want running (no timer has fired)", when, run.Status)
				}
				for _, s := range steps {
					if s.Status != status.StepWaiting || s.Body != nil {
						t.Errorf("%s: step %s %s with body %s, want waiting with none", when, s.Name, s.Status, s.Body)
					}
				}
			}

			w.clk.Advance(90 * time.Minute) // past pay's timeout, within max_duration
			if code, ec := w.call("pay"); code != http.StatusConflict || ec != "step_finished" {
				t.Errorf("callback after the step's timeout: %d %s, want 409 step_finished", code, ec)
			}
			unchanged("after the refused late callback")

			w.clk.Advance(time.Hour) // past max_duration
			if code, ec := w.call("ship"); code != http.StatusConflict || ec != "step_finished" {
				t.Errorf("callback after the run's max_duration: %d %s, want 409 step_finished (as once the expiry cancels the step)", code, ec)
			}
			// The caller holds a token, not the API key: the answer names
			// the step, not the run.
			rec := httptest.NewRecorder()
			w.eng.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/wh/"+w.tokens["ship"], strings.NewReader(`{}`)))
			if strings.Contains(rec.Body.String(), w.run) {
				t.Errorf("the webhook's answer names the run: %s", rec.Body)
			}
			unchanged("after the refused callback past max_duration")
		})
	}
}

// TestCallbackJustBeforeItsDeadlineIsTaken: the deadline is the instant
// the timer is due; a callback before it is accepted.
func TestCallbackJustBeforeItsDeadlineIsTaken(t *testing.T) {
	w := startWaiting(t, "sqlite", `{"name": "w", "tasks": {"pay": {"wait_for_webhook": {"timeout": "1h"}}}}`)
	w.clk.Advance(time.Hour - time.Millisecond)
	if code, ec := w.call("pay"); code != http.StatusAccepted {
		t.Fatalf("callback 1 ms before the timeout: %d %s, want 202", code, ec)
	}
	run, _, err := w.eng.Store().GetRun(context.Background(), w.run)
	if err != nil || run.Status != status.RunCompleted {
		t.Fatalf("run %v %v, want completed", run, err)
	}
}
