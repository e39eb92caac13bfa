package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

// spied returns a context under which every pipeline's statements are
// recorded, and what was recorded so far (one []string per pipeline).
func spied(ctx context.Context) (context.Context, func() [][]string) {
	var mu sync.Mutex
	var got [][]string
	ctx = context.WithValue(ctx, spyKey{}, func(qs []sqlstore.PipeQuery) {
		var p []string
		for _, q := range qs {
			p = append(p, q.SQL)
		}
		mu.Lock()
		got = append(got, p)
		mu.Unlock()
	})
	return ctx, func() [][]string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// TestPipelinesPlanKeyedStatementsOnce: a pipelined transaction switches to
// generic, index-only plans before its key lookups and writes (a report
// batch and a single-run transaction right after BEGIN), but a claim only
// after its ordered walks, which need plans made for their limit and
// filter. The writes run under those settings, and the settings end with
// the transaction: the same connection plans as before afterwards.
func TestPipelinesPlanKeyedStatementsOnce(t *testing.T) {
	dsn := pgtest.DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("ferry_max_conns", "2") // one writer connection
	u.RawQuery = q.Encode()
	ctx := t.Context()
	s, err := Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Each write to runs records the planner settings it ran under.
	for _, q := range []string{
		`CREATE TABLE plan_log (mode TEXT, seqscan TEXT)`,
		`CREATE FUNCTION log_plan() RETURNS trigger AS $$ BEGIN INSERT INTO plan_log VALUES (current_setting('plan_cache_mode'), current_setting('enable_seqscan')); RETURN NULL; END $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER log_plan AFTER UPDATE ON runs FOR EACH STATEMENT EXECUTE FUNCTION log_plan()`,
	} {
		if _, err := s.ReadDB().ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	wf, err := s.CreateWorkflow(ctx, &store.Workflow{Name: "plans", Fingerprint: "f", Definition: json.RawMessage(`{}`), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	run, _, err := s.CreateRun(ctx, &store.NewRun{
		Run:   store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour), StartedAt: now},
		Steps: []*store.StepRun{{Name: "a", Type: "task", Status: status.StepRunning}},
		Tasks: []*store.Task{{Type: "plans.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: "a"}},
	}, now)
	if err != nil {
		t.Fatal(err)
	}

	sctx, recorded := spied(ctx)
	claimed, err := s.ClaimTasks(sctx, store.ClaimTasks{Patterns: []string{"plans.x.v1"}, WorkerID: "w", Lease: time.Minute, Max: 1, Now: now})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v (%d tasks)", err, len(claimed))
	}
	claim := recorded()
	if len(claim) != 2 || claim[0][0] != "BEGIN" || slices.Contains(claim[0], genericPlans) || claim[1][0] != genericPlans {
		t.Fatalf("claim pipelines = %q; want the walks before %q, which opens the second", claim, genericPlans)
	}

	sctx, recorded = spied(ctx)
	errs, err := s.InTasks(sctx, []string{claimed[0].ID}, map[string]string{claimed[0].ID: run.ID}, now, func(_ int, tx store.TaskTx) error {
		k := *tx.Task()
		k.Status = status.TaskSucceeded
		if err := tx.UpdateTask(&k); err != nil {
			return err
		}
		return tx.Run().Append(store.NewEvent{Type: "noted"})
	})
	if err == nil {
		err = errs[0]
	}
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	if err := s.InRun(sctx, run.ID, now, func(tx store.RunTx) error {
		r := *tx.Run()
		r.Status = status.RunCompleted
		return tx.UpdateRun(&r)
	}); err != nil {
		t.Fatalf("InRun: %v", err)
	}
	pipes := recorded()
	if len(pipes) != 4 {
		t.Fatalf("a report and an InRun sent %d pipelines, want two each: %q", len(pipes), pipes)
	}
	for i, p := range pipes {
		if i%2 == 0 && (len(p) < 2 || p[0] != "BEGIN" || p[1] != genericPlans) {
			t.Fatalf("pipeline %d = %q; want BEGIN, then %q", i, p, genericPlans)
		}
	}

	rows, err := s.ReadDB().QueryContext(ctx, `SELECT mode, seqscan FROM plan_log`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var mode, seqscan string
		if err := rows.Scan(&mode, &seqscan); err != nil {
			t.Fatal(err)
		}
		if mode != "force_generic_plan" || seqscan != "off" {
			t.Errorf("a write to runs ran with plan_cache_mode %s, enable_seqscan %s; want force_generic_plan, off", mode, seqscan)
		}
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("%d writes to runs logged, want the report's and InRun's", n)
	}
	var mode, seqscan string
	if err := s.DB().QueryRowContext(ctx, `SELECT current_setting('plan_cache_mode'), current_setting('enable_seqscan')`).Scan(&mode, &seqscan); err != nil {
		t.Fatal(err)
	}
	if mode != "auto" || seqscan != "on" {
		t.Fatalf("after the transactions the writer connection has plan_cache_mode %s, enable_seqscan %s; want auto, on", mode, seqscan)
	}
}

// TestCreateRunsInOneRoundTrip: new runs whose workflows are as they were
// made from are written in one pipeline, a check ahead of the write taking
// the workflows' shared locks. A batch with a run whose workflow changed
// since (disabled, renamed, at another version, deleted) fails that check,
// which leaves nothing written; the locking way then refuses that run
// (ErrWorkflowChanged) and writes the others. So does a batch whose runs
// name one workflow at two versions, without trying the one pipeline.
func TestCreateRunsInOneRoundTrip(t *testing.T) {
	s, wf := withWorkflow(t, pgtest.DSN(t), "once")
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	newRun := func(w *store.Workflow, version int) *store.NewRun {
		return &store.NewRun{Workflow: w,
			Run:   store.Run{WorkflowID: w.ID, Version: version, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour), StartedAt: now},
			Steps: []*store.StepRun{{Name: "a", Type: "task", Status: status.StepRunning, StartedAt: &now}},
			Tasks: []*store.Task{{Type: "once.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: "a"}}}
	}
	runsOf := func(w *store.Workflow) (n int) {
		t.Helper()
		if err := s.ReadDB().QueryRowContext(ctx, `SELECT COUNT(*) FROM runs WHERE workflow_id = $1`, w.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// create writes a batch of a run of wf and then other, and checks
	// what was written and how many pipelines it took.
	create := func(what string, other *store.NewRun, wantOther bool, wantPipes int) [][]string {
		t.Helper()
		before, otherBefore := runsOf(wf), runsOf(other.Workflow)
		sctx, recorded := spied(ctx)
		res, err := s.CreateRuns(sctx, []*store.NewRun{newRun(wf, wf.Version), other}, now)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !res[0].Created || res[1].Created != wantOther || (!wantOther && !errors.Is(res[1].Err, store.ErrWorkflowChanged)) {
			t.Fatalf("%s: CreateRuns = %+v; want the first created, the second created=%v", what, res, wantOther)
		}
		wantOtherRuns := otherBefore
		if wantOther {
			wantOtherRuns++
		}
		if other.Workflow.ID == wf.ID {
			wantOtherRuns++ // the first run counts there too
		}
		if got := runsOf(wf); other.Workflow.ID != wf.ID && got != before+1 {
			t.Errorf("%s: runs of the live workflow %d, want %d", what, got, before+1)
		}
		if got := runsOf(other.Workflow); got != wantOtherRuns {
			t.Errorf("%s: runs of the other workflow %d, want %d", what, got, wantOtherRuns)
		}
		pipes := recorded()
		if len(pipes) != wantPipes {
			t.Fatalf("%s sent %d pipelines, want %d: %q", what, len(pipes), wantPipes, pipes)
		}
		return pipes
	}
	workflow := func(name string) *store.Workflow {
		w, err := s.CreateWorkflow(ctx, &store.Workflow{Name: name, Fingerprint: "f", Definition: json.RawMessage(`{}`), Enabled: true})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}

	other := workflow("other")
	p := create("workflows as their runs carry them", newRun(other, other.Version), true, 1)[0]
	if len(p) != 5 || p[0] != "BEGIN" || p[1] != genericPlans || !strings.Contains(p[2], "FROM workflows") || !strings.Contains(p[2], "FOR SHARE") ||
		!strings.HasPrefix(p[3], "WITH w0 AS (INSERT INTO runs") || p[4] != "COMMIT" {
		t.Fatalf("creation pipeline = %q; want BEGIN, %q, the check locking the workflows, the write, COMMIT", p, genericPlans)
	}

	// The guarded pipeline, then the locking way's two.
	for _, c := range []struct{ what, change string }{
		{"a disabled workflow", `enabled = FALSE`},
		{"a renamed workflow", `name = name || '-renamed'`},
		{"a workflow at another version", `version = version + 1`},
		{"a deleted workflow", `deleted_at = 1`},
	} {
		w := workflow(strings.ReplaceAll(c.what, " ", "-"))
		if _, err := s.DB().ExecContext(ctx, `UPDATE workflows SET `+c.change+` WHERE id = $1`, w.ID); err != nil {
			t.Fatal(err)
		}
		create(c.what, newRun(w, w.Version), false, 3)
	}
	// Runs of one workflow at two versions: no guarded pipeline.
	create("a run at another version of the same workflow", newRun(wf, wf.Version+1), false, 2)
}
