package sqlite_test

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/sqlite"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

// openMigrated opens a migrated store at path, closed when the test ends.
func openMigrated(t *testing.T, path string) *sqlstore.Store {
	t.Helper()
	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// cacheStore opens a migrated store at path with one workflow and one run
// of one pending step "a".
func cacheStore(t *testing.T, path string) (*sqlstore.Store, string) {
	t.Helper()
	s := openMigrated(t, path)
	ctx := t.Context()
	wf, err := s.CreateWorkflow(ctx, &store.Workflow{Name: "c", Definition: json.RawMessage(`{}`), Fingerprint: "f", Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r, _, err := s.CreateRun(ctx, &store.NewRun{
		Run:   store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), StartedAt: now, ExpiresAt: now.Add(time.Hour)},
		Steps: []*store.StepRun{{Name: "a", Type: "task", Status: status.StepPending}},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	return s, r.ID
}

// bump adds one to step a's attempt (a copy is written, as callers may).
func bump(tx store.RunTx) error {
	st := *tx.Step("a")
	st.Attempt++
	st.Body = []byte(`{"n":1}`)
	return tx.UpdateStep(&st)
}

func attemptOf(t *testing.T, s store.Store, runID string) int {
	t.Helper()
	_, steps, err := s.GetRun(t.Context(), runID)
	if err != nil {
		t.Fatal(err)
	}
	return steps[0].Attempt
}

// TestRunCacheServesTheWritersOwnRuns: a run the writer just wrote is not
// read again, and what it hands out is what the tables hold.
func TestRunCacheServesTheWritersOwnRuns(t *testing.T) {
	s, id := cacheStore(t, filepath.Join(t.TempDir(), "c.db"))
	ctx := t.Context()
	for range 3 {
		if err := s.InRun(ctx, id, time.Now(), bump); err != nil {
			t.Fatal(err)
		}
	}
	// The first call read the run; the next two found it cached.
	if got := s.RunCacheHits(); got != 2 {
		t.Errorf("cache hits = %d, want 2", got)
	}
	if got := attemptOf(t, s, id); got != 3 {
		t.Errorf("attempt = %d, want 3", got)
	}
	if err := s.VerifyRunCache(ctx); err != nil {
		t.Error(err)
	}
}

// TestRunCacheDropsFailedRequests: concurrent requests on one run share
// groups; those that fail after changing the run in memory leave no trace
// in what later requests read.
func TestRunCacheDropsFailedRequests(t *testing.T) {
	s, id := cacheStore(t, filepath.Join(t.TempDir(), "c.db"))
	ctx := t.Context()
	boom := errors.New("boom")
	const n = 90
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = s.InRun(ctx, id, time.Now(), func(tx store.RunTx) error {
				if err := bump(tx); err != nil {
					return err
				}
				if i%3 == 0 {
					return boom
				}
				return tx.Append(store.NewEvent{Type: "bumped"})
			})
		})
	}
	wg.Wait()
	ok := 0
	for i, err := range errs {
		switch {
		case i%3 == 0 && !errors.Is(err, boom):
			t.Errorf("request %d: err %v, want boom", i, err)
		case i%3 != 0 && err != nil:
			t.Errorf("request %d: %v", i, err)
		case err == nil:
			ok++
		}
	}
	if got := attemptOf(t, s, id); got != ok {
		t.Errorf("attempt = %d after %d successful increments", got, ok)
	}
	if s.RunCacheHits() == 0 {
		t.Error("the cache was never used")
	}
	if err := s.VerifyRunCache(ctx); err != nil {
		t.Error(err)
	}
}

// TestRunCacheSeesOtherWriters: a commit by another connection to the same
// file (another process) empties the cache, so its change is not lost.
func TestRunCacheSeesOtherWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.db")
	s, id := cacheStore(t, path)
	ctx := t.Context()
	if err := s.InRun(ctx, id, time.Now(), bump); err != nil { // cached now
		t.Fatal(err)
	}
	other, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.InRun(ctx, id, time.Now(), func(tx store.RunTx) error {
		st := tx.Step("a")
		st.Attempt = 40
		return tx.UpdateStep(st)
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.InRun(ctx, id, time.Now(), bump); err != nil {
		t.Fatal(err)
	}
	if got := attemptOf(t, s, id); got != 41 {
		t.Errorf("attempt = %d, want 41 (the other writer's 40, plus one)", got)
	}
	if err := s.VerifyRunCache(ctx); err != nil {
		t.Error(err)
	}
}

// TestRunCacheKeepsOnlyWhatWasWritten: the cache holds the tables' state,
// not the request's memory: changes never written, partial step copies,
// empty bodies and a renamed workflow all read back as from the table.
func TestRunCacheKeepsOnlyWhatWasWritten(t *testing.T) {
	s, id := cacheStore(t, filepath.Join(t.TempDir(), "c.db"))
	ctx := t.Context()
	steps := []func(tx store.RunTx) error{
		bump, // cached from here on
		func(tx store.RunTx) error { // changed in memory, never written
			tx.Step("a").Attempt = 70
			tx.Run().Error = "not written"
			return nil
		},
		func(tx store.RunTx) error { // a partial copy of the step
			return tx.UpdateStep(&store.StepRun{Name: "a", Status: status.StepRunning, Attempt: 5})
		},
		func(tx store.RunTx) error { // empty body and request
			st := tx.Step("a")
			st.Body, st.Request = []byte{}, json.RawMessage{}
			return tx.UpdateStep(st)
		},
	}
	for i, fn := range steps {
		if err := s.InRun(ctx, id, time.Now(), fn); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if err := s.VerifyRunCache(ctx); err != nil {
			t.Fatalf("after request %d: %v", i, err)
		}
	}
	run, _, err := s.GetRun(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateWorkflow(ctx, run.WorkflowID, &store.Workflow{Name: "renamed", Definition: json.RawMessage(`{}`), Fingerprint: "f", Enabled: true}); err != nil {
		t.Fatal(err)
	}
	var name, typ string
	var attempt int
	if err := s.InRun(ctx, id, time.Now(), func(tx store.RunTx) error {
		name, typ, attempt = tx.Run().WorkflowName, tx.Step("a").Type, tx.Step("a").Attempt
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if name != "renamed" || typ != "task" || attempt != 5 {
		t.Errorf("read back workflow %q, step type %q, attempt %d; want renamed, task, 5", name, typ, attempt)
	}
	if err := s.VerifyRunCache(ctx); err != nil {
		t.Error(err)
	}
}

// TestRunCacheKeepsCreatedRuns: a run created from a checked workflow is
// cached as the tables return it (headers, a step's token and wake time,
// times in UTC to the microsecond), so its first write reads nothing.
func TestRunCacheKeepsCreatedRuns(t *testing.T) {
	s, _ := cacheStore(t, filepath.Join(t.TempDir(), "c.db"))
	ctx := t.Context()
	wf, err := s.GetWorkflow(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 24, 15, 4, 5, 123456789, time.FixedZone("x", 3600))
	wake := now.Add(time.Second)
	r, _, err := s.CreateRun(ctx, &store.NewRun{
		Workflow: wf,
		Run: store.Run{WorkflowID: wf.ID, Version: wf.Version, Status: status.RunRunning, Input: json.RawMessage(`{"n": 1}`),
			TriggerHeaders: map[string]string{"X-A": "b"}, IdempotencyKey: "k", StartedAt: now, ExpiresAt: now.Add(time.Hour)},
		Steps: []*store.StepRun{
			{Name: "b", Position: 1, Type: "webhook", Status: status.StepWaiting, CallbackToken: "wh_t", WakeAt: &wake, StartedAt: &now},
			{Name: "a", Position: 0, Type: "task", Status: status.StepRunning, Attempt: 1, StartedAt: &now},
		},
		Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_started", Step: "a"}},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	// A terminal run is not kept: nothing more happens to it.
	done, _, err := s.CreateRun(ctx, &store.NewRun{
		Workflow: wf,
		Run:      store.Run{WorkflowID: wf.ID, Version: wf.Version, Status: status.RunCompleted, Input: json.RawMessage(`{}`), StartedAt: now, FinishedAt: &now, ExpiresAt: now.Add(time.Hour)},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.VerifyRunCache(ctx); err != nil {
		t.Fatal(err)
	}
	before := s.RunCacheHits()
	if err := s.InRun(ctx, r.ID, time.Now(), bump); err != nil {
		t.Fatal(err)
	}
	if got := s.RunCacheHits() - before; got != 1 {
		t.Errorf("cache hits for the created run's first write = %d, want 1", got)
	}
	if err := s.InRun(ctx, done.ID, time.Now(), func(store.RunTx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := s.RunCacheHits() - before; got != 1 {
		t.Errorf("cache hits after reading the finished run = %d, want still 1", got)
	}
	if err := s.VerifyRunCache(ctx); err != nil {
		t.Error(err)
	}
}

// taskStore opens a migrated store at path with a standalone task that
// the store has leased (claimed): its writer holds it cached.
func taskStore(t *testing.T, path string) (*sqlstore.Store, *store.Task) {
	t.Helper()
	s := openMigrated(t, path)
	ctx := t.Context()
	now := time.Now()
	if _, _, err := s.CreateTask(ctx, &store.Task{Type: "tc.x.v1", Payload: json.RawMessage(`{"n":1}`), Status: status.TaskPending, Priority: 100, RunAt: now}, now); err != nil {
		t.Fatal(err)
	}
	ks, err := s.ClaimTasks(ctx, store.ClaimTasks{Patterns: []string{"tc.x.v1"}, WorkerID: "w", Lease: time.Minute, Max: 1, Now: now})
	if err != nil || len(ks) != 1 {
		t.Fatalf("claim: %v (%d tasks)", err, len(ks))
	}
	return s, ks[0]
}

// extend writes k's lease a minute longer and a heartbeat event, as a
// worker's heartbeat does.
func extend(tx store.TaskTx) error {
	k := *tx.Task()
	until := k.LeaseUntil.Add(time.Minute)
	k.LeaseUntil = &until
	if err := tx.UpdateTask(&k); err != nil {
		return err
	}
	return tx.AppendTask(store.NewEvent{Type: "heartbeat"})
}

// TestTaskCacheServesTheWritersOwnTasks: a task the writer leased or last
// wrote leased is not read again by its next transaction, and what the
// cache hands out is what the table holds; a finished task leaves it.
func TestTaskCacheServesTheWritersOwnTasks(t *testing.T) {
	s, k := taskStore(t, filepath.Join(t.TempDir(), "t.db"))
	ctx := t.Context()
	for range 2 {
		if err := s.InTask(ctx, k.ID, time.Now(), extend); err != nil {
			t.Fatal(err)
		}
		if err := s.VerifyRunCache(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.TaskCacheHits(); got != 2 {
		t.Errorf("task cache hits = %d, want 2 (the claim cached it)", got)
	}
	if err := s.InTask(ctx, k.ID, time.Now(), func(tx store.TaskTx) error {
		k := *tx.Task()
		k.Status = status.TaskSucceeded
		return tx.UpdateTask(&k)
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.InTask(ctx, k.ID, time.Now(), func(tx store.TaskTx) error {
		if got := tx.Task().Status; got != status.TaskSucceeded {
			t.Errorf("task read as %s after it succeeded", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := s.TaskCacheHits(); got != 3 {
		t.Errorf("task cache hits = %d, want 3: a finished task is read from the table", got)
	}
	if got, err := s.GetTask(ctx, k.ID); err != nil || len(got.LeaseToken) == 0 || got.Status != status.TaskSucceeded {
		t.Errorf("task = %+v, %v; want succeeded", got, err)
	}
}

// TestTaskCacheSeesOtherWriters: a commit by another connection to the
// file empties the cache, so a task another process changed is read again.
func TestTaskCacheSeesOtherWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.db")
	s, k := taskStore(t, path)
	ctx := t.Context()
	other, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.InTask(ctx, k.ID, time.Now(), func(tx store.TaskTx) error {
		k := *tx.Task()
		k.LeaseToken = "taken-elsewhere"
		return tx.UpdateTask(&k)
	}); err != nil {
		t.Fatal(err)
	}
	var token string
	if err := s.InTask(ctx, k.ID, time.Now(), func(tx store.TaskTx) error {
		token = tx.Task().LeaseToken
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if token != "taken-elsewhere" {
		t.Errorf("lease token %q, want the other writer's", token)
	}
	if err := s.VerifyRunCache(ctx); err != nil {
		t.Error(err)
	}
}
