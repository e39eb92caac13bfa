package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/store"
)

// An optimistic batch (Postgres) is a report batch decided from the
// caches and written in one round trip, without reading or locking
// anything first. A report batch of the locking way opens with two
// locking reads (its runs, then its tasks, SELECT … FOR UPDATE): a fifth
// of Postgres's statement time in the jobs benchmark, and a round trip
// before the write can even be built. Yet the runtime nearly always holds
// what they return: its runs in the version cache, the tasks it leased
// itself in the task cache, each at the row version (xmin) its own commit
// left.
//
// So a batch all of whose runs and tasks are cached is decided on those
// copies, and its write updates each run and each task only if its row is
// still at the version the batch was decided on (updateByID). The write
// checks that every one of them was written; if one was not (another
// transaction changed it since), the check fails the statement, the
// transaction rolls back, and the batch is decided again the locking way.
// The check reads the runs' clause first, then the tasks', so the rows
// are locked in the order the locking way takes them, runs then tasks
// (withStmt). A batch is written this way only when it writes every run
// and every task it read, with no error for any of them and no tasks of
// other runs to cancel: what it decided then rests on nothing but rows it
// checks. Anything else is decided again the locking way, before anything
// is sent.
//
// Decided again means the caller's function runs again for those tasks;
// InTasks says so. The workflow's name, which a run's row version does not
// cover (a workflow renamed since the run was cached), is not read by
// anything a report decides.
//
// A fire transaction of due timers (FireTimers) is written the same way,
// decided on the cached runs and on the timer loop's own unlocked read of
// what is due. Its extra guarded clauses delete the queue rows it fired
// only where they are still due and not held for a lease, and check that
// none of its runs' timers due before what it applied was left out (the
// read did not reach it, or a commit queued it since).

// errNoRead is what a run of an optimistic batch answers a read with: the
// batch has no transaction yet. No report reads; one that did is decided
// again the locking way.
var errNoRead = errors.New("an optimistic batch reads nothing")

type noReads struct{}

func (noReads) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	return nil, errNoRead
}
func (noReads) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, errNoRead
}
func (noReads) QueryRowContext(context.Context, string, ...any) *sql.Row { return nil }

// optimistic decides a batch on the cached runs and tasks and those it
// reads without locking, and writes it guarded. apply decides it into cs;
// it returns guarded parts of its own to write in the same statement
// (a fire's queue rows), or ok false when the batch is to be decided the
// locking way (a task or timer failed). done false: it wrote nothing, and
// the batch is to be decided again the locking way.
func (s *Store) optimistic(ctx context.Context, runIDs, taskIDs []string, now time.Time, apply func(context.Context, *changeset, map[string]*runTx, map[string]lockedTask) (extra []part, ok bool)) (_ *changeset, done bool, err error) {
	runs, tasks, versions, missRuns, missTasks := s.fromCaches(ctx, runIDs, taskIDs, now)
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return nil, false, err
	}
	defer conn.Close()
	// Once BEGIN is sent, a transaction may be open on conn until the
	// COMMIT has answered.
	open := false
	defer func() {
		if open {
			s.abort(ctx, conn)
		}
	}()
	begin := s.beginGeneric()
	if len(missRuns)+len(missTasks) > 0 {
		// What is not cached is read, unlocked, in the transaction that
		// writes (one more round trip); the write checks it too.
		open = true
		if err := s.readUnlocked(ctx, conn, begin, missRuns, missTasks, now, runs, tasks, versions); err != nil {
			return nil, false, err
		}
		begin = nil
	}
	if s.vcache.check {
		if err := s.checkCached(ctx, conn, now, runs, tasks, versions); err != nil {
			return nil, false, err
		}
	}
	cs := &changeset{versions: versions}
	extra, ok := apply(ctx, cs, runs, tasks)
	if _, of := s.timerShare(); (!ok || !guardable(cs, runs, tasks)) && of > 1 && len(missRuns) < len(runIDs) {
		// Decided on a cached run that another server may have written
		// since (with several servers, one fires a run's timer and
		// another reports its next step): such a decision leaves the run
		// unwritten, or fails its guard. Read the rows as they are,
		// without locks (all of them: the decision changed the runs and
		// tasks it was given in place), and if a cached run had changed,
		// decide once more; if none had, the decision itself was not
		// guardable. With two nodes, 771 of a sleep run's ≈2,600 report
		// batches went the locking way for this (twenty-ninth pass).
		// Only with other servers about: alone, a cached run is not
		// written behind this one's back.
		open = true
		fresh, freshTasks, freshVersions := map[string]*runTx{}, map[string]lockedTask{}, map[string]string{}
		if err := s.readUnlocked(ctx, conn, begin, runIDs, taskIDs, now, fresh, freshTasks, freshVersions); err != nil {
			s.tcache.ineligible.Add(1)
			return nil, false, nil // the locking way, on another connection
		}
		begin = nil
		missed := make(map[string]bool, len(missRuns))
		for _, id := range missRuns {
			missed[id] = true
		}
		if slices.ContainsFunc(runIDs, func(id string) bool { return !missed[id] && freshVersions[id] != versions[id] }) {
			s.tcache.reread.Add(1)
			runs, tasks, versions = fresh, freshTasks, freshVersions
			cs = &changeset{versions: versions}
			extra, ok = apply(ctx, cs, runs, tasks)
		}
	}
	if !ok || !guardable(cs, runs, tasks) {
		s.tcache.ineligible.Add(1)
		return nil, false, nil
	}
	parts, events := s.flushParts(cs)
	all := append(append(parts[:len(parts):len(parts)], events()...), extra...)
	if params(all) > maxStmtParams {
		// One statement or none: the guard is a check of that statement.
		s.tcache.ineligible.Add(1)
		return nil, false, nil
	}
	open = true
	stale, err := s.writeGuarded(ctx, conn, begin, cs, all)
	if err != nil {
		return nil, false, err
	}
	if stale {
		// The failed check leaves the transaction aborted, not ended: the
		// deferred abort rolls it back before conn goes back to the pool.
		s.tcache.stale.Add(1)
		// Its tasks' entries may be what changed; the locking way caches
		// what it commits.
		s.tcache.forget(taskIDs)
		return nil, false, nil
	}
	open = false // COMMIT answered
	if err := s.stage(ctx, conn, runs, cs); err != nil {
		cs.cacheIDs, cs.cacheRuns = nil, nil
	}
	s.tcache.hits.Add(1)
	return cs, true, nil
}

// fromCaches takes runIDs and taskIDs from the caches, with the versions
// they were cached at, and returns those not cached.
func (s *Store) fromCaches(ctx context.Context, runIDs, taskIDs []string, now time.Time) (runs map[string]*runTx, tasks map[string]lockedTask, versions map[string]string, missRuns, missTasks []string) {
	versions = make(map[string]string, len(runIDs)+len(taskIDs))
	tasks = make(map[string]lockedTask, len(taskIDs))
	for _, id := range taskIDs {
		e, ok := s.tcache.get(id)
		if !ok {
			missTasks = append(missTasks, id)
			continue
		}
		t := e.task
		tasks[id], versions[id] = lockedTask{task: &t, seq: e.seq}, e.version
	}
	runs = make(map[string]*runTx, len(runIDs))
	for _, id := range runIDs {
		e := s.vcache.latest(id)
		if e == nil {
			missRuns = append(missRuns, id)
			continue
		}
		rt := e.runTx(s, ctx, noReads{}, now)
		rt.version = e.version
		runs[id], versions[id] = rt, e.version
	}
	return runs, tasks, versions, missRuns, missTasks
}

// readUnlocked sends begin and reads runIDs and taskIDs without locking
// them, with their versions, into runs, tasks and versions.
func (s *Store) readUnlocked(ctx context.Context, conn *sql.Conn, begin []PipeQuery, runIDs, taskIDs []string, now time.Time, runs map[string]*runTx, tasks map[string]lockedTask, versions map[string]string) error {
	read := map[string]*runTx{}
	qs := begin
	if len(runIDs) > 0 {
		q, args := s.runRowsRead(runIDs, false)
		qs = append(qs, PipeQuery{SQL: q, Args: args, Rows: func(r PipeRows) error { return s.scanRunRows(ctx, conn, r, now, read) }})
	}
	if len(taskIDs) > 0 {
		q, args := s.versionedTasksQuery(taskIDs)
		qs = append(qs, PipeQuery{SQL: q, Args: args, Rows: func(r PipeRows) error { return scanVersionedTasks(r, tasks, versions) }})
	}
	if err := s.d.Pipeline(ctx, conn, qs); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	// Steps read after their run's row are the row's or newer, and newer
	// ones changed the row's version, which the write checks. The cache
	// check, which would lock them, is left to checkCached.
	if err := s.versionedStepsChecked(ctx, conn, read, now, false); err != nil {
		return err
	}
	for id, rt := range read {
		runs[id], versions[id] = rt, rt.version
	}
	return nil
}

// beginGeneric begins a transaction that plans its statements once, by
// key (see pipeline.go): BEGIN, then the dialect's plan settings.
func (s *Store) beginGeneric() []PipeQuery {
	begin := []PipeQuery{{SQL: "BEGIN"}}
	if s.d.Generic != "" {
		begin = append(begin, PipeQuery{SQL: s.d.Generic})
	}
	return begin
}

// guardable says whether cs, decided on the cached runs and tasks, may be
// written guarded: it writes every one of them, nothing else, and nothing
// that needs more than one statement.
func guardable(cs *changeset, runs map[string]*runTx, tasks map[string]lockedTask) bool {
	if len(cs.cancel) > 0 || len(cs.runs) != len(runs) || len(cs.tasks) != len(tasks) {
		return false
	}
	for _, r := range cs.runs {
		if runs[r.run.ID] != r {
			return false
		}
	}
	// By id: UpdateTask may be given a copy of the task it read.
	for _, t := range cs.tasks {
		if _, ok := tasks[t.task.ID]; !ok {
			return false
		}
	}
	return true
}

// writeGuarded sends begin (unless the reads began the transaction), the
// optimistic batch cs's guarded write (its parts all) and COMMIT. stale reports that a
// row had changed since it was read or cached: nothing was written.
func (s *Store) writeGuarded(ctx context.Context, conn *sql.Conn, begin []PipeQuery, cs *changeset, all []part) (stale bool, err error) {
	q, args := s.withStmt(all)
	qs := append(begin, PipeQuery{SQL: q, Args: args, Rows: func(r PipeRows) error {
		if r.Next() {
			_ = r.Scan(&cs.xid) // as in pipelined
		}
		return nil
	}}, commit)
	if err := s.d.Pipeline(ctx, conn, qs); err != nil {
		if isGuardFailure(err) {
			return true, nil
		}
		return false, fmt.Errorf("write: %w", err)
	}
	return false, nil
}

// isGuardFailure says whether err is a guarded write's failed check
// (withStmt): the cast of guardFailed to an integer.
func isGuardFailure(err error) bool {
	var st interface{ SQLState() string }
	return errors.As(err, &st) && st.SQLState() == "22P02" && strings.Contains(err.Error(), guardFailed)
}

// checkCached compares an optimistic batch's runs and tasks that are
// still at the version it decided on with the tables
// (FERRY_RUNCACHE_CHECK): a difference is a cache that would decide
// differently from a read.
//
// It reads on the batch's own connection (the reader pool may be as small
// as one connection, held by someone waiting on this batch) and locks
// nothing: the batch takes its row locks with its write, runs first, and
// a lock taken here, in another order, could deadlock. Without a lock
// the rows may move between the statements: a run is compared only if
// its version is the same after its steps were read as before (every
// write of a step writes its run's row).
func (s *Store) checkCached(ctx context.Context, conn *sql.Conn, now time.Time, runs map[string]*runTx, tasks map[string]lockedTask, versions map[string]string) error {
	ids := slices.Sorted(maps.Keys(runs))
	want := map[string]*runTx{}
	after := map[string]string{}
	if len(ids) > 0 {
		q, args := s.runRowsRead(ids, false)
		rows, err := conn.QueryContext(ctx, q, args...)
		if err != nil {
			return fmt.Errorf("optimistic batch: check runs: %w", err)
		}
		err = s.scanRunRows(ctx, conn, rows, now, want)
		rows.Close()
		if err == nil {
			err = s.readSteps(ctx, conn, ids, want)
		}
		if err == nil {
			err = s.rowVersions(ctx, conn, ids, after)
		}
		if err != nil {
			return fmt.Errorf("optimistic batch: check runs: %w", err)
		}
	}
	for _, id := range ids {
		got, w := runs[id], want[id]
		if w == nil || w.version != versions[id] || after[id] != w.version {
			continue // changed since: the write's check fails
		}
		// The workflow's name is not covered by the row's version, and
		// nothing a report decides reads it.
		g := *got
		r := *got.run
		r.WorkflowName = w.run.WorkflowName
		g.run = &r
		if gi, wi := runImage(&g), runImage(w); gi != wi {
			return fmt.Errorf("optimistic batch: run %s differs from the table:\ncache %s\ntable %s", id, gi, wi)
		}
		if !maps.Equal(got.inRow, w.inRow) {
			return fmt.Errorf("optimistic batch: run %s: steps in the run's row %v, the table's %v", id, got.inRow, w.inRow)
		}
	}
	if len(tasks) == 0 {
		return nil
	}
	wantTasks, wantVer := map[string]lockedTask{}, map[string]string{}
	q, args := s.versionedTasksQuery(slices.Collect(maps.Keys(tasks)))
	rows, err := conn.QueryContext(ctx, q, args...)
	if err == nil {
		err = scanVersionedTasks(rows, wantTasks, wantVer)
		rows.Close()
	}
	if err != nil {
		return fmt.Errorf("optimistic batch: check tasks: %w", err)
	}
	for id, got := range tasks {
		w, ok := wantTasks[id]
		if !ok || wantVer[id] != versions[id] {
			continue // gone or changed since: the write's check fails
		}
		if gi, wi := taskImage(got.task, got.seq), taskImage(w.task, w.seq); gi != wi {
			return fmt.Errorf("optimistic batch: task %s differs from the table:\ncache %s\ntable %s", id, gi, wi)
		}
	}
	return nil
}

// versionedTasksQuery reads tasks, without locking them, with their row
// versions.
func (s *Store) versionedTasksQuery(ids []string) (string, []any) {
	cond, args := s.inStrings("id", ids)
	return s.q(`SELECT ` + taskCols + `, event_seq, xmin::text FROM tasks WHERE ` + cond), args
}

// scanVersionedTasks reads versionedTasksQuery's rows into tasks and
// versions.
func scanVersionedTasks(r PipeRows, tasks map[string]lockedTask, versions map[string]string) error {
	for r.Next() {
		var seq int64
		var ver string
		t, err := scanTask(scanTail{r, []any{&seq, &ver}})
		if err != nil {
			return err
		}
		tasks[t.ID], versions[t.ID] = lockedTask{task: t, seq: seq}, ver
	}
	return r.Err()
}

// rowVersions reads the row versions of runs ids into out.
func (s *Store) rowVersions(ctx context.Context, conn *sql.Conn, ids []string, out map[string]string) error {
	cond, args := s.inStrings("id", ids)
	rows, err := conn.QueryContext(ctx, s.q(`SELECT id, xmin::text FROM runs WHERE `+cond), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, ver string
		if err := rows.Scan(&id, &ver); err != nil {
			return err
		}
		out[id] = ver
	}
	return rows.Err()
}

// taskImage is a task, every field, nil-ness and time zones included.
func taskImage(t *store.Task, seq int64) string {
	return fmt.Sprintf("%#v seq %d", []any{t.ID, t.Type, bytesImage(t.Payload), t.Status, t.Priority, timeImage(&t.RunAt), t.IdempotencyKey, t.Attempt, t.MaxAttempts, t.RetryDelay,
		t.LeasedBy, t.LeaseToken, timeImage(t.LeaseUntil), t.Reclaimed, t.CancelRequested, t.LastError, bytesImage(t.Result), t.RunID, t.Step,
		timeImage(&t.CreatedAt), timeImage(&t.UpdatedAt), timeImage(t.FinishedAt), t.ToWaitingClaim}, seq)
}

// OptimisticBatches counts the report batches and fire transactions
// decided on cached and unlocked rows (Postgres): written so, found stale
// at their write (then decided again the locking way), and decided again
// before anything was sent (a task or timer failed, or the batch wrote
// less than it read).
func (s *Store) OptimisticBatches() (written, stale, redecided int64) {
	if s.tcache == nil {
		return 0, 0, 0
	}
	return s.tcache.hits.Load(), s.tcache.stale.Load(), s.tcache.ineligible.Load()
}

// OptimisticRereads counts the optimistic batches decided a second time
// because a cached run they were first decided on had changed (another
// server wrote it): its row read afresh, without locks.
func (s *Store) OptimisticRereads() int64 {
	if s.tcache == nil {
		return 0
	}
	return s.tcache.reread.Load()
}
