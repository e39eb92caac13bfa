package postgres_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// oneStepRun creates a workflow and a run of one pending task step "a".
func oneStepRun(t *testing.T, s store.Store, name string) (*store.Workflow, *store.Run) {
	t.Helper()
	wf, err := s.CreateWorkflow(t.Context(), &store.Workflow{Name: name, Definition: json.RawMessage(`{}`), Fingerprint: "f", Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r, _, err := s.CreateRun(t.Context(), &store.NewRun{
		Run:   store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), StartedAt: now, ExpiresAt: now.Add(time.Hour)},
		Steps: []*store.StepRun{{Name: "a", Type: "task", Status: status.StepPending}},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	return wf, r
}

// TestVersionCacheFollowsOtherNodes: a node reuses the steps it read while
// the run's row is unchanged, and reads them again once another node (a
// second store on the same schema) wrote the run.
func TestVersionCacheFollowsOtherNodes(t *testing.T) {
	dsn := pgtest.DSN(t)
	a := openDSN(t, dsn)
	ctx := t.Context()
	if err := a.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b := openDSN(t, dsn)
	_, r := oneStepRun(t, a, "v")
	inc := func(s store.Store, by int) {
		t.Helper()
		if err := s.InRun(ctx, r.ID, time.Now(), func(tx store.RunTx) error {
			st := *tx.Step("a")
			st.Attempt += by
			return tx.UpdateStep(&st)
		}); err != nil {
			t.Fatal(err)
		}
	}
	read := func(s store.Store) int {
		t.Helper()
		var n int
		if err := s.InRun(ctx, r.ID, time.Now(), func(tx store.RunTx) error {
			n = tx.Step("a").Attempt
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	inc(a, 1) // a read the run from the tables and cached what it wrote
	if got := read(a); got != 1 {
		t.Fatalf("attempt = %d, want 1", got)
	}
	if a.RunCacheHits() == 0 {
		t.Fatal("the unchanged run was read again, not taken from the cache")
	}
	inc(b, 10) // another node writes the run
	hits := a.RunCacheHits()
	if got := read(a); got != 11 {
		t.Errorf("attempt = %d after the other node's write, want 11", got)
	}
	if a.RunCacheHits() != hits {
		t.Error("a stale cache entry was used after another node wrote the run")
	}
	inc(a, 1)
	if got := read(b); got != 12 {
		t.Errorf("the other node reads attempt %d, want 12", got)
	}
}

// TestVersionCacheReadsTheRunRow: a cached run's steps are reused, but the
// run itself is what was just read (a rename does not change the run's
// row version), and an empty body reads back as the table has it.
func TestVersionCacheReadsTheRunRow(t *testing.T) {
	s := open(t)
	ctx := t.Context()
	wf, r := oneStepRun(t, s, "before")
	now := time.Now()
	if err := s.InRun(ctx, r.ID, now, func(tx store.RunTx) error {
		st := tx.Step("a")
		st.Body = []byte{} // an empty response body
		return tx.UpdateStep(st)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateWorkflow(ctx, wf.ID, &store.Workflow{Name: "after", Definition: json.RawMessage(`{}`), Fingerprint: "f", Enabled: true}); err != nil {
		t.Fatal(err)
	}
	hits := s.RunCacheHits()
	var name string
	var bodyNil bool
	if err := s.InRun(ctx, r.ID, now, func(tx store.RunTx) error {
		name, bodyNil = tx.Run().WorkflowName, tx.Step("a").Body == nil
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if s.RunCacheHits() == hits {
		t.Fatal("the unchanged run was not taken from the cache")
	}
	if name != "after" {
		t.Errorf("workflow name %q after the rename, want after", name)
	}
	_, steps, err := s.GetRun(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if tableNil := steps[0].Body == nil; bodyNil != tableNil {
		t.Errorf("empty body: nil from the cache %v, from the table %v", bodyNil, tableNil)
	}
}

// TestVersionCacheKeepsCreatedRuns: a run created from a checked workflow
// has its steps cached at the creating transaction's version, so its
// first write reads no steps; what the cache gives equals the tables
// (headers, a step's token and wake time, times to the microsecond).
func TestVersionCacheKeepsCreatedRuns(t *testing.T) {
	t.Setenv("FERRY_RUNCACHE_CHECK", "1") // every hit is checked against the tables
	s := open(t)
	ctx := t.Context()
	wf, err := s.CreateWorkflow(ctx, &store.Workflow{Name: "c", Definition: json.RawMessage(`{}`), Fingerprint: "f", Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 24, 15, 4, 5, 123456789, time.FixedZone("x", 3600))
	wake := now.Add(time.Second)
	res, err := s.CreateRuns(ctx, []*store.NewRun{{
		Workflow: wf,
		Run: store.Run{WorkflowID: wf.ID, Version: wf.Version, Status: status.RunRunning, Input: json.RawMessage(`{"n": 1}`),
			TriggerHeaders: map[string]string{"X-A": "b"}, StartedAt: now, ExpiresAt: now.Add(time.Hour)},
		Steps: []*store.StepRun{
			{Name: "b", Position: 1, Type: "webhook", Status: status.StepWaiting, CallbackToken: "wh_t", WakeAt: &wake, StartedAt: &now},
			{Name: "a", Position: 0, Type: "task", Status: status.StepRunning, Attempt: 1, StartedAt: &now},
		},
		Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_started", Step: "a"}},
	}}, now)
	if err != nil || res[0].Err != nil {
		t.Fatal(err, res[0].Err)
	}
	before := s.RunCacheHits()
	var steps []store.StepRun
	if err := s.InRun(ctx, res[0].Run.ID, time.Now(), func(tx store.RunTx) error {
		for _, st := range tx.Steps() {
			steps = append(steps, *st)
		}
		return nil
	}); err != nil {
		t.Fatal(err) // with the check on, a hit that differs from the tables fails here
	}
	if got := s.RunCacheHits() - before; got != 1 {
		t.Errorf("cache hits for the created run's first transaction = %d, want 1", got)
	}
	if len(steps) != 2 || steps[0].Name != "a" || steps[1].CallbackToken != "wh_t" || steps[1].WakeAt == nil {
		t.Errorf("steps from the cache = %+v", steps)
	}
}
