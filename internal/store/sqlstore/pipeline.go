package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"slices"
	"time"
)

// On Postgres a report batch was six round trips (begin, the tasks' runs,
// lock runs, lock tasks, write, commit), and under load on two cores a
// round trip cost about 300 µs of waiting for both processes to be
// scheduled, ten times what Postgres spent on the lock reads themselves.
// A pipeline sends several statements at once and reads their results in
// order, so a batch whose runs are known becomes two round trips:
//
//	BEGIN; lock runs; lock tasks     (one round trip)
//	decide, in memory
//	write; COMMIT                    (one round trip)
//
// The statements of one pipeline run one after the other, so the runs are
// still locked before the tasks. A run whose steps are not in the version
// cache costs one more round trip, and a batch that cancels tasks (a run
// cut short) writes as flush does, then commits.
//
// Every statement is prepared once per connection, and Postgres then
// plans it again at each execution (a custom plan) while it judges a plan
// made for the arguments cheaper than a generic one. For the batch's write
// statement, five data-modifying clauses joined to column arrays, planning
// took as long as executing (≈0.3 ms each), and the lock reads were planned
// four times as long as they ran. Their best plan does not depend on the
// arguments (key lookups through primary keys), so a pipelined transaction
// switches to generic plans (Dialect.Generic) right after BEGIN, or after
// the statements marked Custom (a claim's ordered walks with a limit,
// which need the plan for their arguments).

// PipeQuery is one statement of a pipeline: its text (placeholders already
// rewritten for the dialect), its arguments and, for a statement with
// rows, what reads them. A reader's error does not stop the statements
// after it (they were sent together): none may fail in a pipeline that
// carries a COMMIT.
type PipeQuery struct {
	SQL  string
	Args []any
	Rows func(PipeRows) error
	// Commit marks a COMMIT: it fails when the server answers that it
	// rolled back (the transaction had been aborted).
	Commit bool
	// Custom marks a statement whose best plan depends on its arguments
	// (an ordered walk with a limit): it is planned for them, and the
	// transaction moves to generic plans only after it.
	Custom bool
}

// commit ends a pipelined transaction.
var commit = PipeQuery{SQL: "COMMIT", Commit: true}

// PipeRows are the rows of one statement (a *sql.Rows satisfies it).
type PipeRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// pipelined runs a Postgres transaction in two round trips: BEGIN, the
// lock read of runIDs and more (lock reads whose rows their Rows keep) go
// as one; the runs get their steps, decide fills
// a changeset in memory and names statements to send after the write; the
// write, those and COMMIT go as the other. It returns the changeset
// committed.
func (s *Store) pipelined(ctx context.Context, runIDs []string, now time.Time, more []PipeQuery, decide func(cs *changeset, runs map[string]*runTx) (after []PipeQuery, err error)) (_ *changeset, err error) {
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// From the first pipeline on, a transaction may be open on conn:
	// whatever goes wrong, it is rolled back (or the connection dropped)
	// before conn goes back to the pool.
	done := false
	defer func() {
		if !done {
			s.abort(ctx, conn)
		}
	}()
	runs := make(map[string]*runTx, len(runIDs))
	locks := []PipeQuery{{SQL: "BEGIN"}}
	// generic switches plans; see the comment at the top.
	var generic []PipeQuery
	if s.d.Generic != "" {
		generic = []PipeQuery{{SQL: s.d.Generic}}
		if !slices.ContainsFunc(more, func(q PipeQuery) bool { return q.Custom }) {
			locks, generic = append(locks, generic...), nil
		}
	}
	if len(runIDs) > 0 {
		q, args := s.runRowsQuery(runIDs)
		locks = append(locks, PipeQuery{SQL: q, Args: args, Rows: func(r PipeRows) error { return s.scanRunRows(ctx, conn, r, now, runs) }})
	}
	locks = append(locks, more...)
	if err := s.d.Pipeline(ctx, conn, locks); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if err := s.versionedSteps(ctx, conn, runs, now); err != nil {
		return nil, err
	}
	cs := &changeset{}
	after, err := decide(cs, runs)
	if err != nil {
		return nil, err
	}
	parts, events := s.flushParts(cs)
	all := append(parts[:len(parts):len(parts)], events()...)
	if len(cs.cancel) == 0 && len(all) > 0 && params(all) <= maxStmtParams {
		q, args := s.withStmt(all)
		qs := append(generic, PipeQuery{SQL: q, Args: args, Rows: func(r PipeRows) error {
			// Never an error: COMMIT is already on its way. Without the
			// id, the runs are left uncached (stage fails below).
			if r.Next() {
				_ = r.Scan(&cs.xid)
			}
			return nil
		}})
		err = s.d.Pipeline(ctx, conn, append(append(qs, after...), commit))
	} else {
		if len(all) > 0 && len(generic) > 0 {
			err = s.d.Pipeline(ctx, conn, generic)
		}
		if err == nil {
			err = s.writeParts(ctx, conn, cs, parts, events)
		}
		if err == nil {
			err = s.d.Pipeline(ctx, conn, append(after, commit))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	done = true
	// The cache entries this commit makes true (they need its xid). It has
	// committed: a failure here only leaves those runs uncached.
	if err := s.stage(ctx, conn, runs, cs); err != nil {
		cs.cacheIDs, cs.cacheRuns = nil, nil
	}
	return cs, nil
}

// abort ends whatever transaction conn holds; if that fails, conn is
// dropped instead of going back to the pool.
func (s *Store) abort(ctx context.Context, conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}

func params(parts []part) int {
	n := 0
	for _, p := range parts {
		n += len(p.args)
	}
	return n
}
