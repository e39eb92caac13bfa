package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/store"
)

const runCols = `r.id, r.workflow_id, w.name, r.version, r.status, r.input, r.trigger_headers, r.idempotency_key, r.error, r.expires_at, r.started_at, r.finished_at, r.updated_at`

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
	if s.Body != nil {
		// Plain bytes: a json.RawMessage would be sent as JSON text,
		// not as bytea, in a pipelined (simple-protocol) write.
		body = []byte(s.Body)
	}
	return []any{s.Status, s.Attempt, nullStr(s.CallbackToken), code, dur, request, body, headers, s.Truncated, s.Blocked, s.Error, tsPtr(s.WakeAt), tsPtr(s.StartedAt), tsPtr(s.FinishedAt)}
}

type execer interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}

func (s *Store) insertStep(ctx context.Context, tx execer, st *store.StepRun) error {
	args := append([]any{st.RunID, st.Name, st.Position, st.Type}, stepArgs(st)...)
	_, err := tx.ExecContext(ctx, s.q(`INSERT INTO step_runs (`+stepCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`), args...)
	if err != nil {
		return fmt.Errorf("insert step %s: %w", st.Name, err)
	}
	return nil
}

func (s *Store) enqueue(ctx context.Context, tx execer, items []store.QueueItem, n *note) error {
	for _, it := range items {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO queue (kind, run_id, step, attempt, due_at) VALUES (?, ?, ?, ?, ?)`),
			it.Kind, it.RunID, it.Step, it.Attempt, ts(it.DueAt)); err != nil {
			return fmt.Errorf("enqueue %s: %w", it.Kind, err)
		}
		n.queued(it.DueAt)
	}
	return nil
}

func (s *Store) appendEvents(ctx context.Context, tx execer, runID string, seq *int64, now time.Time, evs []store.NewEvent) error {
	// One multi-row INSERT per batch: a round trip per event was a large
	// share of a decision's cost.
	const per = 100
	for len(evs) > 0 {
		batch := evs[:min(per, len(evs))]
		evs = evs[len(batch):]
		var sb strings.Builder
		sb.WriteString(`INSERT INTO events (run_id, seq, type, step, data, at) VALUES `)
		args := make([]any, 0, len(batch)*6)
		for i, e := range batch {
			*seq++
			var data any
			if e.Data != nil {
				b, err := json.Marshal(e.Data)
				if err != nil {
					return fmt.Errorf("encode event: %w", err)
				}
				data = string(b)
			}
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(`(?, ?, ?, ?, ?, ?)`)
			args = append(args, runID, *seq, e.Type, e.Step, data, ts(now))
		}
		if _, err := tx.ExecContext(ctx, s.q(sb.String()), args...); err != nil {
			return fmt.Errorf("append events: %w", err)
		}
	}
	return nil
}

// CreateRun writes a run and its initial work in one transaction.
func (s *Store) CreateRun(ctx context.Context, nr *store.NewRun, now time.Time) (*store.Run, bool, error) {
	r := nr.Run
	if r.ID == "" {
		r.ID = newID()
	}
	headers, err := json.Marshal(r.TriggerHeaders)
	if err != nil {
		return nil, false, err
	}
	if r.TriggerHeaders == nil {
		headers = []byte("{}")
	}
	var existing string
	var n note
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		n = note{}
		if r.IdempotencyKey != "" {
			err := tx.QueryRowContext(ctx, s.q(`SELECT id FROM runs WHERE workflow_id = ? AND idempotency_key = ?`), r.WorkflowID, r.IdempotencyKey).Scan(&existing)
			if err == nil {
				return errExisting
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		var seq int64
		w := s.newWbuf(tx)
		if err := s.appendEvents(ctx, w, r.ID, &seq, now, nr.Events); err != nil {
			return err
		}
		if _, err := w.ExecContext(ctx, s.q(`INSERT INTO runs (id, workflow_id, version, status, input, trigger_headers, idempotency_key, error, event_seq, expires_at, started_at, finished_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			r.ID, r.WorkflowID, r.Version, r.Status, string(r.Input), string(headers), nullStr(r.IdempotencyKey), r.Error, seq, ts(r.ExpiresAt), ts(r.StartedAt), tsPtr(r.FinishedAt), ts(now)); err != nil {
			if r.IdempotencyKey != "" && s.d.IsUnique(err) {
				return errExisting // lost a race with the same key
			}
			return fmt.Errorf("insert run: %w", err)
		}
		for _, st := range nr.Steps {
			st.RunID = r.ID
			if err := s.insertStep(ctx, w, st); err != nil {
				return err
			}
		}
		for i := range nr.Queue {
			nr.Queue[i].RunID = r.ID
		}
		if err := s.enqueue(ctx, w, nr.Queue, &n); err != nil {
			return err
		}
		for _, t := range nr.Tasks {
			t.RunID = r.ID
			if err := s.insertTask(ctx, w, t, now, &n); err != nil {
				return fmt.Errorf("insert task: %w", err)
			}
		}
		if err := w.flush(ctx); err != nil {
			if r.IdempotencyKey != "" && s.d.IsUnique(err) {
				return errExisting // lost a race with the same key
			}
			return fmt.Errorf("create run: %w", err)
		}
		return nil
	})
	if err == nil {
		s.committed(&n)
	}
	if errors.Is(err, errExisting) {
		if existing == "" {
			if err := s.r.QueryRowContext(ctx, s.q(`SELECT id FROM runs WHERE workflow_id = ? AND idempotency_key = ?`), r.WorkflowID, r.IdempotencyKey).Scan(&existing); err != nil {
				return nil, false, err
			}
		}
		run, _, err := s.GetRun(ctx, existing)
		return run, false, err
	}
	if err != nil {
		return nil, false, err
	}
	run, _, err := s.GetRun(ctx, r.ID)
	return run, true, err
}

// GetRun returns a run and its steps in definition order.
func (s *Store) GetRun(ctx context.Context, id string) (*store.Run, []*store.StepRun, error) {
	run, err := scanRun(s.r.QueryRowContext(ctx, s.q(`SELECT `+runCols+` FROM runs r JOIN workflows w ON w.id = r.workflow_id WHERE r.id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, fmt.Errorf("run %q: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, nil, err
	}
	steps, err := s.loadSteps(ctx, s.r, id)
	return run, steps, err
}

type querier interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

func (s *Store) loadSteps(ctx context.Context, q querier, runID string) ([]*store.StepRun, error) {
	rows, err := q.QueryContext(ctx, s.q(`SELECT `+stepCols+` FROM step_runs WHERE run_id = ? ORDER BY position`), runID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*store.StepRun
	for rows.Next() {
		st, err := scanStep(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, rows.Err()
}

// ListRuns pages a workflow's runs, newest first (ids are time-ordered).
func (s *Store) ListRuns(ctx context.Context, workflowID string, p store.Page) ([]*store.Run, string, error) {
	n := limit(p)
	query := `SELECT ` + runCols + ` FROM runs r JOIN workflows w ON w.id = r.workflow_id WHERE r.workflow_id = ?`
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

// ListEvents returns a run's events after a sequence number.
func (s *Store) ListEvents(ctx context.Context, runID string, afterSeq int64, lim int) ([]*store.Event, error) {
	if lim <= 0 || lim > 1000 {
		lim = 1000
	}
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT run_id, seq, type, step, data, at FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?`), runID, afterSeq, lim)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*store.Event
	for rows.Next() {
		var e store.Event
		var data sql.NullString
		var at int64
		if err := rows.Scan(&e.RunID, &e.Seq, &e.Type, &e.Step, &data, &at); err != nil {
			return nil, err
		}
		if data.Valid {
			e.Data = json.RawMessage(data.String)
		}
		e.At = fromTS(at)
		out = append(out, &e)
	}
	return out, rows.Err()
}

// StepByToken finds a webhook step by its callback token.
func (s *Store) StepByToken(ctx context.Context, tok string) (string, string, error) {
	var runID, step string
	err := s.r.QueryRowContext(ctx, s.q(`SELECT run_id, name FROM step_runs WHERE callback_token = ?`), tok).Scan(&runID, &step)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", fmt.Errorf("callback token: %w", store.ErrNotFound)
	}
	return runID, step, err
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
