package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ferryhq/ferry/internal/store"
)

const runCols = `r.id, r.workflow_id, w.name, r.version, r.status, r.input, r.trigger_headers, r.idempotency_key, r.error, r.expires_at, r.started_at, r.finished_at, r.updated_at`

// runListCols are runCols for a list, which shows neither a run's input
// nor its trigger headers (store.Store.ListRuns): a page of 500 runs of 1
// MiB inputs read 500 MiB into the server for nothing.
const runListCols = `r.id, r.workflow_id, w.name, r.version, r.status, '' AS input, '{}' AS trigger_headers, r.idempotency_key, r.error, r.expires_at, r.started_at, r.finished_at, r.updated_at`

func scanRun(row interface{ Scan(...any) error }) (*store.Run, error) {
	var r store.Run
	var input, headers string
	var idem sql.NullString
	var expires, started, updated int64
	var finished sql.NullInt64
	if err := row.Scan(&r.ID, &r.WorkflowID, &r.WorkflowName, &r.Version, &r.Status, &input, &headers, &idem, &r.Error, &expires, &started, &finished, &updated); err != nil {
		return nil, err
	}
	r.Input = json.RawMessage(input)
	if err := json.Unmarshal([]byte(headers), &r.TriggerHeaders); err != nil {
		return nil, fmt.Errorf("decode trigger headers: %w", err)
	}
	r.IdempotencyKey = idem.String
	r.ExpiresAt, r.StartedAt, r.UpdatedAt = fromTS(expires), fromTS(started), fromTS(updated)
	r.FinishedAt = fromNullTS(finished)
	return &r, nil
}

const stepCols = `run_id, name, position, type, status, attempt, callback_token, status_code, duration_ms, request, body, headers, is_truncated, blocked, error, wake_at, started_at, finished_at`

func scanStep(row interface{ Scan(...any) error }) (*store.StepRun, error) {
	var s store.StepRun
	var token, request, headers sql.NullString
	var code, dur, wake, started, finished sql.NullInt64
	if err := row.Scan(&s.RunID, &s.Name, &s.Position, &s.Type, &s.Status, &s.Attempt, &token, &code, &dur, &request, &s.Body, &headers, &s.Truncated, &s.Blocked, &s.Error, &wake, &started, &finished); err != nil {
		return nil, err
	}
	s.CallbackToken = token.String
	if code.Valid {
		c := int(code.Int64)
		s.StatusCode = &c
	}
	if dur.Valid {
		d := dur.Int64
		s.DurationMS = &d
	}
	if request.Valid {
		s.Request = json.RawMessage(request.String)
	}
	if headers.Valid && headers.String != "" {
		if err := json.Unmarshal([]byte(headers.String), &s.Headers); err != nil {
			return nil, fmt.Errorf("decode step headers: %w", err)
		}
	}
	s.WakeAt, s.StartedAt, s.FinishedAt = fromNullTS(wake), fromNullTS(started), fromNullTS(finished)
	return &s, nil
}

func stepArgs(s *store.StepRun) []any {
	var code, dur any
	if s.StatusCode != nil {
		code = *s.StatusCode
	}
	if s.DurationMS != nil {
		dur = *s.DurationMS
	}
	var request, headers any
	if len(s.Request) > 0 {
		request = string(s.Request)
	}
	if s.Headers != nil {
		b, _ := json.Marshal(s.Headers)
		headers = string(b)
	}
	var body any
	if len(s.Body) > 0 {
		// Plain bytes: pgx sends a json.RawMessage as JSON, not bytea. An
		// empty body is NULL: both databases then read it back as nil.
		body = []byte(s.Body)
	}
	return []any{s.Status, s.Attempt, nullStr(s.CallbackToken), code, dur, request, body, headers, s.Truncated, s.Blocked, s.Error, tsPtr(s.WakeAt), tsPtr(s.StartedAt), tsPtr(s.FinishedAt)}
}

// CreateRun writes a run and its initial work in one transaction.
func (s *Store) CreateRun(ctx context.Context, nr *store.NewRun, now time.Time) (*store.Run, bool, error) {
	res, err := s.CreateRuns(ctx, []*store.NewRun{nr}, now)
	if err != nil {
		return nil, false, err
	}
	return res[0].Run, res[0].Created, res[0].Err
}

// CreateRuns writes many runs in one transaction, each with its steps,
// queue items, tasks and events. A run whose idempotency key already names
// a run of its workflow is not written: its result is that run with
// Created false. A key repeated within nrs gets store.ErrRetry for all but
// the first. The runs written are written together: another server writing
// one of the keys meanwhile makes the whole call start again (the keys are
// read again), never a part of it stick.
func (s *Store) CreateRuns(ctx context.Context, nrs []*store.NewRun, now time.Time) ([]store.CreateResult, error) {
	return s.createRuns(ctx, nrs, now, 0)
}

// maxKeyRaces bounds how often CreateRuns starts again because another
// server wrote one of its keys between the read and the insert.
const maxKeyRaces = 4

func (s *Store) createRuns(ctx context.Context, nrs []*store.NewRun, now time.Time, race int) ([]store.CreateResult, error) {
	res := make([]store.CreateResult, len(nrs))
	existing, err := s.runsByKey(ctx, nrs)
	if err != nil {
		return nil, err
	}
	if len(existing) > 0 {
		// Found by a read: answered once it is durable.
		if err := s.durable(ctx); err != nil {
			return nil, err
		}
	}
	var todo []int
	seen := map[[2]string]bool{}
	for i, nr := range nrs {
		r := &nr.Run
		if r.ID == "" {
			r.ID = newID()
		}
		k := [2]string{r.WorkflowID, r.IdempotencyKey}
		switch {
		case r.IdempotencyKey == "":
			todo = append(todo, i)
		case existing[k] != "":
			res[i].Run = &store.Run{ID: existing[k]}
		case seen[k]:
			res[i].Err = store.ErrRetry
		default:
			seen[k] = true
			todo = append(todo, i)
		}
	}
	// Keyed runs go in key order: two batches inserting the same keys in
	// opposite orders would each hold one and wait for the other.
	sort.SliceStable(todo, func(a, b int) bool {
		ra, rb := nrs[todo[a]].Run, nrs[todo[b]].Run
		if ra.WorkflowID != rb.WorkflowID {
			return ra.WorkflowID < rb.WorkflowID
		}
		return ra.IdempotencyKey < rb.IdempotencyKey
	})
	var cs *changeset
	var stale map[int]bool // runs whose workflow changed since it was read
	add := func(cs *changeset) error {
		cs.sizeFor(nrs, todo)
		for _, i := range todo {
			if !stale[i] {
				if err := cs.newRun(nrs[i], now, s.shortRun(len(nrs[i].Steps))); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if len(todo) > 0 {
		if q, args, ok := s.workflowsCheck(nrs, todo); ok && s.d.Pipeline != nil {
			// Postgres: one round trip, or when that writes nothing (a
			// workflow is not as the runs were made from) two more (see
			// pipeline.go).
			var done bool
			cs, done, err = s.createGuarded(ctx, nrs, todo, add)
			if err == nil && !done {
				cs, err = s.pipelined(ctx, nil, now, []PipeQuery{{SQL: q, Args: args, Rows: func(r PipeRows) error {
					states, err := scanWorkflowStates(r)
					stale = staleOf(nrs, todo, states)
					return err
				}}}, func(cs *changeset, _ map[string]*runTx) ([]PipeQuery, error) {
					return nil, add(cs)
				})
			}
		} else {
			err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
				cs = &changeset{}
				var err error
				if stale, err = s.staleWorkflows(ctx, tx, nrs, todo); err != nil {
					return err
				}
				if err := add(cs); err != nil {
					return err
				}
				if err := s.flush(ctx, tx, cs); err != nil {
					return err
				}
				if s.cache != nil {
					for _, i := range todo {
						if !stale[i] {
							s.cache.created(nrs[i], now, s.shortRun(len(nrs[i].Steps)))
						}
					}
				}
				return nil
			})
		}
		switch {
		case err != nil && s.d.IsUnique(err) && anyKey(nrs, todo) && race < maxKeyRaces:
			// Another server wrote a key meanwhile (the keys are read
			// before the transaction): nothing was written; read them
			// again and write the rest.
			return s.createRuns(ctx, nrs, now, race+1)
		case err != nil:
			return nil, fmt.Errorf("create runs: %w", err)
		default:
			if s.vcache != nil && cs.xid != "" {
				// Postgres: the runs' rows carry this transaction's id as
				// their version until they are next written, so their
				// first outcome or wake-up reads no steps.
				for _, i := range todo {
					if stale[i] {
						continue
					}
					if e := createdEntry(nrs[i], now, s.shortRun(len(nrs[i].Steps))); e != nil {
						e.version = cs.xid
						cs.cacheIDs, cs.cacheRuns = append(cs.cacheIDs, nrs[i].Run.ID), append(cs.cacheRuns, e)
					}
				}
			}
			s.committed(cs)
			for _, i := range todo {
				if stale[i] {
					res[i].Err = store.ErrWorkflowChanged
					continue
				}
				res[i] = store.CreateResult{Run: &store.Run{ID: nrs[i].Run.ID}, Created: true}
				if nrs[i].Workflow != nil {
					// Its workflow's name was checked in the transaction:
					// the run is known as written, without reading it.
					if res[i].Run, err = createdRun(nrs[i], now); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	// Read back what was found, and runs whose workflow's name is not
	// known here, as GetRun would return them.
	var ids []string
	for i, r := range res {
		if r.Run != nil && !(r.Created && nrs[i].Workflow != nil) {
			ids = append(ids, r.Run.ID)
		}
	}
	got, err := s.runsByID(ctx, ids)
	if err != nil {
		return nil, err
	}
	for i := range res {
		if res[i].Run != nil && !(res[i].Created && nrs[i].Workflow != nil) {
			if res[i].Run = got[res[i].Run.ID]; res[i].Run == nil {
				return nil, fmt.Errorf("run %s vanished after it was written", nrs[i].Run.ID)
			}
		}
	}
	return res, nil
}

// readBackHeaders is h as a run's row gives it back, through its JSON:
// never nil, and invalid UTF-8 replaced. Valid strings come back as they
// are, so those are copied without the round trip (a marshal and an
// unmarshal for the result and again for the cache entry of each run
// created: 1.10 → 0.75 µs a run for both).
func readBackHeaders(h map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			b, err := headersJSON(h)
			if err != nil {
				return nil, fmt.Errorf("encode trigger headers: %w", err)
			}
			out = nil
			if err := json.Unmarshal(b, &out); err != nil {
				return nil, fmt.Errorf("decode trigger headers: %w", err)
			}
			return out, nil
		}
		out[k] = v
	}
	return out, nil
}

// createdRun is the run nr as written at now (changeset.newRun), as GetRun
// reads it back: times to the microsecond, headers through their JSON.
func createdRun(nr *store.NewRun, now time.Time) (*store.Run, error) {
	r := nr.Run
	r.WorkflowName = nr.Workflow.Name
	r.Input = append(make(json.RawMessage, 0, len(r.Input)), r.Input...) // the caller's copy is the caller's: one copy, not a string's and then bytes
	h, err := readBackHeaders(r.TriggerHeaders)
	if err != nil {
		return nil, err
	}
	r.TriggerHeaders = h
	r.ExpiresAt, r.StartedAt, r.UpdatedAt = fromTS(ts(r.ExpiresAt)), fromTS(ts(r.StartedAt)), fromTS(ts(now))
	if r.FinishedAt != nil {
		f := fromTS(ts(*r.FinishedAt))
		r.FinishedAt = &f
	}
	return &r, nil
}

// staleWorkflows reads, inside the writing transaction, the workflows that
// runs todo were built from (NewRun.Workflow) and returns the runs whose
// workflow is no longer as read: renamed, disabled, deleted or at another
// version. Callers may so build runs from a cached workflow and still
// never start a run of a workflow disabled before the run committed: the
// rows are read under a shared lock, which an update waits for.
func (s *Store) staleWorkflows(ctx context.Context, tx querier, nrs []*store.NewRun, todo []int) (map[int]bool, error) {
	q, args, ok := s.workflowsCheck(nrs, todo)
	if !ok {
		return nil, nil
	}
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("check workflows: %w", err)
	}
	defer rows.Close()
	states, err := scanWorkflowStates(rows)
	if err != nil {
		return nil, err
	}
	return staleOf(nrs, todo, states), nil
}

// createGuarded writes the new runs todo of nrs (Postgres) in one round
// trip: BEGIN, the workflows' check, the write and COMMIT. The locking
// way first reads their workflows with shared locks, in a round trip of
// its own, to tell the runs whose workflow changed since they were made
// from it; here a statement sent with the write takes those locks and
// fails the transaction unless every workflow is enabled, not deleted,
// so named and at the version its runs carry. done false: nothing was
// written, and the caller writes the runs the locking way, which tells
// the refused ones apart. That is so when a workflow was not as its runs
// carry it, or two of the runs name one workflow differently, and also
// when the batch cancels tasks or its write would pass maxStmtParams
// (the locking way writes those statement by statement).
func (s *Store) createGuarded(ctx context.Context, nrs []*store.NewRun, todo []int, add func(*changeset) error) (_ *changeset, done bool, err error) {
	want := map[string]wfState{}
	for _, i := range todo {
		w := nrs[i].Workflow
		if w == nil {
			continue
		}
		st := wfState{name: w.Name, version: nrs[i].Run.Version, live: true}
		if was, ok := want[w.ID]; ok && was != st {
			return nil, false, nil
		}
		want[w.ID] = st
	}
	cs := &changeset{}
	if err := add(cs); err != nil {
		return nil, false, err
	}
	parts, events := s.flushParts(cs)
	all := append(parts[:len(parts):len(parts)], events()...)
	if len(cs.cancel) > 0 || params(all) > maxStmtParams {
		return nil, false, nil
	}
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return nil, false, err
	}
	defer conn.Close()
	open := true // until COMMIT has answered
	defer func() {
		if open {
			s.abort(ctx, conn)
		}
	}()
	stale, err := s.writeGuarded(ctx, conn, append(s.beginGeneric(), s.workflowsGuard(want)), cs, all)
	if err != nil || stale {
		return nil, false, err
	}
	open = false
	if err := s.stage(ctx, conn, nil, cs); err != nil {
		cs.cacheIDs, cs.cacheRuns = nil, nil
	}
	return cs, true, nil
}

// workflowsGuard locks, as workflowsCheck does, the workflows of want,
// and fails (as a guarded write does: see withStmt) unless each is still
// as want has it. It is a statement of its own, ahead of the write: the
// lock in a clause of the write statement cost Postgres more than this
// statement and the write together (a run's creation 0.84–0.96 ms
// against 0.29–0.50).
func (s *Store) workflowsGuard(want map[string]wfState) PipeQuery {
	ids := slices.Sorted(maps.Keys(want))
	idArgs, names, versions := make([]any, len(ids)), make([]any, len(ids)), make([]any, len(ids))
	for i, id := range ids {
		idArgs[i], names[i], versions[i] = id, want[id].name, int64(want[id].version)
	}
	return PipeQuery{SQL: s.stmt(stmtKey{"guard", "workflows", 0}, func() string {
		return `SELECT CAST(CASE WHEN (SELECT count(*) FROM (SELECT 1 FROM workflows w JOIN (` + s.arrayRows([]string{cText, cText, cInt}, []string{"id", "name", "version"}) + `) AS v
			ON w.id = v.id AND w.name = v.name AND w.version = v.version WHERE w.enabled AND w.deleted_at IS NULL ORDER BY w.id FOR SHARE OF w) l) = ? THEN '1' ELSE '` + guardFailed + `' END AS int)`
	}),
		Args: []any{idArgs, names, versions, int64(len(ids))}}
}

// wfState is a workflow row as the writing transaction sees it.
type wfState struct {
	name    string
	version int
	live    bool
}

// workflowsCheck reads the workflows of the new runs, with shared locks:
// a concurrent update or delete of one waits for this transaction, or this
// one reads what it committed. ok is false when no run names its workflow.
func (s *Store) workflowsCheck(nrs []*store.NewRun, todo []int) (string, []any, bool) {
	var ids []string
	for _, i := range todo {
		if w := nrs[i].Workflow; w != nil && !slices.Contains(ids, w.ID) {
			ids = append(ids, w.ID)
		}
	}
	if len(ids) == 0 {
		return "", nil, false
	}
	cond, args := s.inStrings("id", ids)
	return s.q(`SELECT id, name, version, enabled AND deleted_at IS NULL FROM workflows WHERE ` + cond + ` ORDER BY id` + s.d.ShareLock), args, true
}

func scanWorkflowStates(rows PipeRows) (map[string]wfState, error) {
	out := map[string]wfState{}
	for rows.Next() {
		var id string
		var c wfState
		if err := rows.Scan(&id, &c.name, &c.version, &c.live); err != nil {
			return nil, err
		}
		out[id] = c
	}
	return out, rows.Err()
}

// staleOf are the new runs whose workflow is no longer live, enabled, so
// named and at that version.
func staleOf(nrs []*store.NewRun, todo []int, states map[string]wfState) map[int]bool {
	stale := map[int]bool{}
	for _, i := range todo {
		w := nrs[i].Workflow
		if w == nil {
			continue
		}
		if c, ok := states[w.ID]; !ok || !c.live || c.name != w.Name || c.version != nrs[i].Run.Version {
			stale[i] = true
		}
	}
	return stale
}

func anyKey(nrs []*store.NewRun, idx []int) bool {
	for _, i := range idx {
		if nrs[i].Run.IdempotencyKey != "" {
			return true
		}
	}
	return false
}

// runsByKey maps (workflow id, idempotency key) to existing run ids.
func (s *Store) runsByKey(ctx context.Context, nrs []*store.NewRun) (map[[2]string]string, error) {
	var args []any
	for _, nr := range nrs {
		if nr.Run.IdempotencyKey != "" {
			args = append(args, nr.Run.IdempotencyKey)
		}
	}
	out := map[[2]string]string{}
	if len(args) == 0 {
		return out, nil
	}
	cond, args := s.inList("idempotency_key", args)
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT id, workflow_id, idempotency_key FROM runs WHERE `+cond), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id, wf, key string
		if err := rows.Scan(&id, &wf, &key); err != nil {
			return nil, err
		}
		out[[2]string{wf, key}] = id
	}
	return out, rows.Err()
}

// TriggerHeaders reads the runs' trigger headers, 512 runs a statement.
func (s *Store) TriggerHeaders(ctx context.Context, ids []string) (map[string]map[string]string, error) {
	out := make(map[string]map[string]string, len(ids))
	for len(ids) > 0 {
		part := ids[:min(512, len(ids))]
		ids = ids[len(part):]
		cond, args := s.inStrings("id", part)
		if err := s.triggerHeaders(ctx, cond, args, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Store) triggerHeaders(ctx context.Context, cond string, args []any, out map[string]map[string]string) error {
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT id, trigger_headers FROM runs WHERE `+cond), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, headers string
		if err := rows.Scan(&id, &headers); err != nil {
			return err
		}
		var h map[string]string
		if err := json.Unmarshal([]byte(headers), &h); err != nil {
			return fmt.Errorf("run %s: decode trigger headers: %w", id, err)
		}
		out[id] = h
	}
	return rows.Err()
}

func (s *Store) runsByID(ctx context.Context, ids []string) (map[string]*store.Run, error) {
	out := make(map[string]*store.Run, len(ids))
	for len(ids) > 0 {
		part := ids[:min(512, len(ids))]
		ids = ids[len(part):]
		args := make([]any, len(part))
		for i, id := range part {
			args[i] = id
		}
		cond, args := s.inList("r.id", args)
		rows, err := s.r.QueryContext(ctx, s.q(`SELECT `+runCols+` FROM runs r JOIN workflows w ON w.id = r.workflow_id WHERE `+cond), args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			r, err := scanRun(rows)
			if err != nil {
				rows.Close()
				return nil, err
			}
			out[r.ID] = r
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// GetRun returns a run and its steps in definition order.
func (s *Store) GetRun(ctx context.Context, id string) (*store.Run, []*store.StepRun, error) {
	// The run's row and its step rows are read in one snapshot: a write
	// moves steps between them both ways (see packedsteps.go), and two
	// reads on their own could each miss a step that moved in between.
	opts := &sql.TxOptions{ReadOnly: true}
	if s.postgres() {
		opts.Isolation = sql.LevelRepeatableRead
	}
	tx, err := s.r.BeginTx(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	defer tx.Rollback()
	var packed string
	run, err := scanRun(scanTail{tx.QueryRowContext(ctx, s.q(`SELECT `+runCols+`, r.steps FROM runs r JOIN workflows w ON w.id = r.workflow_id WHERE r.id = ?`), id), []any{&packed}})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, fmt.Errorf("run %q: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, nil, err
	}
	rt := &runTx{run: run, packed: packed}
	if err := s.readSteps(ctx, tx, []string{id}, map[string]*runTx{id: rt}); err != nil {
		return nil, nil, err
	}
	return run, rt.steps, tx.Commit()
}

// ListRuns pages a workflow's runs, newest first (ids are time-ordered).
func (s *Store) ListRuns(ctx context.Context, workflowID string, p store.Page) ([]*store.Run, string, error) {
	n := limit(p)
	query := `SELECT ` + runListCols + ` FROM runs r JOIN workflows w ON w.id = r.workflow_id WHERE r.workflow_id = ?`
	args := []any{workflowID}
	if p.Cursor != "" {
		query += ` AND r.id < ?`
		args = append(args, p.Cursor)
	}
	query += ` ORDER BY r.id DESC LIMIT ?`
	args = append(args, n+1)
	rows, err := s.r.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	var out []*store.Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, "", err
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > n {
		out = out[:n]
		next = out[n-1].ID
	}
	return out, next, nil
}

// ListEvents returns a run's or task's events after a sequence number.
// A task's and a run's first events are in its row (see taskRowEvents,
// runRowEvents and runEvents), the rest and those written before migrations 0009 and
// 0014 in the events table, where a row
// may pack several (see eventRows) and is numbered by its last: one
// statement reads both, so the page is a prefix of the log as of one
// moment. The LIMIT counts rows, each of one event or more, so it never
// cuts the page short.
func (s *Store) ListEvents(ctx context.Context, owner string, afterSeq int64, lim int) ([]*store.Event, error) {
	if lim <= 0 || lim > 1000 {
		lim = 1000
	}
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT seq, type, step, data, at, earlier FROM (SELECT seq, type, step, data, at, earlier FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?) e
		UNION ALL SELECT 0, type, step, run_id, created_at, events FROM tasks WHERE id = ? AND events <> ''
		UNION ALL SELECT 0, '', '', NULL, 0, events FROM runs WHERE id = ? AND events <> ''`), owner, afterSeq, lim, owner, owner)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*store.Event
	for rows.Next() {
		e := store.Event{RunID: owner}
		var data, packed sql.NullString
		var at int64
		if err := rows.Scan(&e.Seq, &e.Type, &e.Step, &data, &at, &packed); err != nil {
			return nil, err
		}
		if packed.Valid {
			if rest, ok := strings.CutPrefix(packed.String, createdMark); ok && e.Seq == 0 {
				// A task's row: its columns are the created event's.
				if afterSeq < 1 {
					k := store.Task{Type: e.Type, Step: e.Step, RunID: data.String}
					out = append(out, &store.Event{RunID: owner, Seq: 1, Type: "created", Data: json.RawMessage(createdData(&k)), At: fromTS(at)})
				}
				packed.String = rest
			}
			evs, err := unpackEvents(owner, packed.String, afterSeq)
			if err != nil {
				return nil, err
			}
			out = append(out, evs...)
		}
		if e.Seq == 0 { // a task's or run's row: its events are all packed
			continue
		}
		if data.Valid {
			e.Data = json.RawMessage(data.String)
		}
		e.At = fromTS(at)
		out = append(out, &e)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b *store.Event) int { return cmp.Compare(a.Seq, b.Seq) })
	return out[:min(len(out), lim)], nil
}

// unpackEvents reads the events packed in a row (eventRow.rowJSON's: a
// task's or run's row or an events row's earlier) numbered after
// afterSeq, in either form rows hold them (see rowJSON).
func unpackEvents(owner, packed string, afterSeq int64) ([]*store.Event, error) {
	var elems []json.RawMessage
	if err := json.Unmarshal([]byte("["+strings.TrimPrefix(packed, ",")+"]"), &elems); err != nil {
		return nil, fmt.Errorf("events of %s: %w", owner, err)
	}
	var out []*store.Event
	for _, raw := range elems {
		e, err := rowEvent(raw)
		if err != nil {
			return nil, fmt.Errorf("events of %s: %w", owner, err)
		}
		if e.Seq > afterSeq {
			e.RunID = owner
			out = append(out, e)
		}
	}
	return out, nil
}

// rowEvent decodes one event of a row: [seq,"type",at], then the step
// (when a string) and the data (see rowJSON), or the object form rows
// held before migration 18.
func rowEvent(raw json.RawMessage) (*store.Event, error) {
	var e store.Event
	var at int64
	if raw[0] != '[' {
		var o struct {
			Seq  int64           `json:"seq"`
			Type string          `json:"type"`
			Step string          `json:"step"`
			Data json.RawMessage `json:"data"`
			At   int64           `json:"at"`
		}
		if err := json.Unmarshal(raw, &o); err != nil {
			return nil, err
		}
		e.Seq, e.Type, e.Step, e.Data, at = o.Seq, o.Type, o.Step, o.Data, o.At
	} else {
		var f []json.RawMessage
		if err := json.Unmarshal(raw, &f); err != nil {
			return nil, err
		}
		if len(f) < 3 || len(f) > 5 {
			return nil, fmt.Errorf("an event of %d fields: %.40s", len(f), raw)
		}
		rest := f[3:]
		if len(rest) > 0 && rest[0][0] == '"' {
			if err := json.Unmarshal(rest[0], &e.Step); err != nil {
				return nil, err
			}
			rest = rest[1:]
		}
		if len(rest) > 1 {
			return nil, fmt.Errorf("an event with data before its step: %.40s", raw)
		}
		if len(rest) == 1 {
			e.Data = rest[0]
		}
		if err := errors.Join(json.Unmarshal(f[0], &e.Seq), json.Unmarshal(f[1], &e.Type), json.Unmarshal(f[2], &at)); err != nil {
			return nil, err
		}
	}
	e.At = fromTS(at)
	return &e, nil
}

// StepByToken finds a webhook step by its callback token. A step with a
// token is never kept in its run's row; a step_runs row whose step the
// run's row holds is stale (the step lost its token since), so its token
// finds nothing.
func (s *Store) StepByToken(ctx context.Context, tok string) (string, string, error) {
	var runID, step, packed string
	err := s.r.QueryRowContext(ctx, s.q(`SELECT s.run_id, s.name, r.steps FROM step_runs s JOIN runs r ON r.id = s.run_id WHERE s.callback_token = ?`), tok).Scan(&runID, &step, &packed)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", fmt.Errorf("callback token: %w", store.ErrNotFound)
	}
	if err != nil {
		return "", "", err
	}
	inRow, _, err := unpackSteps(runID, packed)
	if err != nil {
		return "", "", err
	}
	if slices.ContainsFunc(inRow, func(st *store.StepRun) bool { return st.Name == step }) {
		return "", "", fmt.Errorf("callback token: %w", store.ErrNotFound)
	}
	return runID, step, nil
}

// CountRuns counts a workflow's runs by status.
func (s *Store) CountRuns(ctx context.Context, workflowID string) (map[string]int, error) {
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT status, COUNT(*) FROM runs WHERE workflow_id = ? GROUP BY status`), workflowID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, err
		}
		out[st] = n
	}
	return out, rows.Err()
}
