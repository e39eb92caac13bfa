package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// querier is what statements go through: a *sql.Tx, a pool for reads, or
// on Postgres a *sql.Conn inside a transaction that a pipeline began (see
// pipeline.go).
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// errExisting makes a write's transaction roll back without failing the
// call: the caller found the row it would have created.
var errExisting = errors.New("existing row")

// write runs fn in a write transaction and returns once it is committed.
//
// With group commit (SQLite), requests from many goroutines are applied by
// one writer in one transaction, each inside its own savepoint so a failing
// request rolls back alone, and acknowledged after the single commit: one
// WAL sync for the whole group instead of one per request, and nothing is
// acknowledged before it is durable. Without it (Postgres, where concurrent
// connections already share WAL flushes), each call is its own transaction.
func (s *Store) write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if s.group == nil {
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck
		if err := fn(ctx, tx); err != nil {
			return err
		}
		return tx.Commit()
	}
	return s.group.do(ctx, fn, false)
}

// writeUrgent is write for work with a due time (timers): with group commit
// it goes ahead of every queued request and cuts the group being written
// short (see groupCommit.run), instead of waiting behind whatever is queued.
func (s *Store) writeUrgent(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if s.group == nil {
		return s.write(ctx, fn)
	}
	return s.group.do(ctx, fn, true)
}

// groupCommit is the single writer of a SQLite store.
//
// With a sync function (SQLite's default durability), the database commits
// without waiting for the disk and the writer goes on with the next group
// at once, while a second goroutine makes the committed groups durable —
// one sync for every group committed meanwhile — and only then answers
// their requests. The disk's sync time, which was as long as the rest of a
// group's work, no longer holds up the writer, and nothing is acknowledged
// before it is durable.
type groupCommit struct {
	db    *sql.DB
	cache *runCache // may be nil
	reqs  chan *writeReq
	// urgent requests are taken before reqs and make groups of their own,
	// cutting short an ordinary group being written (see run).
	urgent chan *writeReq
	// share is how long an ordinary group that follows an urgent one is
	// written before urgent requests may cut it (ordinaryShare).
	share  time.Duration
	max    int
	stop   chan struct{}
	done   sync.WaitGroup
	sync   func() error     // nil: a commit is durable when it returns
	synced chan []*writeReq // committed groups waiting for the sync
	sdone  sync.WaitGroup
	// broken is the first failed sync: after it nothing is known to be on
	// disk (Linux reports a lost write once), so every later request fails.
	broken atomic.Pointer[error]
	// mu orders sends before close: a request sent before close is in
	// reqs when the writer sees stop, and it is answered.
	mu     sync.RWMutex
	closed bool
}

// ordinaryShare is the writer time ordinary requests get between two
// groups of urgent ones when both wait.
const ordinaryShare = 5 * time.Millisecond

type writeReq struct {
	ctx  context.Context
	fn   func(ctx context.Context, tx *sql.Tx) error
	err  error
	done chan struct{}
}

func newGroupCommit(db *sql.DB, max int, cache *runCache, sync func() error) *groupCommit {
	g := &groupCommit{db: db, cache: cache, reqs: make(chan *writeReq, 4*max), urgent: make(chan *writeReq, 4*max), share: ordinaryShare, max: max, stop: make(chan struct{}), sync: sync}
	g.done.Add(1)
	go g.loop()
	if sync != nil {
		g.synced = make(chan []*writeReq, 64)
		g.sdone.Add(1)
		go g.syncLoop()
	}
	return g
}

// syncLoop makes committed groups durable, then answers their requests,
// in commit order. Groups that commit while a sync runs share the next.
func (g *groupCommit) syncLoop() {
	defer g.sdone.Done()
	for first := range g.synced {
		groups := [][]*writeReq{first}
	more:
		for {
			select {
			case b, ok := <-g.synced:
				if !ok {
					break more
				}
				groups = append(groups, b)
			default:
				break more
			}
		}
		err := g.failed()
		if err == nil {
			if err = g.sync(); err != nil {
				err = fmt.Errorf("sync: %w (the store stops writing: what was written since the last sync may not be on disk)", err)
				g.broken.CompareAndSwap(nil, &err)
			}
		}
		for _, b := range groups {
			for _, r := range b {
				if err != nil && r.err == nil {
					// Committed, but not known to be on disk: the caller
					// must not take it as done.
					r.err = err
				}
				close(r.done)
			}
		}
	}
}

// failed is the error of the first failed sync, if any.
func (g *groupCommit) failed() error {
	if p := g.broken.Load(); p != nil {
		return *p
	}
	return nil
}

func (g *groupCommit) do(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error, urgent bool) error {
	if err := g.failed(); err != nil {
		return err
	}
	r := &writeReq{ctx: ctx, fn: fn, done: make(chan struct{})}
	q := g.reqs
	if urgent {
		q = g.urgent
	}
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return errors.New("store closed")
	}
	select {
	case q <- r:
	case <-ctx.Done():
		g.mu.RUnlock()
		return ctx.Err()
	}
	g.mu.RUnlock()
	// Wait even if ctx ends: the request may already be in a transaction,
	// and the caller must learn whether it committed.
	<-r.done
	return r.err
}

// barrier returns once everything committed before it is durable: its
// group commits nothing and is answered after the sync that follows.
func (g *groupCommit) barrier(ctx context.Context) error {
	return g.do(ctx, func(context.Context, *sql.Tx) error { return nil }, false)
}

func (g *groupCommit) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	close(g.stop)
	g.done.Wait()
	if g.synced != nil {
		close(g.synced)
		g.sdone.Wait()
	}
}

func (g *groupCommit) loop() {
	defer g.done.Done()
	var carry []*writeReq // cut from a group for urgent requests: next after them
	lastUrgent := false
	for {
		// A new slice each time: a committed group may still wait for its
		// sync. Urgent requests make a group of their own, but not twice in
		// a row while ordinary requests wait: a backlog of timers would
		// otherwise hold every report, trigger and cancel until it is gone.
		batch := make([]*writeReq, 0, g.max)
		if !lastUrgent || (len(carry) == 0 && len(g.reqs) == 0) {
			batch = g.takeUrgent(batch, g.max)
		}
		urgent := len(batch) > 0
		if !urgent && len(carry) > 0 {
			batch, carry = carry, nil
		}
		if len(batch) == 0 {
			select {
			case <-g.stop:
				g.closeQueued()
				return
			case r := <-g.urgent:
				batch = g.takeUrgent(append(batch, r), g.max)
				urgent = true
			case r := <-g.reqs:
				batch = append(batch, r)
			}
		}
		if !urgent {
		drain:
			for len(batch) < g.max {
				select {
				case r := <-g.reqs:
					batch = append(batch, r)
				default:
					break drain
				}
			}
		}
		// The ordinary group after an urgent one is cut for urgent
		// requests only once it had its share of the writer.
		var cutAfter time.Time
		if !urgent && lastUrgent {
			cutAfter = time.Now().Add(g.share)
		}
		if rest := g.run(batch, urgent, cutAfter); len(rest) > 0 {
			carry = append(rest, carry...)
		}
		lastUrgent = urgent
		select {
		case <-g.stop:
			for _, r := range carry {
				r.err = errors.New("store closed")
				close(r.done)
			}
			g.closeQueued()
			return
		default:
		}
	}
}

// closeQueued fails what is still queued once the store closes.
func (g *groupCommit) closeQueued() {
	for {
		select {
		case r := <-g.urgent:
			r.err = errors.New("store closed")
			close(r.done)
		case r := <-g.reqs:
			r.err = errors.New("store closed")
			close(r.done)
		default:
			return
		}
	}
}

// takeUrgent appends the urgent requests waiting now, while batch holds
// fewer than n.
func (g *groupCommit) takeUrgent(batch []*writeReq, n int) []*writeReq {
	for len(batch) < n {
		select {
		case r := <-g.urgent:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// run writes batch as one transaction and hands it to the sync. A group
// of ordinary requests is cut short when urgent ones arrive (from
// cutAfter on): it commits what it has written, and the requests not yet
// started are returned, to be written after the urgent ones. An urgent
// request then waits for at most one request and one commit (or an
// ordinary group's share), and its answer for its own group's sync, not
// for a full group behind it.
func (g *groupCommit) run(batch []*writeReq, urgent bool, cutAfter time.Time) (rest []*writeReq) {
	finish := func(err error) {
		for _, r := range batch {
			if err != nil && r.err == nil {
				r.err = err
			}
			close(r.done)
		}
	}
	if err := g.failed(); err != nil {
		finish(err)
		return
	}
	tx, err := g.db.BeginTx(context.Background(), nil)
	if err != nil {
		finish(fmt.Errorf("begin: %w", err))
		return
	}
	if g.cache != nil {
		if err := g.cache.begin(context.Background(), tx); err != nil {
			_ = tx.Rollback()
			finish(err)
			return
		}
	}
	// fail gives up on the whole group: nothing of it is written.
	fail := func(err error) {
		_ = tx.Rollback()
		if g.cache != nil {
			g.cache.reset()
		}
		finish(err)
	}
	ok := 0
	for i := 0; i < len(batch); i++ {
		if i > 0 && !urgent && len(g.urgent) > 0 && (cutAfter.IsZero() || time.Now().After(cutAfter)) {
			batch, rest = batch[:i], batch[i:]
			break
		}
		r := batch[i]
		if err := r.ctx.Err(); err != nil {
			r.err = err
			continue
		}
		if _, err := tx.Exec(`SAVEPOINT w`); err != nil {
			r.err = err
			continue
		}
		// A cancelled statement would interrupt SQLite, which rolls back
		// the whole transaction, other requests included: once started, a
		// request runs to its end.
		err := r.fn(context.WithoutCancel(r.ctx), tx)
		if g.cache != nil {
			g.cache.endRequest(err == nil)
		}
		if err != nil {
			r.err = err
			if _, rbErr := tx.Exec(`ROLLBACK TO w`); rbErr != nil {
				// The transaction is unusable: give up on the whole group.
				fail(fmt.Errorf("rollback to savepoint: %w", rbErr))
				return
			}
		} else {
			ok++
		}
		if _, err := tx.Exec(`RELEASE w`); err != nil {
			fail(fmt.Errorf("release savepoint: %w", err))
			return
		}
	}
	if ok == 0 {
		// Every request rolled back to its savepoint: none staged a run.
		_ = tx.Rollback()
		if g.sync != nil {
			// Their answers may rest on earlier groups' writes (a row
			// found existing): not before those are on disk.
			g.synced <- batch
			return
		}
		finish(nil)
		return
	}
	if err := tx.Commit(); err != nil {
		// Nothing of the group is durable: every request fails.
		for _, r := range batch {
			r.err = fmt.Errorf("commit: %w", err)
		}
		if g.cache != nil {
			g.cache.reset()
		}
		finish(nil)
		return
	}
	if g.cache != nil {
		g.cache.commit()
	}
	if g.sync != nil {
		g.synced <- batch // answered once durable
		return rest
	}
	finish(nil)
	return rest
}
