package ferry_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/testwait"
)

// TestCloseTwice: a second Engine.Close (an explicit Close beside a
// deferred one) does nothing and returns the first's error. (It panicked
// on SQLite.)
func TestCloseTwice(t *testing.T) {
	e, err := ferry.Open(context.Background(), ferry.Config{Database: "sqlite:" + filepath.Join(t.TempDir(), "f.db"), Migrate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestCloseStopsRun: Close while Run runs (a Run whose context never
// ends) stops it, as its context's end would, and returns once it has
// returned, before the database closes; a Run called after Close returns
// ErrClosed at once. (Run went on against the closed database until its
// context ended, forever with context.Background(), logging failed
// claims and timer reads every SafetyTick; a Run after Close did the
// same.)
func TestCloseStopsRun(t *testing.T) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			dsn := "sqlite:" + filepath.Join(t.TempDir(), "f.db")
			if db == "postgres" {
				dsn = pgtest.DSN(t)
			}
			var logs syncBuffer
			ctx := context.Background()
			e, err := ferry.Open(ctx, ferry.Config{Database: dsn, Migrate: true, SafetyTick: 10 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if _, _, err := e.ApplyWorkflow(ctx, []byte(`{"name": "w", "tasks": {"nap": {"sleep": "1ms"}, "job": {"needs": ["nap"], "task": {"type": "close.job.v1"}}}}`)); err != nil {
				t.Fatal(err)
			}
			if _, err := e.Trigger(ctx, "w", nil, ""); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- e.Run(ctx) }()
			// The sleep's timer fires only while Run runs: its task is
			// there once Run does.
			testwait.Until(t, 10*time.Second, "Run to fire the sleep", func() bool {
				got, err := e.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"close.job.v1"}})
				return err == nil && len(got) == 1
			})
			if err := e.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run stopped by Close: %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run still running 10s after Close returned")
			}
			if err := e.Run(ctx); !errors.Is(err, ferry.ErrClosed) {
				t.Errorf("Run after Close: %v, want ErrClosed", err)
			}
			if l := logs.String(); l != "" {
				t.Errorf("logged at warn or above around Close:\n%s", l)
			}
		})
	}
}

// TestMethodsAfterCloseReturnErrClosed: every method that reads or writes
// returns ErrClosed once the engine is closed. (They failed with what the
// closed database said, "sql: database is closed" and the like, which a
// caller could not tell apart from a database fault.)
func TestMethodsAfterCloseReturnErrClosed(t *testing.T) {
	e, err := ferry.Open(context.Background(), ferry.Config{Database: "sqlite:" + filepath.Join(t.TempDir(), "f.db"), Migrate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, _, err := e.ApplyWorkflow(ctx, []byte(`{"name":"w","tasks":{"a":{"sleep":"1h"}}}`)); err != nil {
		t.Fatal(err)
	}
	k, _, err := e.CreateTask(ctx, client.NewTask{Type: "c.x.v1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"EnsureAPIKey": func() error { _, err := e.EnsureAPIKey(ctx, "k"); return err },
		"ApplyWorkflow": func() error {
			_, _, err := e.ApplyWorkflow(ctx, []byte(`{"name":"w","tasks":{"a":{"sleep":"1h"}}}`))
			return err
		},
		"Trigger":      func() error { _, err := e.Trigger(ctx, "w", nil, ""); return err },
		"TriggerBatch": func() error { _, err := e.TriggerBatch(ctx, "w", []ferry.TriggerInput{{}}); return err },
		"CreateTask":   func() error { _, _, err := e.CreateTask(ctx, client.NewTask{Type: "c.x.v1"}); return err },
		"GetTask":      func() error { _, err := e.GetTask(ctx, k.ID); return err },
		"CancelTask":   func() error { _, err := e.CancelTask(ctx, k.ID); return err },
		"ClaimTasks": func() error {
			_, err := e.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"c.%"}, WorkerID: "w", Lease: time.Minute, Max: 1})
			return err
		},
		"Heartbeat":    func() error { _, err := e.Heartbeat(ctx, k.ID, "t", time.Minute); return err },
		"CompleteTask": func() error { return e.CompleteTask(ctx, k.ID, "t", nil) },
		"CompleteTaskAndClaim": func() error {
			_, err := e.CompleteTaskAndClaim(ctx, k.ID, "t", nil, client.ClaimRequest{Types: []string{"c.%"}, WorkerID: "w", Lease: time.Minute, Max: 1})
			return err
		},
		"FailTask": func() error { return e.FailTask(ctx, k.ID, "t", "x", false) },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, ferry.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}
