package postgres

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// checkedStore opens a migrated store with the cache check on (every
// cached run and task an optimistic batch decides on is compared with the
// tables) and a workflow.
func checkedStore(t *testing.T) (*Store, *store.Workflow) {
	t.Helper()
	s, wf, _ := checkedStoreDSN(t)
	return s, wf
}

func checkedStoreDSN(t *testing.T) (*Store, *store.Workflow, string) {
	t.Helper()
	t.Setenv("FERRY_RUNCACHE_CHECK", "1")
	dsn := pgtest.DSN(t)
	s, wf := withWorkflow(t, dsn, "chk")
	return s, wf, dsn
}

// finish reports k succeeded as the runtime does (token and status
// checked), its step with it; extra runs after, in the same report.
func finish(t *testing.T, s *Store, k *store.Task, now time.Time, extra func(tx store.TaskTx) error) error {
	t.Helper()
	errs, err := s.InTasks(t.Context(), []string{k.ID}, map[string]string{k.ID: k.RunID}, now, func(_ int, tx store.TaskTx) error {
		task := tx.Task()
		if task.LeaseToken == "" || task.LeaseToken != k.LeaseToken {
			return errStaleToken
		}
		if task.Status != status.TaskLeased {
			return fmt.Errorf("task %s is %s", task.ID, task.Status)
		}
		task.Status = status.TaskSucceeded
		now := tx.Now()
		task.FinishedAt, task.LeaseUntil = &now, nil
		if err := tx.UpdateTask(task); err != nil {
			return err
		}
		if err := tx.AppendTask(store.NewEvent{Type: "succeeded"}); err != nil {
			return err
		}
		if run := tx.Run(); run != nil {
			st := run.Step(task.Step)
			st.Status, st.FinishedAt = status.StepSuccess, &now
			if err := run.UpdateStep(st); err != nil {
				return err
			}
			if err := run.Append(store.NewEvent{Type: "step_succeeded", Step: task.Step}); err != nil {
				return err
			}
		}
		if extra != nil {
			return extra(tx)
		}
		return nil
	})
	if err == nil {
		err = errs[0]
	}
	return err
}

// TestOptimisticCreatedLeasedTasksCached: tasks a run's creation writes
// already leased (eager dispatch, a waiting claim) are cached by that
// commit; their reports are decided on the cache, which the check finds
// equal to the tables, and written at once.
func TestOptimisticCreatedLeasedTasksCached(t *testing.T) {
	s, wf := checkedStore(t)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	until := now.Add(time.Minute)
	nr := &store.NewRun{
		Workflow: wf,
		Run:      store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{"x":1}`), ExpiresAt: now.Add(time.Hour), StartedAt: now},
		Steps: []*store.StepRun{
			{Name: "a", Type: "task", Status: status.StepRunning, StartedAt: &now},
			{Name: "b", Position: 1, Type: "task", Status: status.StepRunning, StartedAt: &now},
		},
		Events: []store.NewEvent{{Type: "run_started"}},
	}
	for i, step := range []string{"a", "b"} {
		nr.Tasks = append(nr.Tasks, &store.Task{Type: "chk.x.v1", Payload: json.RawMessage(`{"n":1}`), Status: status.TaskLeased, Priority: 100, RunAt: now, Step: step,
			Attempt: 1, LeasedBy: "w", LeaseToken: fmt.Sprintf("tok-%d", i), LeaseUntil: &until, MaxAttempts: 3, RetryDelay: 1500 * time.Microsecond, ToWaitingClaim: i == 1})
	}
	if _, _, err := s.CreateRun(ctx, nr, now); err != nil {
		t.Fatal(err)
	}
	for _, k := range nr.Tasks {
		before := counts(s)
		if err := finish(t, s, k, now.Add(time.Second), nil); err != nil {
			t.Fatalf("report of %s: %v", k.Step, err)
		}
		if got := counts(s); got.written != before.written+1 {
			t.Errorf("report of %s: optimistic batches %+v after %+v, want one more written", k.Step, got, before)
		}
	}
	wantSteps(t, s, nr.Run.ID, map[string]string{"a": status.StepSuccess, "b": status.StepSuccess})
}

// TestOptimisticLongRunStepRows: a run of more than ten steps keeps them in
// step_runs rows; reports decided on its cached copy write the right rows
// and the check finds the cache equal to the tables.
func TestOptimisticLongRunStepRows(t *testing.T) {
	s, wf := checkedStore(t)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	nr := &store.NewRun{Workflow: wf, Run: store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour), StartedAt: now}}
	want := map[string]string{}
	for i := range 12 {
		name := fmt.Sprintf("s%02d", i)
		nr.Steps = append(nr.Steps, &store.StepRun{Name: name, Position: i, Type: "task", Status: status.StepRunning})
		nr.Tasks = append(nr.Tasks, &store.Task{Type: "chk.long.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: name})
		want[name] = status.StepRunning
	}
	if _, _, err := s.CreateRun(ctx, nr, now); err != nil {
		t.Fatal(err)
	}
	ks, err := s.ClaimTasks(ctx, store.ClaimTasks{Patterns: []string{"chk.long.v1"}, WorkerID: "w", Lease: time.Minute, Max: 12, Now: now})
	if err != nil || len(ks) != 12 {
		t.Fatalf("claim: %v (%d)", err, len(ks))
	}
	for i, k := range ks {
		before := counts(s)
		if err := finish(t, s, k, now.Add(time.Duration(i+1)*time.Millisecond), nil); err != nil {
			t.Fatalf("report %d: %v", i, err)
		}
		want[k.Step] = status.StepSuccess
		if got := counts(s); got.written != before.written+1 {
			t.Errorf("report %d: optimistic batches %+v after %+v, want one more written", i, got, before)
		}
		wantSteps(t, s, nr.Run.ID, want)
	}
}

// TestOptimisticReclaimedAndHeartbeated: a task whose lease ran out is taken
// over by a second claim of this store; the first worker's report is
// refused, the second worker heartbeats (a lease extended in a report of
// its own) and then reports, decided on the cache each time.
func TestOptimisticReclaimedAndHeartbeated(t *testing.T) {
	s, wf := checkedStore(t)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	nr := &store.NewRun{Workflow: wf, Run: store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour), StartedAt: now},
		Steps: []*store.StepRun{{Name: "a", Type: "task", Status: status.StepRunning}},
		Tasks: []*store.Task{{Type: "chk.re.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: "a"}},
	}
	if _, _, err := s.CreateRun(ctx, nr, now); err != nil {
		t.Fatal(err)
	}
	first, err := s.ClaimTasks(ctx, store.ClaimTasks{Patterns: []string{"chk.re.v1"}, WorkerID: "w1", Lease: time.Second, Max: 1, Now: now})
	if err != nil || len(first) != 1 {
		t.Fatalf("claim: %v (%d)", err, len(first))
	}
	later := now.Add(2 * time.Second)
	second, err := s.ClaimTasks(ctx, store.ClaimTasks{Patterns: []string{"chk.re.v1"}, WorkerID: "w2", Lease: time.Minute, Max: 1, Now: later})
	if err != nil || len(second) != 1 || !second[0].Reclaimed {
		t.Fatalf("reclaim: %v (%v)", err, second)
	}
	if err := finish(t, s, first[0], later, nil); err != errStaleToken {
		t.Fatalf("the first worker's report: %v, want %v", err, errStaleToken)
	}
	// A heartbeat: the lease extended, an event.
	if err := s.InTask(ctx, second[0].ID, later, func(tx store.TaskTx) error {
		k := tx.Task()
		if k.LeaseToken != second[0].LeaseToken {
			return errStaleToken
		}
		until := later.Add(time.Hour)
		k.LeaseUntil = &until
		if err := tx.UpdateTask(k); err != nil {
			return err
		}
		return tx.AppendTask(store.NewEvent{Type: "heartbeat"})
	}); err != nil {
		t.Fatal(err)
	}
	before := counts(s)
	if err := finish(t, s, second[0], later.Add(time.Second), nil); err != nil {
		t.Fatal(err)
	}
	if got := counts(s); got.written != before.written+1 {
		t.Errorf("optimistic batches %+v after %+v, want one more written", got, before)
	}
	wantSteps(t, s, nr.Run.ID, map[string]string{"a": status.StepSuccess})
}

// TestOptimisticEagerTaskCancelledInItsBatch: a report that starts a task
// leased to its worker (eager) and, in the same batch, a report that ends
// the run and cancels the run's tasks: the new task is written cancelled,
// and a later report of it (with the lease token the first report gave)
// is refused, whether or not the cache kept it.
func TestOptimisticEagerTaskCancelledInItsBatch(t *testing.T) {
	s, wf := checkedStore(t)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	nr := &store.NewRun{Workflow: wf, Run: store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour), StartedAt: now},
		Steps: []*store.StepRun{
			{Name: "a", Type: "task", Status: status.StepRunning},
			{Name: "b", Position: 1, Type: "task", Status: status.StepRunning},
			{Name: "c", Position: 2, Type: "task", Status: status.StepPending},
		},
		Tasks: []*store.Task{
			{Type: "chk.ec.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: "a"},
			{Type: "chk.ec.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: "b"},
		},
	}
	if _, _, err := s.CreateRun(ctx, nr, now); err != nil {
		t.Fatal(err)
	}
	ks, err := s.ClaimTasks(ctx, store.ClaimTasks{Patterns: []string{"chk.ec.v1"}, WorkerID: "w", Lease: time.Minute, Max: 2, Now: now})
	if err != nil || len(ks) != 2 {
		t.Fatalf("claim: %v (%d)", err, len(ks))
	}
	byStep := map[string]*store.Task{}
	for _, k := range ks {
		byStep[k.Step] = k
	}
	later := now.Add(time.Second)
	until := later.Add(time.Minute)
	c := &store.Task{Type: "chk.ec.v1", Payload: json.RawMessage(`{}`), Status: status.TaskLeased, Priority: 100, RunAt: later, Step: "c",
		Attempt: 1, LeasedBy: "w", LeaseToken: "eager-c", LeaseUntil: &until}
	ids := []string{byStep["a"].ID, byStep["b"].ID}
	errs, err := s.InTasks(ctx, ids, map[string]string{ids[0]: nr.Run.ID, ids[1]: nr.Run.ID}, later, func(i int, tx store.TaskTx) error {
		k := tx.Task()
		run := tx.Run()
		st := run.Step(k.Step)
		if i == 0 { // a succeeds and starts c, leased to its worker
			k.Status = status.TaskSucceeded
			st.Status = status.StepSuccess
			cs := run.Step("c")
			cs.Status = status.StepRunning
			if err := run.UpdateStep(cs); err != nil {
				return err
			}
			if err := run.CreateTask(c); err != nil {
				return err
			}
		} else { // b fails the run, which cancels its tasks
			k.Status = status.TaskFailed
			st.Status = status.StepFailed
			r := run.Run()
			r.Status, r.FinishedAt = status.RunFailed, &later
			if err := run.UpdateRun(r); err != nil {
				return err
			}
			if err := run.CancelTasks(c.ID); err != nil {
				return err
			}
		}
		if err := tx.UpdateTask(k); err != nil {
			return err
		}
		return run.UpdateStep(st)
	})
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("batch: %v %v", err, errs)
	}
	if got, err := s.GetTask(ctx, c.ID); err != nil || got.Status != status.TaskCancelled {
		t.Fatalf("task c = %+v, %v; want cancelled", got, err)
	}
	c.RunID = nr.Run.ID
	if err := finish(t, s, c, later.Add(time.Second), nil); err == nil {
		t.Fatalf("a report of the cancelled task c was accepted")
	}
	if got, err := s.GetTask(ctx, c.ID); err != nil || got.Status != status.TaskCancelled {
		t.Fatalf("task c = %+v, %v; want still cancelled", got, err)
	}
}

// TestOptimisticStandaloneTask: a standalone task's report is decided on its
// cached copy (there is no run) and written at once.
func TestOptimisticStandaloneTask(t *testing.T) {
	s, _ := checkedStore(t)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	if _, _, err := s.CreateTask(ctx, &store.Task{Type: "chk.sa.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, IdempotencyKey: "k", MaxAttempts: 4}, now); err != nil {
		t.Fatal(err)
	}
	ks, err := s.ClaimTasks(ctx, store.ClaimTasks{Patterns: []string{"chk.sa.v1"}, WorkerID: "w", Lease: time.Minute, Max: 1, Now: now})
	if err != nil || len(ks) != 1 {
		t.Fatalf("claim: %v (%d)", err, len(ks))
	}
	before := counts(s)
	if err := finish(t, s, ks[0], now.Add(time.Second), nil); err != nil {
		t.Fatal(err)
	}
	if got := counts(s); got.written != before.written+1 {
		t.Errorf("optimistic batches %+v after %+v, want one more written", got, before)
	}
	if k, err := s.GetTask(ctx, ks[0].ID); err != nil || k.Status != status.TaskSucceeded {
		t.Errorf("task = %+v, %v; want succeeded", k, err)
	}
}

// TestOptimisticCheckedBatchLocksRunsInIDOrder: under FERRY_RUNCACHE_CHECK
// a batch that reads a run it has not cached (its transaction is then
// open) compares its runs with the tables without locking them, so it
// still takes its row locks only with its write, runs in id order; a
// transaction taking the same runs in id order never deadlocks with it.
// (The first build compared them by locking reads, one run at a time in
// map order, and failed with a deadlock about every other iteration.)
func TestOptimisticCheckedBatchLocksRunsInIDOrder(t *testing.T) {
	s, wf, dsn := checkedStoreDSN(t)
	ctx := t.Context()
	other := openNode(t, dsn).DB()
	for iter := range 64 { // the map gives the higher id first about half the time
		now := time.Now().UTC().Truncate(time.Microsecond)
		typ := fmt.Sprintf("chk.dl%d.v1", iter)
		var runs []*store.NewRun
		for i := range 2 {
			nr := &store.NewRun{Run: store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour), StartedAt: now},
				Steps: []*store.StepRun{{Name: "a", Type: "task", Status: status.StepRunning}},
				Tasks: []*store.Task{{Type: typ, Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: "a"}},
			}
			if i == 0 {
				nr.Workflow = wf // cached at its creation; the other is read
			}
			if _, _, err := s.CreateRun(ctx, nr, now); err != nil {
				t.Fatal(err)
			}
			runs = append(runs, nr)
		}
		ks, err := s.ClaimTasks(ctx, store.ClaimTasks{Patterns: []string{typ}, WorkerID: "w", Lease: time.Minute, Max: 2, Now: now})
		if err != nil || len(ks) != 2 {
			t.Fatalf("claim: %v (%d)", err, len(ks))
		}
		lo, hi := runs[0].Run.ID, runs[1].Run.ID
		if hi < lo {
			lo, hi = hi, lo
		}
		// Another transaction locks the runs in id order: the lower first.
		tx, err := other.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `SELECT 1 FROM runs WHERE id = $1 FOR UPDATE`, lo); err != nil {
			t.Fatal(err)
		}
		ids := []string{ks[0].ID, ks[1].ID}
		known := map[string]string{ks[0].ID: ks[0].RunID, ks[1].ID: ks[1].RunID}
		done := make(chan error, 1)
		go func() {
			errs, err := s.InTasks(ctx, ids, known, now.Add(time.Second), func(_ int, tx store.TaskTx) error { return succeedStep(tx) })
			if err == nil {
				err = errors.Join(errs...)
			}
			done <- err
		}()
		// The batch waits for the lower run's lock (holding the higher one
		// or not, as the map ordered them).
		var early error
		poll(t, "the batch to wait for the run locked elsewhere", func() bool {
			select {
			case early = <-done:
				t.Fatalf("iteration %d: the batch did not wait for the run locked elsewhere (%v)", iter, early)
			default:
			}
			var n int
			if err := other.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = current_setting('application_name') AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		})
		_, lockErr := tx.ExecContext(ctx, `SELECT 1 FROM runs WHERE id = $1 FOR UPDATE`, hi)
		if lockErr != nil {
			_ = tx.Rollback()
		} else if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil || lockErr != nil {
			t.Fatalf("iteration %d: a transaction locking the runs in id order and a checked batch: batch %v; the other transaction %v", iter, err, lockErr)
		}
	}
}
