package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// InRun runs fn under the run's lock: a row lock on Postgres (FOR UPDATE,
// which waits rather than skips, so no event is dropped when two steps
// finish at once) and the single writer on SQLite.
func (s *Store) InRun(ctx context.Context, runID string, now time.Time, fn func(store.RunTx) error) error {
	var cs *changeset
	var err error
	if s.d.Pipeline != nil {
		// Postgres: two round trips (see pipeline.go), as batches are.
		cs, err = s.pipelined(ctx, []string{runID}, now, nil, func(cs *changeset, runs map[string]*runTx) ([]PipeQuery, error) {
			rt := runs[runID]
			if rt == nil {
				return nil, fmt.Errorf("run %q: %w", runID, store.ErrNotFound)
			}
			rt.cs = cs
			return nil, fn(rt)
		})
		if err == nil {
			s.committed(cs)
		}
		return err
	}
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		cs = &changeset{}
		runs, err := s.lockRuns(ctx, tx, []string{runID}, now)
		if err != nil {
			return err
		}
		rt := runs[runID]
		if rt == nil {
			return fmt.Errorf("run %q: %w", runID, store.ErrNotFound)
		}
		rt.cs = cs
		if err := fn(rt); err != nil {
			return err
		}
		if err := s.flush(ctx, tx, cs); err != nil {
			return err
		}
		if err := s.stage(ctx, tx, runs, cs); err != nil {
			return err
		}
		return nil
	})
	if err == nil {
		s.committed(cs)
	}
	return err
}

// lockRuns locks runs in id order and reads them with their steps; a run
// that does not exist is left out.
func (s *Store) lockRuns(ctx context.Context, tx querier, ids []string, now time.Time) (map[string]*runTx, error) {
	if s.vcache != nil {
		return s.lockVersioned(ctx, tx, ids, now)
	}
	out := make(map[string]*runTx, len(ids))
	if s.cache == nil {
		return out, s.readRuns(ctx, tx, ids, now, out)
	}
	// SQLite: what this writer wrote last needs no reading.
	var miss []string
	for _, id := range ids {
		if rt := s.cache.take(s, ctx, tx, id, now); rt != nil {
			out[id] = rt
		} else {
			miss = append(miss, id)
		}
	}
	if s.cache.check {
		if err := s.checkHits(ctx, tx, out); err != nil {
			return nil, err
		}
	}
	read := make(map[string]*runTx, len(miss))
	if err := s.readRuns(ctx, tx, miss, now, read); err != nil {
		return nil, err
	}
	for id, rt := range read {
		rt.base = baseOf(rt)
		out[id] = rt
	}
	return out, nil
}

// readRuns reads (and on Postgres locks) runs with their steps into out.
func (s *Store) readRuns(ctx context.Context, tx querier, ids []string, now time.Time, out map[string]*runTx) error {
	if err := s.readRunRows(ctx, tx, ids, now, out); err != nil {
		return err
	}
	return s.readSteps(ctx, tx, ids, out)
}

// readRunRows reads (and on Postgres locks) runs into out, in id order.
func (s *Store) readRunRows(ctx context.Context, tx querier, ids []string, now time.Time, out map[string]*runTx) error {
	if len(ids) == 0 {
		return nil
	}
	q, args := s.runRowsQuery(ids)
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("lock runs: %w", err)
	}
	defer rows.Close()
	return s.scanRunRows(ctx, tx, rows, now, out)
}

// runRowsQuery reads (and on Postgres locks) runs, in id order, with
// their event sequence and row version.
func (s *Store) runRowsQuery(ids []string) (string, []any) { return s.runRowsRead(ids, true) }

// runRowsRead is runRowsQuery, locking or not.
func (s *Store) runRowsRead(ids []string, lock bool) (string, []any) {
	cond, args := s.inStrings("r.id", ids)
	version := s.d.RowVersion
	if version == "" {
		version = "''"
	}
	q := `SELECT ` + runCols + `, r.event_seq, r.steps, ` + version + ` FROM runs r JOIN workflows w ON w.id = r.workflow_id WHERE ` + cond + ` ORDER BY r.id`
	if lock {
		q += lockOf(s.d.LockRun)
	}
	return s.q(q), args
}

// scanRunRows reads runRowsQuery's rows into out, as runs of transaction tx.
func (s *Store) scanRunRows(ctx context.Context, tx querier, rows PipeRows, now time.Time, out map[string]*runTx) error {
	for rows.Next() {
		var seq int64
		var packed, ver string
		run, err := scanRun(scanTail{rows, []any{&seq, &packed, &ver}})
		if err != nil {
			return err
		}
		out[run.ID] = &runTx{s: s, ctx: ctx, tx: tx, run: run, now: notBefore(now, run.UpdatedAt), seq: seq, updatedAt: run.UpdatedAt, version: ver, packed: packed}
	}
	return rows.Err()
}

// readSteps reads the steps of runs in out, in position order: those
// their rows hold (runTx.packed) and their step_runs rows, read only for
// the runs whose row does not hold them all.
func (s *Store) readSteps(ctx context.Context, tx querier, ids []string, out map[string]*runTx) error {
	var rest []string
	for _, id := range ids {
		rt := out[id]
		if rt == nil {
			continue
		}
		packed, all, err := unpackSteps(id, rt.packed)
		if err != nil {
			return err
		}
		rt.steps = packed
		if len(packed) > 0 {
			rt.inRow = make(map[string]bool, len(packed))
			for _, st := range packed {
				rt.inRow[st.Name] = true
			}
		}
		if !all {
			rest = append(rest, id)
		}
	}
	if len(rest) == 0 {
		return nil
	}
	rows := map[string][]*store.StepRun{}
	if err := s.readStepRows(ctx, tx, rest, rows); err != nil {
		return err
	}
	for id, r := range rows {
		out[id].steps = mergeSteps(r, out[id].steps)
	}
	return nil
}

// readStepRows reads the step_runs rows of runs ids into rows, by run, in
// position order.
func (s *Store) readStepRows(ctx context.Context, tx querier, ids []string, out map[string][]*store.StepRun) error {
	cond, args := s.inStrings("run_id", ids)
	rows, err := tx.QueryContext(ctx, s.q(`SELECT `+stepCols+` FROM step_runs WHERE `+cond+` ORDER BY run_id, position`), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		st, err := scanStep(rows)
		if err != nil {
			return err
		}
		out[st.RunID] = append(out[st.RunID], st)
	}
	return rows.Err()
}

// lockOf qualifies the row lock to the runs table: FOR UPDATE on a join
// would also lock the workflow row, serialising every run of a workflow.
func lockOf(l string) string {
	if l == "" {
		return ""
	}
	return l + " OF r"
}

// runTx reads from memory (the run and its steps, read under the lock) and
// records writes in a changeset, written when the work is done.
type runTx struct {
	s         *Store
	ctx       context.Context
	tx        querier
	cs        *changeset
	run       *store.Run
	steps     []*store.StepRun
	now       time.Time
	seq       int64
	updatedAt time.Time
	base      *cachedRun // the run as read; see runCache.stage
	version   string     // Postgres: the row's xmin as read
	packed    string     // runs.steps as read, until readSteps decodes it
	// inRow names the steps whose committed state the run's row holds
	// (the others are step_runs rows), as read; never changed in place.
	inRow map[string]bool
}

// runSnap is a run's in-memory state before one request of a batch, to
// restore if the request fails: later requests of the run, and the writes
// of earlier ones, must not see a failed request's changes.
type runSnap struct {
	runPtr    *store.Run
	run       store.Run
	stepPtrs  []*store.StepRun
	steps     []store.StepRun
	seq       int64
	updatedAt time.Time
}

func (t *runTx) snapshot() runSnap {
	sn := runSnap{runPtr: t.run, run: *t.run, stepPtrs: slices.Clone(t.steps), steps: make([]store.StepRun, len(t.steps)), seq: t.seq, updatedAt: t.updatedAt}
	for i, s := range t.steps {
		sn.steps[i] = *s
	}
	return sn
}

func (t *runTx) restore(sn runSnap) {
	t.run = sn.runPtr
	*t.run = sn.run
	t.steps = sn.stepPtrs
	for i, s := range t.steps {
		*s = sn.steps[i]
	}
	t.seq, t.updatedAt = sn.seq, sn.updatedAt
}

// Now is the transaction's timestamp (store.RunTx.Now).
func (t *runTx) Now() time.Time { return t.now }

// notBefore is now, or the run's last write when that was later: a
// transaction whose caller read the clock before waiting for the run's
// lock must not record times earlier than the writer that went first.
func notBefore(now, lastWrite time.Time) time.Time {
	if lastWrite.After(now) {
		return lastWrite
	}
	return now
}

func (t *runTx) Run() *store.Run         { return t.run }
func (t *runTx) Steps() []*store.StepRun { return t.steps }
func (t *runTx) Step(name string) *store.StepRun {
	for _, s := range t.steps {
		if s.Name == name {
			return s
		}
	}
	return nil
}

func (t *runTx) UpdateRun(r *store.Run) error {
	t.run, t.updatedAt = r, t.now
	t.cs.run(t)
	return nil
}

func (t *runTx) UpdateStep(st *store.StepRun) error {
	i := slices.IndexFunc(t.steps, func(s *store.StepRun) bool { return s.Name == st.Name })
	if i < 0 {
		// Steps were read under the run's lock: one not among them does
		// not exist.
		return fmt.Errorf("update step %s: %w", st.Name, store.ErrNotFound)
	}
	// st may be a copy, even a partial one: what later requests of the run
	// read (in a batch) is what is written, and what is never written
	// stays as read.
	st.RunID, st.Position, st.Type = t.run.ID, t.steps[i].Position, t.steps[i].Type
	t.steps[i] = st
	t.cs.step(st)
	// The run's row is written with its steps: its version (Postgres's
	// xmin) then tells whether any step changed (see versionCache).
	t.cs.run(t)
	return nil
}

// committedSteps are the run's steps as the tables hold them once c is
// written: each step c writes as written, the others as committed (the
// base), so a step changed in memory but never passed to UpdateStep is
// not written with the run's row either.
func (t *runTx) committedSteps(written map[[2]string]*store.StepRun) []*store.StepRun {
	if t.base == nil {
		return t.steps
	}
	out := make([]*store.StepRun, len(t.base.steps))
	for i := range t.base.steps {
		b := &t.base.steps[i]
		if w := written[[2]string{t.run.ID, b.Name}]; w != nil {
			out[i] = w
		} else {
			out[i] = b
		}
	}
	return out
}

func (t *runTx) Enqueue(items ...store.QueueItem) error {
	for _, it := range items {
		if it.Kind == store.KindRunExpire {
			return fmt.Errorf("run %s: %w", t.run.ID, store.ErrExpiryNotQueued)
		}
		it.RunID = t.run.ID
		t.cs.queue = append(t.cs.queue, it)
		t.cs.note.queued(it.Kind, it.DueAt)
	}
	return nil
}

// Dequeue runs at once: its row count is the lease check.
func (t *runTx) Dequeue(id int64, leaseToken string) error {
	res, err := t.tx.ExecContext(t.ctx, t.s.q(`DELETE FROM queue WHERE id = ? AND lease_token = ?`), id, leaseToken)
	if err != nil {
		return fmt.Errorf("dequeue: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("queue item %d: %w", id, store.ErrLeaseLost)
	}
	return nil
}

func (t *runTx) DropQueue() error {
	t.cs.dropQueue = append(t.cs.dropQueue, t.run.ID)
	return nil
}

func (t *runTx) Append(events ...store.NewEvent) error {
	if len(events) == 0 {
		return nil
	}
	t.cs.run(t)
	return t.cs.addEvents(t.run.ID, runEvents(len(t.steps), t.s.shortRun(len(t.steps))), &t.seq, t.now, events)
}

// ---- queue ----

// Claim leases due items (of the given kinds; none means all) in one
// statement (UPDATE … RETURNING), skipping rows another node holds on
// Postgres.
func (s *Store) Claim(ctx context.Context, now time.Time, lease time.Duration, n int, kinds ...string) ([]*store.QueueItem, error) {
	tok := token()
	until := now.Add(lease)
	args := []any{tok, ts(until), ts(now), ts(now)}
	kindFilter := ""
	switch len(kinds) {
	case 0:
	case 1:
		// One kind: an equality, so Postgres walks queue_due (kind,
		// due_at, id) in claim order; with = ANY it sorted every due item.
		kindFilter = ` AND kind = ?`
		args = append(args, kinds[0])
	default:
		vals := make([]any, len(kinds))
		for i, k := range kinds {
			vals[i] = k
		}
		var cond string
		cond, vals = s.inList("kind", vals)
		kindFilter = ` AND ` + cond
		args = append(args, vals...)
	}
	// Most rounds of a dispatcher find nothing: look on the read pool
	// first, so an empty claim costs no write transaction (on SQLite, no
	// turn of the one writer and no disk sync).
	var one int
	err := s.r.QueryRowContext(ctx, s.q(`SELECT 1 FROM queue WHERE due_at <= ? AND (lease_until IS NULL OR lease_until <= ?)`+kindFilter+` LIMIT 1`), args[2:]...).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	args = append(args, n)
	var out []*store.QueueItem
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		out = out[:0]
		rows, err := tx.QueryContext(ctx, s.q(`UPDATE queue SET lease_token = ?, lease_until = ?
		WHERE id IN (SELECT id FROM queue WHERE due_at <= ? AND (lease_until IS NULL OR lease_until <= ?)`+kindFilter+` ORDER BY due_at, id LIMIT ?`+s.d.SkipLocked+`)
		RETURNING id, kind, run_id, step, attempt, due_at`), args...)
		if err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var it store.QueueItem
			var due int64
			if err := rows.Scan(&it.ID, &it.Kind, &it.RunID, &it.Step, &it.Attempt, &due); err != nil {
				return err
			}
			it.DueAt = fromTS(due)
			it.LeaseToken, it.LeaseUntil = tok, until
			out = append(out, &it)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	// RETURNING follows the rows' physical order, not the sub-select's
	// ORDER BY: sort so callers get the earliest due first.
	sort.Slice(out, func(i, j int) bool {
		if !out[i].DueAt.Equal(out[j].DueAt) {
			return out[i].DueAt.Before(out[j].DueAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// queueTimers are the timer kinds kept as queue rows: run expiries are
// read from the runs (see store.KindRunExpire).
var queueTimers = []string{store.KindWake, store.KindWaitTimeout}

// timersDue selects timer items that are due at ? and not held by a lease
// (a failed one is held until its lease ends).
const timersDue = `kind IN ('` + store.KindWake + `', '` + store.KindWaitTimeout + `') AND due_at <= ? AND (lease_until IS NULL OR lease_until <= ?)`

// runsExpiring selects the runs not finished: the predicate of the partial
// index runs_expiry (expires_at), which a query must repeat to use it.
var runsExpiring = `status IN ('` + status.RunRunning + `', '` + status.RunPaused + `')`

// runLive says whether a run of this status can still expire.
func runLive(st string) bool { return st == status.RunRunning || st == status.RunPaused }

// expiryItem is the timer item of a run's expiry (it has no queue row).
func expiryItem(runID string, expires time.Time) *store.QueueItem {
	return &store.QueueItem{Kind: store.KindRunExpire, RunID: runID, DueAt: expires}
}

// DueTimers reads up to max timer items due by until and not leased at
// now, earliest first, of runs not in skip, outside any transaction:
// FireTimers decides under the locks. Each kind is walked in its own part
// of the queue_due index (kind, due_at, id), and expiries in runs_expiry,
// and the walks are merged, so the read costs max rows whatever else is
// queued; a single walk over all kinds would sort every due item.
func (s *Store) DueTimers(ctx context.Context, now, until time.Time, max int, skip ...string) ([]*store.QueueItem, error) {
	share, shared := "", []any(nil)
	if index, of := s.timerShare(); of > 1 {
		// Only the runs of this server's share, and the others' that are
		// TimerShareGrace overdue by the end of the read (see
		// ShareTimers).
		share, shared = ` AND (%[1]s <= ? OR `+shareHash+` %% ? = ?)`, []any{ts(until.Add(-TimerShareGrace)), of, index}
	}
	// not leaves out the runs to skip (as col) from one part, and the
	// runs of other servers' shares (due as at, run id as col).
	not := func(at, col string) (string, []any) {
		var cond string
		var args []any
		if len(skip) > 0 {
			c, a := s.inStrings(col, skip)
			cond, args = ` AND NOT (`+c+`)`, a
		}
		if share != "" {
			cond, args = cond+fmt.Sprintf(share, at, col, col), append(args, shared...)
		}
		return cond, args
	}
	var parts []string
	var args []any
	for i, k := range queueTimers {
		cond, skipArgs := not("due_at", "run_id")
		parts = append(parts, fmt.Sprintf(`SELECT * FROM (SELECT id, kind, run_id, step, attempt, due_at FROM queue WHERE kind = ? AND due_at <= ? AND (lease_until IS NULL OR lease_until <= ?)%s ORDER BY due_at, id LIMIT ?) t%d`, cond, i))
		args = append(append(append(args, k, ts(until), ts(now)), skipArgs...), max)
	}
	cond, skipArgs := not("expires_at", "id")
	parts = append(parts, `SELECT * FROM (SELECT 0 AS id, '`+store.KindRunExpire+`' AS kind, id AS run_id, '' AS step, 0 AS attempt, expires_at AS due_at FROM runs WHERE `+runsExpiring+` AND expires_at <= ?`+cond+` ORDER BY expires_at LIMIT ?) x`)
	args = append(append(append(args, ts(until)), skipArgs...), max)
	rows, err := s.r.QueryContext(ctx, s.q(strings.Join(parts, ` UNION ALL `)+` ORDER BY due_at, id LIMIT ?`), append(args, max)...)
	if err != nil {
		return nil, fmt.Errorf("due timers: %w", err)
	}
	defer rows.Close()
	return scanQueueItems(rows)
}

// shareHash is what a run's share is taken from (modulo the number of
// servers), its id column as %[3]s: Postgres's hashtext, the same on
// every server of a database.
const shareHash = `(hashtext(%[3]s) & 2147483647)`

// timerShare is this server's share of the due timers (index among of;
// of 1 or less: all of them).
func (s *Store) timerShare() (index, of int) {
	if fn := s.share.Load(); fn != nil {
		return (*fn)()
	}
	return 0, 1
}

// TimerShareGrace is how overdue another server's timers must be before
// this one fires them too (see ShareTimers): a server that stopped, or
// fell that far behind, has its share taken over by the others.
const TimerShareGrace = 250 * time.Millisecond

// ShareTimers makes DueTimers read only this server's share of the due
// timers, and the other servers' once they are TimerShareGrace overdue:
// fn says which share is this server's (index) among how many (of; 1 or
// less, all of them). A run's timers belong to share hashtext(run id) mod
// of (Postgres only; the servers sharing a database hash alike). Two
// servers reading the same due timers fired the same runs, and all but
// one of each run's transactions failed their guarded write and were
// decided again: 576 of a sleep run's ≈1,900 fire transactions with two
// nodes (twenty-ninth pass of docs/performance.md). NextDue answers the
// same way (another server's timer is next at its due time plus the
// grace), so a server wakes for its own timers and for the others' once
// they are that late, not for every timer. A server that has not heard
// of another yet fires what the other would also fire; one that still
// counts a server that stopped fires that share late by the grace. In a
// backlog deeper than the grace the servers help each other with the
// oldest timers: at that depth finishing them matters more than the
// transactions two servers may spend on one run.
func (s *Store) ShareTimers(fn func() (index, of int)) { s.share.Store(&fn) }

// FireTimers applies the due timer items (wake, wait_timeout, run_expire)
// of runIDs in one transaction: it locks the runs, takes their items that
// are still due (skipping rows another node holds on Postgres) and the
// expiry of each run not finished whose expires_at has passed, and calls
// fn for each under the run's lock, in due order; each applied item is
// deleted (an expiry has no row: the run it ends is no longer due). Timers
// touch only the database, so no lease is taken before the work: the
// transaction is the work.
//
// An item whose fn fails keeps its row, leased until now+lease so it is
// not due again at once, and its writes are dropped; its error is in errs,
// and the other items commit. An expiry whose fn fails has no row to hold:
// the whole call fails, and the caller holds its runs back as after any
// failed transaction. taken counts the items fn was called for.
//
// read, when given, is the caller's own read of these runs' due items
// (DueTimers). On Postgres, when the runs are in the version cache, the
// transaction is decided on the cached runs and on read, without a
// locking read, and written in one round trip that checks nothing it
// rests on changed: each run is still at its cached version, each item
// still queued, due and not leased, and no timer of the runs due before
// what it applied left out (see optimistic.go). Otherwise, or when the
// check fails, it is decided again the locking way: fn is first called
// with a nil item and transaction, to drop what it did for the decision
// abandoned, then for the items again. Items of these runs the read did
// not reach, due after those it did, wait for a later call.
//
// On SQLite the write goes ahead of other queued writes: a timer's due
// time is a promise, a worker's report can wait one group.
func (s *Store) FireTimers(ctx context.Context, runIDs []string, read []*store.QueueItem, now time.Time, lease time.Duration, fn func(it *store.QueueItem, tx store.RunTx) error) (int, []error, error) {
	if len(runIDs) == 0 {
		return 0, nil, nil
	}
	runIDs = slices.Clone(runIDs)
	sort.Strings(runIDs)
	runIDs = slices.Compact(runIDs)
	cond, ids := s.inStrings("run_id", runIDs)
	itemsQuery := s.q(`SELECT id, kind, run_id, step, attempt, due_at FROM queue WHERE ` + cond + ` AND ` + timersDue + ` ORDER BY due_at, id` + s.d.SkipLocked)
	itemsArgs := append(ids, ts(now), ts(now))
	var taken int
	var errs []error
	called := false // fn was given an item
	// fire applies the items under their runs' locks, the expiries of the
	// locked runs among them (those expiring allows, if not nil), and says
	// which to delete and which to hold for the lease. An expiry has no
	// row to hold: when it fails, the transaction does, and the caller
	// holds its runs back. until, if not nil, gets the latest due time
	// each run's items had.
	fire := func(cs *changeset, runs map[string]*runTx, items []*store.QueueItem, expiring func(id string, at time.Time) bool, until map[string]time.Time) (done, failed []any, err error) {
		// Appended to here: a decision made again starts from the items
		// as given (sorting them in place leaves the same order).
		items = slices.Clip(items)
		for _, id := range runIDs {
			if rt := runs[id]; rt != nil && runLive(rt.run.Status) && !rt.run.ExpiresAt.After(now) && (expiring == nil || expiring(id, rt.run.ExpiresAt)) {
				items = append(items, expiryItem(id, rt.run.ExpiresAt))
			}
		}
		if until != nil {
			for _, it := range items {
				if it.DueAt.After(until[it.RunID]) {
					until[it.RunID] = it.DueAt
				}
			}
		}
		sort.SliceStable(items, func(i, j int) bool { return items[i].DueAt.Before(items[j].DueAt) })
		taken, errs = len(items), nil
		perRun := map[string]int{}
		for _, it := range items {
			perRun[it.RunID]++
		}
		for _, it := range items {
			rt := runs[it.RunID]
			if rt == nil {
				done = append(done, it.ID) // its run is gone: nothing to do
				continue
			}
			if it.Kind == store.KindRunExpire && !runLive(rt.run.Status) {
				taken-- // a timer before it in this call finished the run
				continue
			}
			called = true
			if err := cs.apply(rt, perRun[it.RunID] > 1, func(*changeset) error { return fn(it, rt) }); err != nil {
				if it.Kind == store.KindRunExpire {
					return nil, nil, fmt.Errorf("expiry of run %s: %w", it.RunID, err)
				}
				errs = append(errs, fmt.Errorf("queue item %d (%s of run %s): %w", it.ID, it.Kind, it.RunID, err))
				failed = append(failed, it.ID)
				continue
			}
			if it.Kind != store.KindRunExpire {
				done = append(done, it.ID)
			}
		}
		return done, failed, nil
	}
	// settle deletes the fired items and holds the failed ones.
	settle := func(done, failed []any, err error) ([]PipeQuery, error) {
		if err != nil {
			return nil, err
		}
		var qs []PipeQuery
		if len(done) > 0 {
			cond, done := s.inInts("id", done)
			qs = append(qs, PipeQuery{SQL: s.q(`DELETE FROM queue WHERE ` + cond), Args: done})
		}
		if len(failed) > 0 {
			cond, failed := s.inInts("id", failed)
			qs = append(qs, PipeQuery{SQL: s.q(`UPDATE queue SET lease_token = ?, lease_until = ? WHERE ` + cond), Args: append([]any{token(), ts(now.Add(lease))}, failed...)})
		}
		return qs, nil
	}
	var cs *changeset
	var err error
	if s.d.Pipeline != nil && s.tcache != nil && len(read) > 0 {
		// Postgres, decided on the caller's read and the cached runs:
		// one round trip, or decided again below.
		items, listed, last := dueRead(read, runIDs, now)
		// A run's expiry is applied when the read lists it, or when it is
		// due before a timer of the run the read lists (the loop may have
		// left the expiry out of what it passed: see candidates), never
		// after a timer due later.
		expiring := func(id string, at time.Time) bool { return listed[id] || !at.After(last[id]) }
		var done bool
		cs, done, err = s.optimistic(ctx, runIDs, nil, now, func(_ context.Context, cs *changeset, runs map[string]*runTx, _ map[string]lockedTask) ([]part, bool) {
			if called {
				// Decided a second time (on runs read afresh): what fn
				// did for the first decision is dropped.
				_ = fn(nil, nil)
				called = false
			}
			for _, rt := range runs {
				if status.RunTerminal(rt.run.Status) {
					// Its timers are left over (its end dropped the
					// queue, or a sweep will): the locking way skips
					// rows a sweep holds instead of waiting on them.
					return nil, false
				}
			}
			until := map[string]time.Time{}
			fired, failed, err := fire(cs, runs, items, expiring, until)
			if err != nil || len(failed) > 0 {
				return nil, false
			}
			// A run whose timer changed nothing (a webhook's timeout
			// after its callback came) is written as it stands: its
			// guarded update is what checks that nothing the decision
			// rests on changed, and it locks the run in id order with
			// the others. Otherwise it would send its whole chunk the
			// locking way.
			for _, id := range runIDs {
				if rt := runs[id]; rt != nil {
					cs.run(rt)
				}
			}
			ps := []part{s.noneSkippedPart(until, fired, now)}
			if len(fired) > 0 {
				ps = append(ps, s.firedPart(fired, now))
			}
			return ps, true
		})
		if err != nil {
			return 0, nil, err
		}
		if done {
			s.committed(cs)
			return taken, errs, nil
		}
		if called {
			_ = fn(nil, nil) // the decision is dropped: see above
		}
	}
	if s.d.Pipeline != nil {
		// Postgres: two round trips (see pipeline.go).
		var items []*store.QueueItem
		cs, err = s.pipelined(ctx, runIDs, now, []PipeQuery{{SQL: itemsQuery, Args: itemsArgs, Rows: func(r PipeRows) (err error) {
			items, err = scanQueueItems(r)
			return err
		}}}, func(cs *changeset, runs map[string]*runTx) ([]PipeQuery, error) {
			return settle(fire(cs, runs, items, nil, nil))
		})
	} else {
		err = s.writeUrgent(ctx, func(ctx context.Context, tx *sql.Tx) error {
			cs = &changeset{}
			runs, err := s.lockRuns(ctx, tx, runIDs, now)
			if err != nil {
				return err
			}
			rows, err := tx.QueryContext(ctx, itemsQuery, itemsArgs...)
			if err != nil {
				return fmt.Errorf("lock due items: %w", err)
			}
			items, err := scanQueueItems(rows)
			rows.Close()
			if err != nil {
				return err
			}
			after, err := settle(fire(cs, runs, items, nil, nil))
			if err != nil {
				return err
			}
			if err := s.flush(ctx, tx, cs); err != nil {
				return err
			}
			for _, q := range after {
				if _, err := tx.ExecContext(ctx, q.SQL, q.Args...); err != nil {
					return fmt.Errorf("settle fired items: %w", err)
				}
			}
			return s.stage(ctx, tx, runs, cs)
		})
	}
	if err != nil {
		return 0, nil, err
	}
	s.committed(cs)
	return taken, errs, nil
}

// dueRead is what of read an optimistic FireTimers fires: the queue rows
// of runIDs due at now, in read's order (due time, id), as copies; the
// runs whose expiry (which comes from the run, not a row) read lists as
// due; and each run's latest due time among those rows.
func dueRead(read []*store.QueueItem, runIDs []string, now time.Time) (items []*store.QueueItem, listed map[string]bool, last map[string]time.Time) {
	listed, last = map[string]bool{}, map[string]time.Time{}
	for _, it := range read {
		if it.DueAt.After(now) {
			continue
		}
		if _, ok := slices.BinarySearch(runIDs, it.RunID); !ok {
			continue
		}
		switch {
		case it.Kind == store.KindRunExpire:
			listed[it.RunID] = true
		case slices.Contains(queueTimers, it.Kind) && it.ID != 0:
			c := *it
			items = append(items, &c)
			if c.DueAt.After(last[c.RunID]) {
				last[c.RunID] = c.DueAt
			}
		}
	}
	return items, listed, last
}

// noneSkippedPart is the guard that an optimistic fire left out none of
// its runs' timers due before what it applied: a timer queued after the
// read, due already (a commit of this node, whose version the cache
// holds), or one the read did not reach. The locking way applies a run's
// due timers in due order; one left behind that was due first could have
// changed what the later ones do, or be dropped unapplied by a timer that
// ends the run. until is each run's latest due time applied, fired the
// queue rows applied.
func (s *Store) noneSkippedPart(until map[string]time.Time, fired []any, now time.Time) part {
	runs := make([]any, 0, len(until))
	dues := make([]any, 0, len(until))
	for _, id := range slices.Sorted(maps.Keys(until)) {
		runs, dues = append(runs, id), append(dues, ts(until[id]))
	}
	if fired == nil {
		fired = []any{}
	}
	return part{key: stmtKey{"none skipped", "queue", 0}, args: []any{runs, dues, fired, ts(now), ts(now)}, what: "check the timers left", guard: 1,
		text: func() string {
			return `SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM queue q, (` + s.arrayRows([]string{cText, cInt}, []string{"run", "until"}) + `) AS v ` +
				`WHERE q.run_id = v.run AND q.due_at <= v.until AND NOT (q.id = ANY(CAST(? AS ` + s.cast(cInt) + `[]))) AND ` + timersDue + `)`
		}}
}

// firedPart deletes the queue rows ids that an optimistic fire applied,
// guarded: each must still be queued, due at now and not leased (another
// node's fire, or a failed item held for its lease, left it otherwise).
func (s *Store) firedPart(ids []any, now time.Time) part {
	return part{key: stmtKey{"delete (guarded)", "queue", 0}, args: []any{ids, ts(now), ts(now)}, what: "delete fired queue items", guard: len(ids),
		text: func() string {
			return `DELETE FROM queue WHERE id = ANY(CAST(? AS ` + s.cast(cInt) + `[])) AND ` + timersDue + ` RETURNING 1`
		}}
}

// scanQueueItems reads rows of id, kind, run_id, step, attempt, due_at.
func scanQueueItems(rows PipeRows) ([]*store.QueueItem, error) {
	var items []*store.QueueItem
	for rows.Next() {
		var it store.QueueItem
		var due int64
		if err := rows.Scan(&it.ID, &it.Kind, &it.RunID, &it.Step, &it.Attempt, &due); err != nil {
			return nil, err
		}
		it.DueAt = fromTS(due)
		items = append(items, &it)
	}
	return items, rows.Err()
}

// NextDue is the earliest moment after `after` at which an item of kinds
// becomes due: its due time, or the end of its lease while it is leased.
// Unleased items are found by walking each kind's part of the queue_due
// index from `after`; leased ones (HTTP attempts in flight, failed timers:
// few) through the partial queue_leased index; run expiries through
// runs_expiry. Nothing here reads the whole queue, which holds every
// sleeping run's wake-up.
func (s *Store) NextDue(ctx context.Context, after time.Time, kinds ...string) (time.Time, bool, error) {
	if len(kinds) == 0 {
		kinds = append([]string{store.KindHTTP}, queueTimers...)
	}
	from := int64(math.MinInt64)
	if !after.IsZero() {
		from = ts(after)
	}
	var parts []string
	var args []any
	var vals []any
	index, of := s.timerShare()
	for _, k := range kinds {
		if store.IsTimer(k) && of > 1 {
			// This server's timers when due, the others' when they are
			// TimerShareGrace overdue (see ShareTimers).
			q, col, id := `SELECT due_at FROM queue WHERE kind = ? AND lease_until IS NULL AND due_at > ?`, "due_at", "run_id"
			pre := []any{k}
			if k == store.KindRunExpire {
				q, col, id, pre = `SELECT expires_at FROM runs WHERE `+runsExpiring+` AND expires_at > ?`, "expires_at", "id", nil
			} else {
				vals = append(vals, k)
			}
			hash := fmt.Sprintf(shareHash, "", "", id)
			grace := int64(TimerShareGrace / time.Microsecond)
			parts = append(parts,
				`SELECT (`+q+` AND `+hash+` % ? = ? ORDER BY `+col+` LIMIT 1) AS t`,
				`SELECT (`+q+` AND `+hash+` % ? <> ? ORDER BY `+col+` LIMIT 1) + `+strconv.FormatInt(grace, 10)+` AS t`)
			args = append(append(args, pre...), from, of, index)
			args = append(append(args, pre...), satSub(from, grace), of, index)
			continue
		}
		if k == store.KindRunExpire {
			parts = append(parts, `SELECT (SELECT expires_at FROM runs WHERE `+runsExpiring+` AND expires_at > ? ORDER BY expires_at LIMIT 1) AS t`)
			args = append(args, from)
			continue
		}
		parts = append(parts, `SELECT (SELECT due_at FROM queue WHERE kind = ? AND lease_until IS NULL AND due_at > ? ORDER BY due_at LIMIT 1) AS t`)
		args = append(args, k, from)
		vals = append(vals, k)
	}
	if len(vals) > 0 {
		// kind || '' keeps SQLite from walking a kind's whole part of
		// queue_due for the leased items instead of the small queue_leased.
		cond, vals := s.inList("(kind || '')", vals)
		const end = `CASE WHEN lease_until > due_at THEN lease_until ELSE due_at END`
		parts = append(parts, `SELECT MIN(`+end+`) AS t FROM queue WHERE lease_until IS NOT NULL AND `+cond+` AND `+end+` > ?`)
		args = append(append(args, vals...), from)
	}
	var v sql.NullInt64
	err := s.r.QueryRowContext(ctx, s.q(`SELECT MIN(t) FROM (`+strings.Join(parts, ` UNION ALL `)+`) n`), args...).Scan(&v)
	if err != nil || !v.Valid {
		return time.Time{}, false, err
	}
	return fromTS(v.Int64), true, nil
}

// satSub is a - b, or the smallest value where that would wrap.
func satSub(a, b int64) int64 {
	if a < math.MinInt64+b {
		return math.MinInt64
	}
	return a - b
}

// Sweep removes queue items whose run has finished.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM queue WHERE run_id IN (SELECT id FROM runs WHERE status IN `+statusTerminalSQL+`)`)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// ExtendLease keeps a long-running item leased; failure tells the holder to
// stop, because the item was finished or cancelled elsewhere.
func (s *Store) ExtendLease(ctx context.Context, id int64, leaseToken string, until time.Time) error {
	return s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE queue SET lease_until = ? WHERE id = ? AND lease_token = ?`), ts(until), id, leaseToken)
		if err != nil {
			return fmt.Errorf("extend lease: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("queue item %d: %w", id, store.ErrLeaseLost)
		}
		return nil
	})
}
