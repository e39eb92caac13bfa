package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

const taskCols = `id, type, payload, status, priority, run_at, idempotency_key, attempt, max_attempts, retry_delay_ms, leased_by, lease_token, lease_until, reclaimed, cancel_requested, last_error, result, run_id, step, created_at, updated_at, finished_at`

// taskScan holds what a task's row is scanned into besides the task
// itself: one allocation, where a variable each (their addresses handed to
// Scan) was ten for every task a claim read.
type taskScan struct {
	payload                  string
	idem, tok, result, runID sql.NullString
	runAt, created, updated  int64
	delay                    int64
	leaseUntil, finished     sql.NullInt64
}

func scanTask(row interface{ Scan(...any) error }) (*store.Task, error) {
	t := new(store.Task)
	v := new(taskScan)
	if err := row.Scan(&t.ID, &t.Type, &v.payload, &t.Status, &t.Priority, &v.runAt, &v.idem, &t.Attempt, &t.MaxAttempts, &v.delay, &t.LeasedBy, &v.tok, &v.leaseUntil, &t.Reclaimed, &t.CancelRequested, &t.LastError, &v.result, &v.runID, &t.Step, &v.created, &v.updated, &v.finished); err != nil {
		return nil, err
	}
	t.Payload = json.RawMessage(v.payload)
	t.RunAt, t.CreatedAt, t.UpdatedAt = fromTS(v.runAt), fromTS(v.created), fromTS(v.updated)
	t.IdempotencyKey, t.LeaseToken, t.RunID = v.idem.String, v.tok.String, v.runID.String
	t.RetryDelay = time.Duration(v.delay) * time.Millisecond
	t.LeaseUntil, t.FinishedAt = fromNullTS(v.leaseUntil), fromNullTS(v.finished)
	if v.result.Valid {
		t.Result = json.RawMessage(v.result.String)
	}
	return t, nil
}

func nullJSON(b json.RawMessage) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// prepareTask fills a new task's id, times and status.
func prepareTask(t *store.Task, now time.Time, n *note) {
	if t.ID == "" {
		t.ID = newID()
	}
	t.CreatedAt, t.UpdatedAt = now, now
	if t.Status == "" {
		t.Status = status.TaskPending
	}
	if t.Status == status.TaskPending {
		n.pending(t.RunAt, now)
	}
}

// taskInsertArgs are a new task's taskCols and event_seq (its created
// event, and its claimed event when created leased).
func taskInsertArgs(t *store.Task) []any {
	seq := 1
	if createdLeased(t) {
		seq = 2
	}
	// Room for the row's events, which flushParts appends (see newRun).
	return append(make([]any, 0, 24), t.ID, t.Type, string(t.Payload), t.Status, t.Priority, ts(t.RunAt), nullStr(t.IdempotencyKey), t.Attempt, t.MaxAttempts, t.RetryDelay.Milliseconds(),
		t.LeasedBy, nullStr(t.LeaseToken), tsPtr(t.LeaseUntil), t.Reclaimed, t.CancelRequested, t.LastError, nullJSON(t.Result), nullStr(t.RunID), t.Step,
		ts(t.CreatedAt), ts(t.UpdatedAt), tsPtr(t.FinishedAt), seq)
}

func createdData(t *store.Task) string {
	// encodeData of {"type", and "run_id" and "step" for a step's task},
	// written without the map (keys in encoding/json's sorted order).
	b := make([]byte, 0, 32+len(t.Type)+len(t.RunID)+len(t.Step))
	b = append(b, '{')
	if t.RunID != "" {
		b = append(b, `"run_id":`...)
		b = appendJSONString(b, t.RunID)
		b = append(b, `,"step":`...)
		b = appendJSONString(b, t.Step)
		b = append(b, ',')
	}
	b = append(b, `"type":`...)
	b = appendJSONString(b, t.Type)
	return string(append(b, '}'))
}

// attemptData is {"attempt": n} as encodeData writes it.
func attemptData(n int) []byte {
	return append(strconv.AppendInt([]byte(`{"attempt":`), int64(n), 10), '}')
}

// claimedData is the data of a task's "claimed" event: encodeData of
// {"worker_id", "attempt", "lease_until"}, and how: true for a task leased
// as it is created (how: "eager" or "waiting_claim"; "" for a claim),
// written without the map.
func claimedData(t *store.Task, how string) []byte {
	until := t.LeaseUntil.UTC()
	if y := until.Year(); y < 0 || y > 9999 {
		m := map[string]any{"worker_id": t.LeasedBy, "attempt": t.Attempt, "lease_until": until}
		if how != "" {
			m[how] = true
		}
		return []byte(mustJSON(m))
	}
	b := make([]byte, 0, 128+len(t.LeasedBy))
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, int64(t.Attempt), 10)
	flag := func(name string) {
		if how == name {
			b = append(b, `,"`+name+`":true`...)
		}
	}
	flag("eager")
	b = append(b, `,"lease_until":"`...)
	b = until.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	flag("waiting_claim")
	b = append(b, `,"worker_id":`...)
	b = appendJSONString(b, t.LeasedBy)
	return append(b, '}')
}

// mustJSON is the data of an event the store writes itself (never
// unencodable).
func mustJSON(v any) string {
	b, _ := encodeData(v)
	return string(b)
}

// CreateTask inserts a standalone task, idempotently by key.
func (s *Store) CreateTask(ctx context.Context, t *store.Task, now time.Time) (*store.Task, bool, error) {
	if t.IdempotencyKey != "" {
		if existing, err := s.taskByKey(ctx, t.IdempotencyKey); err == nil {
			return existing, false, nil
		}
	}
	var cs *changeset
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		cs = &changeset{}
		cs.addTask(t, now)
		if err := s.flush(ctx, tx, cs); err != nil {
			if t.IdempotencyKey != "" && s.d.IsUnique(err) {
				return errExisting
			}
			return fmt.Errorf("insert task: %w", err)
		}
		return nil
	})
	if err == nil {
		s.committed(cs)
	}
	if errors.Is(err, errExisting) {
		existing, err := s.taskByKey(ctx, t.IdempotencyKey)
		return existing, false, err
	}
	if err != nil {
		return nil, false, err
	}
	got, err := s.GetTask(ctx, t.ID)
	return got, true, err
}

// taskByKey finds a task by idempotency key; a task found is answered only
// once it is durable (a read may see a commit before its sync).
func (s *Store) taskByKey(ctx context.Context, key string) (*store.Task, error) {
	t, err := scanTask(s.r.QueryRowContext(ctx, s.q(`SELECT `+taskCols+` FROM tasks WHERE idempotency_key = ?`), key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("task with key %q: %w", key, store.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if err := s.durable(ctx); err != nil {
		return nil, err
	}
	return t, nil
}

// GetTask reads one task.
func (s *Store) GetTask(ctx context.Context, id string) (*store.Task, error) {
	t, err := scanTask(s.r.QueryRowContext(ctx, s.q(`SELECT `+taskCols+` FROM tasks WHERE id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("task %q: %w", id, store.ErrNotFound)
	}
	return t, err
}

// typeFilter is the condition that a task's type matches one of patterns
// (every type when there are none), compared byte by byte: an exact type,
// or for a prefix ("billing.%") the range of the types that start with
// it. Task types are ASCII (spec.ValidTaskType), so a prefix with another
// byte matches none, and the types that start with an ASCII prefix run
// up to, not including, the prefix with its last byte's successor. (It
// was LIKE, which SQLite compares without regard to case.)
func (s *Store) typeFilter(patterns []string) (string, []any) {
	if len(patterns) == 0 {
		return "1=1", nil
	}
	var parts []string
	var args []any
	for _, p := range patterns {
		prefix, ok := strings.CutSuffix(p, "%")
		switch {
		case !ascii(prefix):
			// matches no type (and Postgres refuses what is not UTF-8)
		case !ok:
			parts, args = append(parts, "type = ?"), append(args, p)
		case prefix == "":
			return "1=1", nil
		default:
			next := prefix[:len(prefix)-1] + string([]byte{prefix[len(prefix)-1] + 1})
			parts, args = append(parts, "(type >= ? AND type < ?)"), append(args, prefix, next)
		}
	}
	if len(parts) == 0 {
		return "1=0", nil
	}
	return "(" + strings.Join(parts, " OR ") + ")", args
}

// ascii says whether s holds only bytes a task type may hold, and those
// below DEL: ASCII whose successor byte is ASCII too.
func ascii(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// notDisabled leaves out the tasks of disabled types.
const notDisabled = `type NOT IN (SELECT type FROM task_types WHERE enabled = FALSE)`

// ClaimTasks leases tasks and records the events. Ready tasks are found by
// two index walks, due pending tasks in claim order and leases that ran
// out, each stopping at req.Max, and merged here: one query with an OR of
// both made the databases read every pending and leased task and sort them
// on each claim, a cost that grew with the backlog.
func (s *Store) ClaimTasks(ctx context.Context, req store.ClaimTasks) ([]*store.Task, error) {
	c, err := s.ClaimOrNext(ctx, req)
	return c.Tasks, err
}

// ClaimOrNext is ClaimTasks, and when the read before the claim finds
// nothing claimable, that read also says when a task next becomes
// claimable (see store.Store.ClaimOrNext).
func (s *Store) ClaimOrNext(ctx context.Context, req store.ClaimTasks) (store.Claim, error) {
	if req.Max <= 0 {
		return store.Claim{}, nil
	}
	filter, fargs := s.typeFilter(req.Patterns)
	types, err := s.pendingTypes(ctx, req.Patterns, req.Now)
	if err != nil {
		return store.Claim{}, fmt.Errorf("claim tasks: %w", err)
	}
	tok := token()
	until := req.Now.Add(req.Lease)
	now := ts(req.Now)
	// Most claims of an idle worker find nothing: a read answers them
	// without a write transaction (on SQLite without the writer, on
	// Postgres in one round trip instead of two), so a waiting worker is
	// back waiting sooner and a new task is handed to it directly. A task
	// committed after this read wakes the caller, who claims again. After
	// a claim that got all it asked for, work is likely waiting and the
	// read would only delay the claim (a single claim with a task ready
	// took 0.66–0.70 → 0.95–1.17 ms on SQLite), so it is skipped.
	if !s.claimFilled.Load() {
		if c, err := s.claimableOrNext(ctx, types, filter, fargs, now); err != nil || c.NextRead {
			return c, err
		}
	}
	var out store.Claim
	if s.d.Pipeline != nil {
		out, err = s.claimPipelined(ctx, req, types, filter, fargs, tok, until)
	} else {
		out, err = s.claimInTx(ctx, req, types, filter, fargs, tok, until)
	}
	if err != nil {
		return store.Claim{}, err
	}
	s.claimFilled.Store(len(out.Tasks) == req.Max)
	return out, nil
}

// claimReads are a claim's two index walks (see ClaimTasks), each
// locking (SKIP LOCKED, where the database has it) and reading whole up
// to req.Max candidates (the first, up to req.Max of each of types).
func (s *Store) claimReads(req store.ClaimTasks, types []string, filter string, fargs []any) []PipeQuery {
	now := ts(req.Now)
	var qs []PipeQuery
	if len(types) > 0 {
		for _, part := range typeParts(types) {
			due, dueArgs := s.duePending(taskCols+`, event_seq`, part, now, req.Max, true)
			qs = append(qs, PipeQuery{SQL: s.q(due), Args: dueArgs})
		}
	}
	// Leases that ran out: found through tasks_lease, which holds only
	// leased tasks, then sorted (they are few).
	return append(qs, PipeQuery{SQL: s.q(`SELECT ` + taskCols + `, event_seq FROM tasks WHERE status = 'leased' AND lease_until <= ? AND ` + filter + ` AND ` + notDisabled + ` ORDER BY priority, run_at, created_at LIMIT ?` + s.d.SkipLocked), Args: append(append([]any{now}, fargs...), req.Max)})
}

// typesAStatement is the most types one statement walks: each is a term
// of a UNION ALL, and SQLite takes at most 500 (SQLITE_MAX_COMPOUND_SELECT).
const typesAStatement = 64

// typeParts cuts types into the parts statements walk, at least one
// (empty when types is).
func typeParts(types []string) [][]string {
	parts := [][]string{types[:min(len(types), typesAStatement)]}
	for rest := types[len(parts[0]):]; len(rest) > 0; rest = rest[min(len(rest), typesAStatement):] {
		parts = append(parts, rest[:min(len(rest), typesAStatement)])
	}
	return parts
}

// ClaimReads are the statements a claim of req reads its candidates with
// (see claimReads), for tests of their plans.
func (s *Store) ClaimReads(ctx context.Context, req store.ClaimTasks) ([]PipeQuery, error) {
	types, err := s.pendingTypes(ctx, req.Patterns, req.Now)
	if err != nil {
		return nil, err
	}
	filter, fargs := s.typeFilter(req.Patterns)
	return s.claimReads(req, types, filter, fargs), nil
}

// duePending is a statement that selects cols of the pending tasks of
// these types due at now, in claim order within each type, at most limit
// of each type, locking them if lock (where the database locks rows: SKIP
// LOCKED), and its arguments. The caller merges the types (lease sorts
// the candidates in claim order).
//
// The pending tasks' index (tasks_claim) is in claim order within a type:
// type, priority, run_at, created_at. With priority first (before the
// twenty-seventh pass) a claim of one type read every due task of the
// other types that came before its own, a table row each to see its type:
// with 50,000 due and 50,000 scheduled-ahead tasks of another type, an
// idle claim of a type took 21.5 ms on Postgres and 48.6 on SQLite
// (BenchmarkClaimPastOtherType), and every commit that created a task
// woke it to do so again. A type's tasks are now a range of
// the index, so a claim walks its types one after the other and reads
// only their tasks. A claim of several types locks up to limit of each
// (lease signals waiting claims when it leaves some; see lease).
//
// Within a type, the due tasks of a priority come first in the index and
// the ones scheduled ahead after them. One walk in index order went
// through every task scheduled ahead in a priority before it reached the
// next whenever it found fewer than limit due: a claim of 5 due tasks
// among 200,000 scheduled ahead took 6 ms (Postgres, 994 buffers) and 22
// ms (SQLite), and so did the check that nothing is claimable
// (claimableOrNext). Instead the type's priorities are skipped through
// (pendingPriorities) and each is walked over its due tasks alone
// (priority = p AND run_at <= now, an index range): the same claim 0.2 ms
// and 16 buffers, 0.6 ms; a claim finding nothing with 200,000 scheduled
// ahead (this check and nextDue) 2.65 → 0.62 ms on Postgres, 20 → 0.24
// ms on SQLite (twenty-fourth pass).
//
// Postgres does it as a lateral join that stops at limit. There is no
// ORDER BY: the claim order comes from pr's rows coming out in ascending
// priority (a recursive CTE yields its rows in the order it makes them)
// and the nested loop a LATERAL reference forces keeping it, each
// priority's tasks in order. An ORDER BY would run every priority's
// subquery in full and lock up to limit rows in each
// (testTaskClaimPastScheduledAhead pins the order). SQLite, which has no
// LATERAL, does it as an IN over the priorities on the index's second
// column, which it walks value by value in order without a sort
// (TestClaimWalkPlan pins the plan).
//
// The price is a descent for each distinct priority of the type that has
// pending tasks: on Postgres for those a claim passes, on SQLite for all
// of them at every claim, since it builds the IN list first (a claim of
// 16 due tasks with 1,001 priorities of its type 0.08 → 0.7 ms).
// Priorities run from 0 to 1,000; a few in use is the common case, tasks
// scheduled ahead (run_at, retries backing off) a common one too.
func (s *Store) duePending(cols string, types []string, now int64, limit int, lock bool) (string, []any) {
	if len(types) == 0 {
		return `SELECT ` + cols + ` FROM tasks WHERE 1 = 0`, nil
	}
	one := func(typ string) (string, []any) {
		if s.d.Lateral {
			locking := ""
			if lock {
				locking = s.d.SkipLocked
			}
			return pendingPriorities + ` SELECT t.* FROM pr CROSS JOIN LATERAL (SELECT ` + cols + ` FROM tasks WHERE status = 'pending' AND type = ? AND priority = pr.p AND run_at <= ? AND ` + notDisabled +
				` ORDER BY run_at, created_at LIMIT ?` + locking + `) AS t WHERE pr.p IS NOT NULL LIMIT ?`, []any{typ, typ, typ, now, limit, limit}
		}
		return pendingPriorities + ` SELECT ` + cols + ` FROM tasks WHERE status = 'pending' AND type = ? AND priority IN (SELECT p FROM pr WHERE p IS NOT NULL) AND run_at <= ? AND ` + notDisabled +
			` ORDER BY priority, run_at, created_at LIMIT ?`, []any{typ, typ, typ, now, limit}
	}
	return eachType(types, one, func(parts []string) string {
		for i, p := range parts {
			parts[i] = `SELECT * FROM (` + p + `) AS w` + strconv.Itoa(i)
		}
		return strings.Join(parts, ` UNION ALL `)
	})
}

// eachType is the statement of one type for a single type, and for
// several their statements joined by join, with the arguments in order.
func eachType(types []string, one func(string) (string, []any), join func([]string) string) (string, []any) {
	if len(types) == 1 {
		return one(types[0])
	}
	parts := make([]string, len(types))
	var args []any
	for i, typ := range types {
		var a []any
		parts[i], a = one(typ)
		args = append(args, a...)
	}
	return join(parts), args
}

// pendingTypes are the types a claim of patterns at now walks the pending
// tasks of, sorted, each once: of the types that may have pending tasks
// (typeCache), its exact types and those that start with one of its
// prefixes ("billing.%"). A walk costs a few index descents a type even
// when the type has no task (an idle claim of 20 exact types took 2.0 ms
// on Postgres and 3.5 on SQLite walking each, against 0.5 and 1.5 with
// the old index's one walk), so the types with none are left out.
func (s *Store) pendingTypes(ctx context.Context, patterns []string, now time.Time) ([]string, error) {
	if len(patterns) == 0 {
		patterns = []string{"%"}
	}
	all, err := s.ptypes.current(ctx, now, s.readPendingTypes)
	if err != nil {
		return nil, fmt.Errorf("types of pending tasks: %w", err)
	}
	var types []string
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "%"); ok {
			types = append(types, withPrefix(all, prefix)...)
		} else if _, found := slices.BinarySearch(all, p); found {
			types = append(types, p)
		}
	}
	slices.Sort(types)
	return slices.Compact(types), nil
}

// readPendingTypes reads the distinct types of pending tasks, skipping
// from one to the next in tasks_claim (an index descent each).
func (s *Store) readPendingTypes(ctx context.Context) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, `WITH RECURSIVE px(t) AS (SELECT (SELECT type FROM tasks WHERE status = 'pending' ORDER BY type LIMIT 1)
		UNION ALL SELECT (SELECT type FROM tasks WHERE status = 'pending' AND type > px.t ORDER BY type LIMIT 1) FROM px WHERE px.t IS NOT NULL)
		SELECT t FROM px WHERE t IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// addCands adds the candidates a claim read returned to cands.
func addCands(cands *[]lockedTask, rows PipeRows) error {
	found, err := scanLockedTasks(rows)
	for _, lt := range found {
		*cands = append(*cands, lt)
	}
	return err
}

// claimInTx claims in a write transaction: the walks read the candidates
// whole, lease decides in memory, and the changeset writes the leases.
func (s *Store) claimInTx(ctx context.Context, req store.ClaimTasks, types []string, filter string, fargs []any, tok string, until time.Time) (store.Claim, error) {
	var out store.Claim
	var cs *changeset
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var cands []lockedTask
		for _, q := range s.claimReads(req, types, filter, fargs) {
			rows, err := tx.QueryContext(ctx, q.SQL, q.Args...)
			if err != nil {
				return fmt.Errorf("claim tasks: %w", err)
			}
			err = addCands(&cands, rows)
			rows.Close()
			if err != nil {
				return fmt.Errorf("claim tasks: %w", err)
			}
		}
		cs = &changeset{}
		out = s.lease(ctx, cs, cands, req, tok, until)
		return s.flush(ctx, tx, cs)
	})
	if err == nil {
		s.committed(cs)
	}
	return out, err
}

// claimPipelined is a claim in two round trips on Postgres (see
// pipeline.go): BEGIN and both walks, each locking its candidates' rows
// (SKIP LOCKED) and reading them whole; the claim decided in memory; the
// leases and their events written with COMMIT. A claim in a plain
// transaction took six (begin, the walks, the update, the events, commit).
func (s *Store) claimPipelined(ctx context.Context, req store.ClaimTasks, types []string, filter string, fargs []any, tok string, until time.Time) (store.Claim, error) {
	var cands []lockedTask
	qs := s.claimReads(req, types, filter, fargs)
	for i := range qs {
		qs[i].Custom = true
		qs[i].Rows = func(r PipeRows) error { return addCands(&cands, r) }
	}
	var out store.Claim
	cs, err := s.pipelined(ctx, nil, req.Now, qs, func(cs *changeset, _ map[string]*runTx) ([]PipeQuery, error) {
		out = s.lease(ctx, cs, cands, req, tok, until)
		return nil, nil
	})
	if err != nil {
		return store.Claim{}, fmt.Errorf("claim tasks: %w", err)
	}
	// The leased tasks go to the task cache (their reports then need not
	// read them), and the claim's note (see lease) to the commit hook.
	s.committed(cs)
	return out, nil
}

// lease leases the first req.Max of the candidates (read and locked by a
// claim's walks) in cs, with their events: lease_expired for a lease that
// ran out, then claimed. The claim's Since is when each became claimable.
func (s *Store) lease(ctx context.Context, cs *changeset, cands []lockedTask, req store.ClaimTasks, tok string, until time.Time) store.Claim {
	// Times as stored (microseconds), so the tasks handed out equal what
	// a read returns.
	now := fromTS(ts(req.Now))
	until = fromTS(ts(until))
	sort.Slice(cands, func(i, j int) bool { return claimOrder(cands[i].task, cands[j].task) })
	var out store.Claim
	for _, lt := range cands {
		if len(out.Tasks) == req.Max {
			break
		}
		t, seq := lt.task, lt.seq
		if (t.Status == status.TaskLeased || t.Attempt > 0) && req.Exhausted != nil && req.Exhausted(t) {
			// Its final attempt's lease ran out, or (pending, a retry)
			// its final attempt was made before its type's max_attempts
			// was lowered: not leased again, and not in the place of a
			// task that can be.
			out.Exhausted = append(out.Exhausted, t)
			continue
		}
		t.Reclaimed = t.Status == status.TaskLeased
		since := t.RunAt
		switch {
		case t.Reclaimed && t.LeaseUntil != nil:
			since = *t.LeaseUntil
		case t.UpdatedAt.After(since): // created, retried or released since
			since = t.UpdatedAt
		}
		out.Since = append(out.Since, since)
		if t.Reclaimed {
			seq++
			cs.events = append(cs.events, eventRow{owner: t.ID, seq: seq, typ: "lease_expired", data: attemptData(t.Attempt), at: ts(now), cap: taskRowEvents})
		}
		lease := until // each task its own: callers may change one
		t.Status, t.LeasedBy, t.LeaseToken, t.LeaseUntil = status.TaskLeased, req.WorkerID, tok, &lease
		t.Attempt++
		t.UpdatedAt = now
		seq++
		cs.events = append(cs.events, eventRow{owner: t.ID, seq: seq, typ: "claimed", data: claimedData(t, ""), at: ts(now), cap: taskRowEvents})
		cs.task(&taskTx{s: s, ctx: ctx, cs: cs, task: t, now: now, seq: seq})
		out.Tasks = append(out.Tasks, t)
	}
	if len(cands) > len(out.Tasks) && s.d.SkipLocked != "" {
		// The rest were locked until this commits, so a claim at the same
		// time skipped them and may be waiting while they are claimable:
		// wake it.
		cs.note.claimable()
	}
	return out
}

// claimOrder is the order claims hand tasks out in; the id breaks ties
// (the tasks of a fan-out are created at one time), so which of them a
// claim takes does not depend on the order rows came back in.
func claimOrder(a, b *store.Task) bool {
	if a.Priority != b.Priority {
		return a.Priority < b.Priority
	}
	if !a.RunAt.Equal(b.RunAt) {
		return a.RunAt.Before(b.RunAt)
	}
	if !a.CreatedAt.Equal(b.CreatedAt) {
		return a.CreatedAt.Before(b.CreatedAt)
	}
	return a.ID < b.ID
}

// claimableOrNext reads whether a claim of these types would find a task
// (both of its walks, stopping at the first) and, when it would not, when
// one next becomes claimable (the walks of nextDue, which a CASE runs only
// then), in one statement: NextRead set says nothing is claimable. The LIMIT keeps x a subquery of its own:
// Postgres would otherwise fold it into the outer query and run the
// walks once for each of the three uses of ok.
func (s *Store) claimableOrNext(ctx context.Context, types []string, filter string, fargs []any, now int64) (store.Claim, error) {
	var pending, leased sql.NullInt64
	for _, part := range typeParts(types) { // one part but for many types
		nextSQL, nextArgs := nextDue(part, filter, fargs, now)
		due, dueArgs := s.duePending(`1`, part, now, 1, false)
		args := append(append(append(nextArgs, dueArgs...), now), fargs...)
		var ok bool
		var p, l sql.NullInt64
		err := s.r.QueryRowContext(ctx, s.q(`SELECT x.ok, CASE WHEN x.ok THEN NULL ELSE (`+nextSQL[0]+`) END, CASE WHEN x.ok THEN NULL ELSE (`+nextSQL[1]+`) END
		FROM (SELECT EXISTS (`+due+`)
		OR EXISTS (SELECT 1 FROM tasks WHERE status = 'leased' AND lease_until <= ? AND `+filter+` AND `+notDisabled+`) AS ok LIMIT 1) AS x`), args...).Scan(&ok, &p, &l)
		if err != nil {
			return store.Claim{}, fmt.Errorf("claim tasks: %w", err)
		}
		if ok {
			return store.Claim{}, nil
		}
		pending, leased = minNull(pending, p), minNull(leased, l)
	}
	c := store.Claim{NextRead: true}
	c.Next, c.NextOK = earliest(pending, leased)
	return c, nil
}

// minNull is the smaller of two optional values.
func minNull(a, b sql.NullInt64) sql.NullInt64 {
	if !a.Valid || (b.Valid && b.Int64 < a.Int64) {
		return b
	}
	return a
}

// nextDue is NextTaskDue's two walks, each a statement returning one
// value, and their arguments in the order the texts hold them: the
// earliest future run_at of a pending task of these types, and lease end
// of a leased one (filter), each read through its own partial index. Only
// moments after now: a task that is already claimable is not "next" (a
// claim would have taken it).
//
// The pending tasks' index is in claim order within a type, priority
// next, so a type's earliest run_at is taken priority by priority:
// pendingPriorities skips from one of the type's priorities to the next
// (an index descent each), and for each the first future task is a
// descent. A MIN(run_at) over the whole index read every pending task,
// and on Postgres, as a bitmap scan, checked each in the table, dead ones
// too: ≈9 ms and 910 buffers with 50,000 tasks of the worker's types
// scheduled ahead, against 0.3–0.9 ms and 17 buffers (twenty-third pass);
// ≈34 ms at the end of fanout. With the type first in the index (see
// duePending) the tasks of other types ahead are not read at all (before,
// 25–36 ms for a type with none among 50,000 of another).
func nextDue(types []string, filter string, fargs []any, now int64) ([2]string, []any) {
	pending, args := `SELECT CAST(NULL AS BIGINT)`, []any(nil)
	if len(types) > 0 {
		pending, args = eachType(types, func(typ string) (string, []any) {
			return pendingPriorities + ` SELECT MIN((SELECT run_at FROM tasks WHERE status = 'pending' AND type = ? AND priority = pr.p AND run_at > ? AND ` + notDisabled +
				` ORDER BY run_at LIMIT 1)) FROM pr WHERE pr.p IS NOT NULL`, []any{typ, typ, typ, now}
		}, func(parts []string) string {
			for i, p := range parts {
				parts[i] = `SELECT (` + p + `) AS v`
			}
			return `SELECT MIN(v) FROM (` + strings.Join(parts, ` UNION ALL `) + `) AS n`
		})
	}
	return [2]string{
		pending,
		`SELECT MIN(lease_until) FROM tasks WHERE status = 'leased' AND lease_until > ? AND ` + filter + ` AND ` + notDisabled,
	}, append(append(args, now), fargs...)
}

// NextDueRead is the statement NextTaskDue reads when the next pending
// task of patterns is due with, for tests of its plan.
func (s *Store) NextDueRead(ctx context.Context, patterns []string, now time.Time) (PipeQuery, error) {
	types, err := s.pendingTypes(ctx, patterns, now)
	if err != nil {
		return PipeQuery{}, err
	}
	q, args := nextDue(typeParts(types)[0], "1=1", nil, ts(now))
	return PipeQuery{SQL: s.q(q[0]), Args: args[:len(args)-1]}, nil
}

// pendingPriorities is a WITH clause naming pr(p) the distinct
// priorities of the pending tasks of one type (its two arguments) in
// order, each found by an index descent past the one before (the last
// row's p is NULL).
const pendingPriorities = `WITH RECURSIVE pr(p) AS (SELECT (SELECT priority FROM tasks WHERE status = 'pending' AND type = ? ORDER BY priority LIMIT 1)
	UNION ALL SELECT (SELECT priority FROM tasks WHERE status = 'pending' AND type = ? AND priority > pr.p ORDER BY priority LIMIT 1) FROM pr WHERE pr.p IS NOT NULL)`

// earliest is the earlier of two optional moments.
func earliest(a, b sql.NullInt64) (time.Time, bool) {
	switch {
	case a.Valid && (!b.Valid || a.Int64 <= b.Int64):
		return fromTS(a.Int64), true
	case b.Valid:
		return fromTS(b.Int64), true
	}
	return time.Time{}, false
}

// scanTail scans a task followed by extra columns.
type scanTail struct {
	rows  interface{ Scan(...any) error }
	extra []any
}

func (s scanTail) Scan(dest ...any) error { return s.rows.Scan(append(dest, s.extra...)...) }

// NextTaskDue finds the next moment a matching task becomes claimable
// (see nextDue), in one statement.
func (s *Store) NextTaskDue(ctx context.Context, patterns []string, now time.Time) (time.Time, bool, error) {
	types, err := s.pendingTypes(ctx, patterns, now)
	if err != nil {
		return time.Time{}, false, err
	}
	filter, fargs := s.typeFilter(patterns)
	var pending, leased sql.NullInt64
	for _, part := range typeParts(types) {
		q, args := nextDue(part, filter, fargs, ts(now))
		var p, l sql.NullInt64
		if err := s.r.QueryRowContext(ctx, s.q(`SELECT (`+q[0]+`), (`+q[1]+`)`), args...).Scan(&p, &l); err != nil {
			return time.Time{}, false, err
		}
		pending, leased = minNull(pending, p), minNull(leased, l)
	}
	next, ok := earliest(pending, leased)
	return next, ok, nil
}

// InTask locks the task's run (if any) and then the task.
func (s *Store) InTask(ctx context.Context, id string, now time.Time, fn func(store.TaskTx) error) error {
	errs, err := s.InTasks(ctx, []string{id}, nil, now, func(_ int, tx store.TaskTx) error { return fn(tx) })
	if err != nil {
		return err
	}
	return errs[0]
}

// InTasks runs fn for many tasks in one transaction: the runs are locked in
// id order, then the tasks in id order (the order every transaction takes,
// so batches never deadlock each other), all read in a few statements, and
// every successful fn's writes go out together. fn's error for a task is
// returned in errs and drops only that task's writes (the run's in-memory
// state is restored, so later tasks of the same run see what committed
// before). Tasks of one run are applied in ids order, each seeing the
// earlier ones' changes; a task id repeated in ids gets store.ErrRetry: run
// it again in a later call. err is for the transaction as a whole.
//
// fn may run more than once for a task: on Postgres a batch is first
// decided on the runs and tasks this store cached, and decided again the
// locking way when one of them changed since (see optimistic.go). Only
// the last run's writes count; fn must have no other effect a second run
// would repeat.
//
// The runs to lock are known before the transaction: from known (task id
// -> run id, as this store returned it with the task) or read for the
// tasks not in it. A task's run never changes; each locked task is still
// checked against the run its transaction locked. A caller that knows
// every run saves a round trip per batch, which under load on Postgres
// cost more than the statement it ran.
func (s *Store) InTasks(ctx context.Context, ids []string, known map[string]string, now time.Time, fn func(i int, tx store.TaskTx) error) (errs []error, err error) {
	errs = make([]error, len(ids))
	runOf, err := s.taskRuns(ctx, ids, known)
	if err != nil {
		return nil, err
	}
	var runIDs []string
	seenRun, seenTask := map[string]bool{}, map[string]bool{}
	var todo []int
	perRun := map[string]int{} // requests per run
	for i, id := range ids {
		runID, ok := runOf[id]
		switch {
		case !ok:
			errs[i] = fmt.Errorf("task %q: %w", id, store.ErrNotFound)
		case seenTask[id]:
			errs[i] = store.ErrRetry
		default:
			seenTask[id] = true
			perRun[runID]++
			if runID != "" && !seenRun[runID] {
				seenRun[runID] = true
				runIDs = append(runIDs, runID)
			}
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return errs, nil
	}
	taskIDs := make([]string, len(todo))
	for j, i := range todo {
		taskIDs[j] = ids[i]
	}
	apply := func(ctx context.Context, cs *changeset, runs map[string]*runTx, tasks map[string]lockedTask) bool {
		// Room for what the requests' own changesets will merge: a
		// report writes its task and its run and three or four events.
		cs.events = slices.Grow(cs.events, 4*len(todo))
		cs.tasks = slices.Grow(cs.tasks, len(todo))
		cs.runs = slices.Grow(cs.runs, len(runIDs))
		for _, i := range todo {
			t, ok := tasks[ids[i]]
			if !ok {
				errs[i] = fmt.Errorf("task %q: %w", ids[i], store.ErrNotFound)
				continue
			}
			if t.task.RunID != runOf[ids[i]] {
				// A wrong hint: the run this transaction locked is not
				// the task's. Nothing of it is applied.
				errs[i] = fmt.Errorf("task %q belongs to run %q, not %q as given", ids[i], t.task.RunID, runOf[ids[i]])
				continue
			}
			rt := runs[runOf[ids[i]]]
			errs[i] = cs.apply(rt, perRun[runOf[ids[i]]] > 1, func(sub *changeset) error {
				return fn(i, &taskTx{s: s, ctx: ctx, cs: sub, task: t.task, run: rt, now: now, seq: t.seq})
			})
			if errs[i] != nil && t.task.Status == status.TaskPending && !t.task.RunAt.After(now) {
				// Locked until this commits, a claim at the same time
				// skipped it: wake waiting claims (see lease).
				cs.note.claimable()
			}
		}
		return !slices.ContainsFunc(todo, func(i int) bool { return errs[i] != nil })
	}
	var cs *changeset
	if s.d.Pipeline != nil && s.tcache != nil {
		// Postgres, every run and task cached: one round trip (see
		// optimistic.go), or decided again below.
		var done bool
		if cs, done, err = s.optimistic(ctx, runIDs, taskIDs, now, func(ctx context.Context, cs *changeset, runs map[string]*runTx, tasks map[string]lockedTask) ([]part, bool) {
			return nil, apply(ctx, cs, runs, tasks)
		}); err != nil {
			return nil, err
		}
		if done {
			s.committed(cs)
			return errs, nil
		}
		for _, i := range todo {
			errs[i] = nil
		}
	}
	if s.d.Pipeline != nil {
		// Postgres: two round trips (see pipeline.go).
		var tasks map[string]lockedTask
		q, args := s.lockTasksQuery(taskIDs)
		cs, err = s.pipelined(ctx, runIDs, now, []PipeQuery{{SQL: q, Args: args, Rows: func(r PipeRows) (err error) {
			tasks, err = scanLockedTasks(r)
			return err
		}}}, func(cs *changeset, runs map[string]*runTx) ([]PipeQuery, error) {
			apply(ctx, cs, runs, tasks)
			return nil, nil
		})
	} else {
		err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
			cs = &changeset{}
			runs, err := s.lockRuns(ctx, tx, runIDs, now)
			if err != nil {
				return err
			}
			tasks, err := s.writerTasks(ctx, tx, taskIDs)
			if err != nil {
				return err
			}
			apply(ctx, cs, runs, tasks)
			if err := s.flush(ctx, tx, cs); err != nil {
				return err
			}
			return s.stage(ctx, tx, runs, cs)
		})
	}
	if err != nil {
		return nil, err
	}
	s.committed(cs)
	return errs, nil
}

// taskRuns maps task ids to their run ids ("" for standalone tasks), from
// known and for the others from the table; a task's run never changes, so
// this is read outside the transaction.
func (s *Store) taskRuns(ctx context.Context, ids []string, known map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(ids))
	var args []any
	for _, id := range ids {
		if run, ok := known[id]; ok {
			out[id] = run
		} else {
			args = append(args, id)
		}
	}
	if len(args) == 0 {
		return out, nil
	}
	cond, args := s.inList("id", args)
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT id, run_id FROM tasks WHERE `+cond), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var runID sql.NullString
		if err := rows.Scan(&id, &runID); err != nil {
			return nil, err
		}
		out[id] = runID.String
	}
	return out, rows.Err()
}

type lockedTask struct {
	task *store.Task
	seq  int64
}

// lockTasks locks tasks in id order and reads them.
func (s *Store) lockTasks(ctx context.Context, tx querier, ids []string) (map[string]lockedTask, error) {
	q, args := s.lockTasksQuery(ids)
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("lock tasks: %w", err)
	}
	defer rows.Close()
	return scanLockedTasks(rows)
}

// writerTasks is lockTasks for SQLite's writer: the tasks it wrote last
// leased come from its cache (see runCache), the others from the table.
func (s *Store) writerTasks(ctx context.Context, tx querier, ids []string) (map[string]lockedTask, error) {
	if s.cache == nil {
		return s.lockTasks(ctx, tx, ids)
	}
	out := make(map[string]lockedTask, len(ids))
	var miss []string
	for _, id := range ids {
		e := s.cache.task(id)
		if e == nil {
			miss = append(miss, id)
			continue
		}
		t := e.task // a private copy
		out[id] = lockedTask{task: &t, seq: e.seq}
	}
	if len(out) > 0 {
		s.cache.taskHits.Add(int64(len(out)))
		if s.cache.check {
			if err := s.checkTaskHits(ctx, tx, out); err != nil {
				return nil, err
			}
		}
	}
	if len(miss) > 0 {
		read, err := s.lockTasks(ctx, tx, miss)
		if err != nil {
			return nil, err
		}
		maps.Copy(out, read)
	}
	return out, nil
}

// lockTasksQuery locks and reads tasks in id order.
func (s *Store) lockTasksQuery(ids []string) (string, []any) {
	sorted := append([]string(nil), ids...)
	sort.Strings(sorted)
	args := make([]any, len(sorted))
	for i, id := range sorted {
		args[i] = id
	}
	cond, args := s.inList("id", args)
	return s.q(`SELECT ` + taskCols + `, event_seq FROM tasks WHERE ` + cond + ` ORDER BY id` + s.d.LockRun), args
}

// scanLockedTasks reads lockTasksQuery's rows.
func scanLockedTasks(rows PipeRows) (map[string]lockedTask, error) {
	out := map[string]lockedTask{}
	for rows.Next() {
		var seq int64
		t, err := scanTask(scanTail{rows, []any{&seq}})
		if err != nil {
			return nil, err
		}
		out[t.ID] = lockedTask{task: t, seq: seq}
	}
	return out, rows.Err()
}

// taskTx reads the task from memory and records writes in the changeset.
type taskTx struct {
	s    *Store
	ctx  context.Context
	cs   *changeset
	task *store.Task
	run  *runTx
	now  time.Time
	seq  int64
}

func (t *taskTx) Task() *store.Task { return t.task }

func (t *taskTx) Now() time.Time { return t.now }

func (t *taskTx) Run() store.RunTx {
	if t.run == nil {
		return nil
	}
	return t.run
}

func (t *taskTx) UpdateTask(k *store.Task) error {
	k.UpdatedAt = t.now
	t.task = k
	t.cs.task(t)
	if k.Status == status.TaskPending {
		t.cs.note.pending(k.RunAt, t.now) // retried or released
	}
	return nil
}

func (t *taskTx) AppendTask(events ...store.NewEvent) error {
	if len(events) == 0 {
		return nil
	}
	t.cs.task(t)
	return t.cs.addEvents(t.task.ID, taskRowEvents, &t.seq, t.now, events)
}

// CreateTask adds a step's task to the run's transaction.
func (t *runTx) CreateTask(k *store.Task) error {
	k.RunID = t.run.ID
	t.cs.addTask(k, t.now)
	return nil
}

// CancelTasks cancels those of the run's tasks named by ids that are
// unfinished when the changeset is written.
func (t *runTx) CancelTasks(ids ...string) error {
	if len(ids) > 0 {
		t.cs.cancel = append(t.cs.cancel, cancelTasks{run: t, ids: ids})
	}
	return nil
}

// ---- task types ----

// PutTaskType creates or replaces a registry entry.
func (s *Store) PutTaskType(ctx context.Context, tt *store.TaskType) (*store.TaskType, error) {
	now := ts(time.Now())
	_, err := s.w.ExecContext(ctx, s.q(`INSERT INTO task_types (type, description, enabled, max_attempts, retry_delay_ms, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (type) DO UPDATE SET description = excluded.description, enabled = excluded.enabled, max_attempts = excluded.max_attempts, retry_delay_ms = excluded.retry_delay_ms, updated_at = excluded.updated_at`),
		tt.Type, tt.Description, tt.Enabled, tt.MaxAttempts, tt.RetryDelay.Milliseconds(), now, now)
	if err != nil {
		return nil, fmt.Errorf("put task type: %w", err)
	}
	if err := s.durable(ctx); err != nil {
		return nil, err
	}
	// Waiting tasks of a re-enabled type are claimable now; every node's
	// cached entry for the type is stale.
	s.committed(&changeset{note: note{c: store.Committed{Tasks: tt.Enabled, Registry: true}}})
	return s.GetTaskType(ctx, tt.Type)
}

func scanTaskType(row interface{ Scan(...any) error }) (*store.TaskType, error) {
	var tt store.TaskType
	var delay, created, updated int64
	if err := row.Scan(&tt.Type, &tt.Description, &tt.Enabled, &tt.MaxAttempts, &delay, &created, &updated); err != nil {
		return nil, err
	}
	tt.RetryDelay = time.Duration(delay) * time.Millisecond
	tt.CreatedAt, tt.UpdatedAt = fromTS(created), fromTS(updated)
	return &tt, nil
}

// GetTaskType reads a registry entry.
func (s *Store) GetTaskType(ctx context.Context, typ string) (*store.TaskType, error) {
	tt, err := scanTaskType(s.r.QueryRowContext(ctx, s.q(`SELECT type, description, enabled, max_attempts, retry_delay_ms, created_at, updated_at FROM task_types WHERE type = ?`), typ))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("task type %q: %w", typ, store.ErrNotFound)
	}
	return tt, err
}

// ListTaskTypes lists the registry by type.
func (s *Store) ListTaskTypes(ctx context.Context) ([]*store.TaskType, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT type, description, enabled, max_attempts, retry_delay_ms, created_at, updated_at FROM task_types ORDER BY type`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*store.TaskType
	for rows.Next() {
		tt, err := scanTaskType(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, tt)
	}
	return out, rows.Err()
}

// ExpiredTaskLeases lists leased tasks whose lease has ended on their
// final attempt. Those with attempts left are not listed: the next claim
// takes them over, and the first limit of them, read by the end of their
// leases, used to keep every final one behind them (a type whose workers
// all died) from being failed at all.
func (s *Store) ExpiredTaskLeases(ctx context.Context, now time.Time, defaultMax, limit int) ([]*store.Task, error) {
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT `+taskCols+` FROM tasks WHERE status = 'leased' AND lease_until <= ?
		AND attempt >= COALESCE(NULLIF(max_attempts, 0), (SELECT NULLIF(tt.max_attempts, 0) FROM task_types tt WHERE tt.type = tasks.type), ?)
		ORDER BY lease_until LIMIT ?`), ts(now), defaultMax, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*store.Task
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}
