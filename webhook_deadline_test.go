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
			ctx := context.Background()
			clk := clock.NewFake(time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC))
			dsn := "sqlite:" + filepath.Join(t.TempDir(), "f.db")
			if db == "postgres" {
				dsn = pgtest.DSN(t)
			}
			eng, err := ferry.Open(ctx, ferry.Config{Database: dsn, Migrate: true, Clock: clk, PublicURL: "http://127.0.0.1:1", Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { eng.Close() })
			// One wait with a timeout of its own, one that waits for the
			// run's max_duration.
			if _, _, err := eng.ApplyWorkflow(ctx, []byte(`{"name": "w", "max_duration": "2h", "tasks": {
				"pay": {"wait_for_webhook": {"timeout": "1h"}},
				"ship": {"wait_for_webhook": {}}}}`)); err != nil {
				t.Fatal(err)
			}
			id, err := eng.Trigger(ctx, "w", []byte(`{}`), "")
			if err != nil {
				t.Fatal(err)
			}
			_, steps, err := eng.Store().GetRun(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			tokens := map[string]string{}
			for _, s := range steps {
				tokens[s.Name] = s.CallbackToken
			}
			call := func(step string) (int, string) {
				rec := httptest.NewRecorder()
				eng.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/wh/"+tokens[step], strings.NewReader(`{"status": "paid"}`)))
				var body struct {
					Error struct{ Code string } `json:"error"`
				}
				_ = json.Unmarshal(rec.Body.Bytes(), &body)
				return rec.Code, body.Error.Code
			}
			unchanged := func(when string) {
				t.Helper()
				run, steps, err := eng.Store().GetRun(ctx, id)
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

			clk.Advance(90 * time.Minute) // past pay's timeout, within max_duration
			if code, ec := call("pay"); code != http.StatusConflict || ec != "step_finished" {
				t.Errorf("callback after the step's timeout: %d %s, want 409 step_finished", code, ec)
			}
			unchanged("after the refused late callback")

			clk.Advance(time.Hour) // past max_duration
			if code, ec := call("ship"); code != http.StatusConflict || ec != "step_finished" {
				t.Errorf("callback after the run's max_duration: %d %s, want 409 step_finished (as once the expiry cancels the step)", code, ec)
			}
			unchanged("after the refused callback past max_duration")
		})
	}
}

// TestCallbackJustBeforeItsDeadlineIsTaken: the deadline is the instant
// the timer is due; a callback before it is accepted.
func TestCallbackJustBeforeItsDeadlineIsTaken(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC))
	eng, err := ferry.Open(ctx, ferry.Config{Database: "sqlite:" + filepath.Join(t.TempDir(), "f.db"), Migrate: true, Clock: clk, PublicURL: "http://127.0.0.1:1", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	if _, _, err := eng.ApplyWorkflow(ctx, []byte(`{"name": "w", "tasks": {"pay": {"wait_for_webhook": {"timeout": "1h"}}}}`)); err != nil {
		t.Fatal(err)
	}
	id, err := eng.Trigger(ctx, "w", []byte(`{}`), "")
	if err != nil {
		t.Fatal(err)
	}
	_, steps, err := eng.Store().GetRun(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour - time.Millisecond)
	rec := httptest.NewRecorder()
	eng.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/wh/"+steps[0].CallbackToken, strings.NewReader(`{}`)))
	if rec.Code != http.StatusAccepted {
		t.Fatalf("callback 1 ms before the timeout: %d %s, want 202", rec.Code, rec.Body)
	}
	run, _, err := eng.Store().GetRun(ctx, id)
	if err != nil || run.Status != status.RunCompleted {
		t.Fatalf("run %v %v, want completed", run, err)
	}
}
