package sqlite_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/sqlite"
)

// TestGroupCommitIsolatesFailures sends many concurrent write requests that
// the single writer groups into shared transactions: the ones that fail roll
// back alone (their savepoint), the others are all committed.
func TestGroupCommitIsolatesFailures(t *testing.T) {
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	wf, err := s.CreateWorkflow(ctx, &store.Workflow{Name: "g", Definition: json.RawMessage(`{}`), Fingerprint: "f", Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0).UTC()
	const n = 64
	ids := make([]string, n)
	for i := range ids {
		r, _, err := s.CreateRun(ctx, &store.NewRun{
			Run:   store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), StartedAt: now, ExpiresAt: now.Add(time.Hour)},
			Steps: []*store.StepRun{{Name: "a", Type: "sleep", Status: status.StepPending}},
		}, now)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = r.ID
	}
	boom := errors.New("boom")
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range ids {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = s.InRun(ctx, ids[i], now, func(tx store.RunTx) error {
				st := tx.Step("a")
				st.Status, st.Error = status.StepSuccess, fmt.Sprint(i)
				if err := tx.UpdateStep(st); err != nil {
					return err
				}
				if err := tx.Append(store.NewEvent{Type: "touched"}); err != nil {
					return err
				}
				if i%3 == 0 {
					return boom
				}
				return nil
			})
		}(i)
	}
	wg.Wait()
	for i, id := range ids {
		_, steps, err := s.GetRun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := s.ListEvents(ctx, id, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			if !errors.Is(errs[i], boom) {
				t.Errorf("request %d: err %v, want boom", i, errs[i])
			}
			if steps[0].Status != status.StepPending || len(evs) != 0 {
				t.Errorf("failed request %d left writes: step %s, %d events", i, steps[0].Status, len(evs))
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("request %d: %v", i, errs[i])
		}
		if steps[0].Status != status.StepSuccess || steps[0].Error != fmt.Sprint(i) || len(evs) != 1 {
			t.Errorf("request %d not committed: step %s %q, %d events", i, steps[0].Status, steps[0].Error, len(evs))
		}
	}
}

// TestGroupCommitSkipsCancelledRequests: a request whose context ended
// before the writer reached it is not applied.
func TestGroupCommitSkipsCancelledRequests(t *testing.T) {
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, _, err = s.CreateTask(ctx, &store.Task{Type: "x.y.v1", Payload: json.RawMessage(`{}`), RunAt: time.Now()}, time.Now())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	got, err := s.ClaimTasks(t.Context(), store.ClaimTasks{Patterns: []string{"x.%"}, WorkerID: "w", Lease: time.Minute, Max: 10, Now: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Errorf("a cancelled request was applied: %d tasks", len(got))
	}
}

// TestCloseAnswersEveryWriter: writers racing Close all get an answer
// (their write, or "store closed"); none waits forever.
func TestCloseAnswersEveryWriter(t *testing.T) {
	for round := range 20 {
		s, err := sqlite.Open(filepath.Join(t.TempDir(), fmt.Sprintf("c%d.db", round)))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for {
					if _, _, err := s.CreateTask(context.Background(), &store.Task{Type: "x.y.v1", Payload: json.RawMessage(`{}`), RunAt: time.Now()}, time.Now()); err != nil {
						return
					}
				}
			})
		}
		s.Close()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: a writer was never answered after Close", round)
		}
	}
}
