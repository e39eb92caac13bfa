package postgres

import (
	"encoding/json"
	"errors"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// withWorkflow opens a migrated store on dsn with a workflow of that name.
func withWorkflow(t *testing.T, dsn, name string) (*Store, *store.Workflow) {
	t.Helper()
	s := openNode(t, dsn)
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	wf, err := s.CreateWorkflow(t.Context(), &store.Workflow{Name: name, Fingerprint: "f", Definition: json.RawMessage(`{}`), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	return s, wf
}

// succeedStep marks the transaction's task succeeded and its step with it.
func succeedStep(tx store.TaskTx) error {
	task := tx.Task()
	task.Status = status.TaskSucceeded
	if err := tx.UpdateTask(task); err != nil {
		return err
	}
	st := tx.Run().Step(task.Step)
	st.Status = status.StepSuccess
	return tx.Run().UpdateStep(st)
}

// twoTaskRun opens a store on dsn (migrating it) and creates a run of two
// running task steps, a and b, whose tasks that store claims: both tasks
// are then in its task cache.
func twoTaskRun(t *testing.T, dsn string) (*Store, *store.Run, map[string]*store.Task, time.Time) {
	t.Helper()
	return twoTaskRunWith(t, dsn, status.StepRunning)
}

// twoTaskRunWith is twoTaskRun with step b in status stepB.
func twoTaskRunWith(t *testing.T, dsn, stepB string) (*Store, *store.Run, map[string]*store.Task, time.Time) {
	t.Helper()
	ctx := t.Context()
	s, wf := withWorkflow(t, dsn, "opt")
	now := time.Now().UTC().Truncate(time.Microsecond)
	run, _, err := s.CreateRun(ctx, &store.NewRun{
		Run: store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour), StartedAt: now},
		Steps: []*store.StepRun{
			{Name: "a", Type: "task", Status: status.StepRunning},
			{Name: "b", Position: 1, Type: "task", Status: stepB},
		},
		Tasks: []*store.Task{
			{Type: "opt.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: "a"},
			{Type: "opt.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: "b"},
		},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := s.ClaimTasks(ctx, store.ClaimTasks{Patterns: []string{"opt.x.v1"}, WorkerID: "w", Lease: time.Minute, Max: 2, Now: now})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %v (%d tasks)", err, len(claimed))
	}
	byStep := map[string]*store.Task{}
	for _, k := range claimed {
		byStep[k.Step] = k
	}
	return s, run, byStep, now
}

// oneWriter is dsn with one writer connection: a batch decided again
// after a failed guarded write runs on the connection that write used,
// which must have been rolled back.
func oneWriter(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("ferry_max_conns", "2")
	u.RawQuery = q.Encode()
	return u.String()
}

// backends are the server processes of s's connections (the schema is
// their application_name).
func backends(t *testing.T, s *Store) []int {
	t.Helper()
	rows, err := s.ReadDB().QueryContext(t.Context(), `SELECT pid FROM pg_stat_activity WHERE application_name = current_setting('application_name') ORDER BY pid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		out = append(out, pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// succeed reports k succeeded, its step with it and an event of the run,
// checking its lease token as the runtime does; calls counts how often
// the report was decided.
func succeed(t *testing.T, s *Store, run *store.Run, k *store.Task, now time.Time, calls *int) error {
	t.Helper()
	errs, err := s.InTasks(t.Context(), []string{k.ID}, map[string]string{k.ID: run.ID}, now, func(_ int, tx store.TaskTx) error {
		*calls++
		if tx.Task().LeaseToken != k.LeaseToken {
			return errStaleToken
		}
		if err := succeedStep(tx); err != nil {
			return err
		}
		return tx.Run().Append(store.NewEvent{Type: "step_succeeded", Step: k.Step})
	})
	if err == nil {
		err = errs[0]
	}
	return err
}

// wantSteps fails unless the run's steps have the statuses in want.
func wantSteps(t *testing.T, s *Store, runID string, want map[string]string) {
	t.Helper()
	_, steps, err := s.GetRun(t.Context(), runID)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, st := range steps {
		got[st.Name] = st.Status
	}
	if !maps.Equal(got, want) {
		t.Errorf("steps %v, want %v", got, want)
	}
}

var errStaleToken = errors.New("stale lease token")

type batchCounts struct{ written, stale, redecided int64 }

func counts(s *Store) batchCounts {
	w, st, r := s.OptimisticBatches()
	return batchCounts{w, st, r}
}

// TestOptimisticBatchOneRoundTrip: a report batch whose run and task this
// store holds at their current versions is decided without reading them
// and written in one round trip (BEGIN, the plan settings, the guarded
// write, COMMIT), and what it wrote is what a read finds.
func TestOptimisticBatchOneRoundTrip(t *testing.T) {
	s, run, ks, now := twoTaskRun(t, pgtest.DSN(t))
	var calls int
	// The first report may read the run (a created run is not always
	// cached); it caches what it commits.
	if err := succeed(t, s, run, ks["a"], now, &calls); err != nil {
		t.Fatal(err)
	}
	before := counts(s)
	ctx, recorded := spied(t.Context())
	errs, err := s.InTasks(ctx, []string{ks["b"].ID}, map[string]string{ks["b"].ID: run.ID}, now, func(_ int, tx store.TaskTx) error {
		calls++
		return succeedStep(tx)
	})
	if err == nil {
		err = errs[0]
	}
	if err != nil {
		t.Fatal(err)
	}
	pipes := recorded()
	if len(pipes) != 1 {
		t.Fatalf("the report sent %d pipelines, want one: %q", len(pipes), pipes)
	}
	p := pipes[0]
	if len(p) != 4 || p[0] != "BEGIN" || p[1] != genericPlans || !strings.HasPrefix(p[2], "WITH ") || !strings.Contains(p[2], "xmin") || p[3] != "COMMIT" {
		t.Fatalf("pipeline = %q; want BEGIN, the plan settings, one guarded write and COMMIT", p)
	}
	if got := counts(s); got.written != before.written+1 || got.stale != before.stale {
		t.Errorf("optimistic batches %+v after %+v, want one more written", got, before)
	}
	if calls != 2 {
		t.Errorf("two reports decided %d times, want 2", calls)
	}
	wantSteps(t, s, run.ID, map[string]string{"a": status.StepSuccess, "b": status.StepSuccess})
	if k, err := s.GetTask(t.Context(), ks["b"].ID); err != nil || k.Status != status.TaskSucceeded {
		t.Errorf("task b = %v, %v; want succeeded", k, err)
	}
}

// twoNodes is twoTaskRun on a store a with one writer connection, with
// a's report of task a written (a caches the run), and another node b.
func twoNodes(t *testing.T) (a, b *Store, run *store.Run, ks map[string]*store.Task, now time.Time) {
	t.Helper()
	dsn := pgtest.DSN(t)
	a, run, ks, now = twoTaskRun(t, oneWriter(t, dsn))
	b = openNode(t, dsn)
	var calls int
	if err := succeed(t, a, run, ks["a"], now, &calls); err != nil {
		t.Fatal(err)
	}
	return a, b, run, ks, now
}

// TestOptimisticBatchRunWrittenElsewhere: when another node (a second
// store on the same schema) wrote the run after this store cached it, the
// guarded write changes nothing, and the batch is decided again on the
// locked rows: both nodes' writes are kept.
func TestOptimisticBatchRunWrittenElsewhere(t *testing.T) {
	a, b, run, ks, now := twoNodes(t)
	var calls int
	if err := b.InRun(t.Context(), run.ID, now, func(tx store.RunTx) error {
		return tx.Append(store.NewEvent{Type: "noted elsewhere"})
	}); err != nil {
		t.Fatal(err)
	}
	before, sessions := counts(a), backends(t, a)
	if err := succeed(t, a, run, ks["b"], now, &calls); err != nil {
		t.Fatal(err)
	}
	if got := backends(t, a); !slices.Equal(got, sessions) {
		// pgx drops a connection left in a transaction: the failed
		// guarded write's must have been rolled back.
		t.Errorf("the store's sessions went from %v to %v: a connection was dropped", sessions, got)
	}
	if got := counts(a); got.stale != before.stale+1 || got.written != before.written {
		t.Errorf("optimistic batches %+v after %+v, want one more found stale", got, before)
	}
	if calls != 2 {
		t.Errorf("the report was decided %d times, want twice (cached, then locked)", calls)
	}
	evs, err := a.ListEvents(t.Context(), run.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for i, e := range evs {
		types = append(types, e.Type)
		if e.Seq != int64(i+1) {
			t.Errorf("event %d has seq %d", i, e.Seq)
		}
	}
	if strings.Join(types, ",") != "step_succeeded,noted elsewhere,step_succeeded" {
		t.Errorf("run events %q, want both nodes' in order", types)
	}
	wantSteps(t, a, run.ID, map[string]string{"a": status.StepSuccess, "b": status.StepSuccess})
}

// TestOptimisticBatchTaskTakenElsewhere: a task this store leased and
// cached, then taken over by another node (its lease token changed), is
// decided again on its locked row, where the report sees the new token
// and is refused; the other node's lease stands.
func TestOptimisticBatchTaskTakenElsewhere(t *testing.T) {
	a, b, run, ks, now := twoNodes(t)
	var calls int
	if err := b.InTask(t.Context(), ks["b"].ID, now, func(tx store.TaskTx) error {
		k := *tx.Task()
		k.LeasedBy, k.LeaseToken, k.Attempt = "other", "other-token", k.Attempt+1
		return tx.UpdateTask(&k)
	}); err != nil {
		t.Fatal(err)
	}
	before := counts(a)
	if err := succeed(t, a, run, ks["b"], now, &calls); !errors.Is(err, errStaleToken) {
		t.Fatalf("report of a task leased elsewhere: %v, want %v", err, errStaleToken)
	}
	if calls != 2 {
		t.Errorf("the report was decided %d times, want twice (cached, then locked)", calls)
	}
	if got := counts(a); got.stale != before.stale+1 {
		t.Errorf("optimistic batches %+v after %+v, want one more found stale", got, before)
	}
	k, err := a.GetTask(t.Context(), ks["b"].ID)
	if err != nil {
		t.Fatal(err)
	}
	if k.Status != status.TaskLeased || k.LeaseToken != "other-token" {
		t.Errorf("task b is %s with token %q, want still leased to the other node", k.Status, k.LeaseToken)
	}
	wantSteps(t, a, run.ID, map[string]string{"a": status.StepSuccess, "b": status.StepRunning})
}
