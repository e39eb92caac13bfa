package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync"
	"sync/atomic"

	msqlite "modernc.org/sqlite"
)

// Prepared-statement cache.
//
// modernc.org/sqlite implements driver.ExecerContext and driver.QueryerContext,
// so database/sql hands it the SQL text of every ExecContext and QueryContext,
// and the driver parses and plans the statement anew each time: about a third
// of Ferry's CPU under load went to the SQLite parser. The wrapper below hides
// those two interfaces, which makes database/sql prepare a statement for each
// call and close it afterwards, and answers PrepareContext from a bounded
// per-connection LRU of modernc statements keyed by the SQL text. Closing a
// cached statement returns it to the cache; it is finalized when evicted or
// when its connection closes.
//
// Each cached statement is checked out from PrepareContext until database/sql
// closes it, which it does after the call's Rows are closed (or, for an Exec,
// once the call returns). A second prepare of the same text while it is
// checked out, such as a query run again inside a transaction while the first
// one's Rows are still being read, gets a fresh uncached statement that is
// finalized on Close as usual, so a cached statement never serves two
// operations at once.
//
// Between uses a modernc statement needs nothing from us: its Exec resets the
// VM when it returns, its Rows reset it on Close, and every execution binds
// every parameter again (a missing argument is an error), after unbinding the
// text and blob buffers of the previous execution, so no binding or cursor
// state carries over. database/sql reuses driver statements the same way for
// a *sql.Stmt.
//
// database/sql serializes calls on one driver.Conn and on its statements; the
// mutex only guards the cache bookkeeping against misuse and for the race
// detector's sake, and is never held across a call into SQLite.

// stmtCacheSize bounds the statements cached per connection. Ferry issues a
// few dozen distinct statements; set-wise writes and IN lists add a few per
// power-of-two size (see sqlstore.chunk), list filters some more.
const stmtCacheSize = 512

// cacheStats counts a connector's cache activity over all its connections.
// Tests read it; it costs an atomic add per call.
type cacheStats struct {
	conns     atomic.Int64 // connections opened
	prepares  atomic.Int64 // statements prepared by SQLite (misses, busy and uncached)
	hits      atomic.Int64 // prepares answered from the cache
	busy      atomic.Int64 // cached statement in use: prepared an uncached one
	evictions atomic.Int64 // cached statements evicted by the LRU bound
}

// connector opens modernc connections and wraps each in a cachingConn.
type connector struct {
	inner driver.Connector
	size  int
	stats cacheStats
}

var _ driver.Connector = (*connector)(nil)

// newConnector returns a connector for dsn, a modernc.org/sqlite DSN
// (including _pragma and _txlock, which the driver parses), caching up to
// size statements per connection.
func newConnector(dsn string, size int) (*connector, error) {
	inner, err := msqlite.NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	if size < 1 {
		size = 1
	}
	return &connector{inner: inner, size: size}, nil
}

// Connect implements driver.Connector.
func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	ci, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	cc, err := newCachingConn(ci, c.size, &c.stats)
	if err != nil {
		ci.Close()
		return nil, err
	}
	c.stats.conns.Add(1)
	return cc, nil
}

// Driver implements driver.Connector.
func (c *connector) Driver() driver.Driver { return c.inner.Driver() }

// cachingConn wraps a modernc connection. It deliberately does not implement
// driver.ExecerContext, driver.QueryerContext, driver.Execer or
// driver.Queryer. It forwards the other optional interfaces of modernc's
// connection that database/sql uses: ConnBeginTx, SessionResetter, Validator
// and Pinger. modernc's connection implements no driver.NamedValueChecker, so
// neither does this; TestWrapperForwardsDriverInterfaces notices if a driver
// upgrade adds one.
type cachingConn struct {
	ci        driver.Conn
	prep      driver.ConnPrepareContext
	beginTx   driver.ConnBeginTx
	resetter  driver.SessionResetter // nil if the driver has none
	validator driver.Validator       // nil if the driver has none
	pinger    driver.Pinger          // nil if the driver has none
	stats     *cacheStats            // the connector's, over all its connections
	own       cacheStats             // this connection's

	mu     sync.Mutex
	size   int
	byText map[string]*cacheEntry
	head   *cacheEntry // most recently used
	tail   *cacheEntry // least recently used
	closed bool
}

var (
	_ driver.Conn               = (*cachingConn)(nil)
	_ driver.ConnPrepareContext = (*cachingConn)(nil)
	_ driver.ConnBeginTx        = (*cachingConn)(nil)
	_ driver.SessionResetter    = (*cachingConn)(nil)
	_ driver.Validator          = (*cachingConn)(nil)
	_ driver.Pinger             = (*cachingConn)(nil)
)

func newCachingConn(ci driver.Conn, size int, stats *cacheStats) (*cachingConn, error) {
	prep, ok := ci.(driver.ConnPrepareContext)
	if !ok {
		return nil, errors.New("sqlite: driver connection lacks PrepareContext")
	}
	beginTx, ok := ci.(driver.ConnBeginTx)
	if !ok {
		return nil, errors.New("sqlite: driver connection lacks BeginTx")
	}
	c := &cachingConn{
		ci:      ci,
		prep:    prep,
		beginTx: beginTx,
		stats:   stats,
		size:    size,
		byText:  make(map[string]*cacheEntry, size),
	}
	c.resetter, _ = ci.(driver.SessionResetter)
	c.validator, _ = ci.(driver.Validator)
	c.pinger, _ = ci.(driver.Pinger)
	return c, nil
}

// cacheEntry is one cached statement, linked into its connection's LRU list
// while cached.
type cacheEntry struct {
	query      string
	si         driver.Stmt // nil once finalized
	exec       driver.StmtExecContext
	queryer    driver.StmtQueryContext
	inUse      bool // checked out by a stmtHandle
	cached     bool // in byText and the list
	prev, next *cacheEntry
}

// Unwrap returns the modernc connection, for callers of sql.Conn.Raw that
// need its own methods (backup, serialize, hooks).
func (c *cachingConn) Unwrap() driver.Conn { return c.ci }

// Prepare implements driver.Conn.
func (c *cachingConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext implements driver.ConnPrepareContext: it checks out the
// cached statement for query, preparing and caching it on a miss, or prepares
// an uncached one if the cached statement is in use.
func (c *cachingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, driver.ErrBadConn
	}
	e := c.byText[query]
	if e != nil && !e.inUse {
		e.inUse = true
		c.moveToFront(e)
		c.mu.Unlock()
		c.stats.hits.Add(1)
		c.own.hits.Add(1)
		return &stmtHandle{c: c, e: e}, nil
	}
	c.mu.Unlock()

	si, err := c.prep.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.stats.prepares.Add(1)
	c.own.prepares.Add(1)
	if e != nil {
		// Busy: the cached statement serves an operation still under way
		// (its Rows are open). This one is the caller's alone.
		c.stats.busy.Add(1)
		c.own.busy.Add(1)
		return si, nil
	}
	ex, ok1 := si.(driver.StmtExecContext)
	qu, ok2 := si.(driver.StmtQueryContext)
	if !ok1 || !ok2 {
		return si, nil
	}

	e = &cacheEntry{query: query, si: si, exec: ex, queryer: qu, inUse: true}
	var victim *cacheEntry
	evicted := false
	c.mu.Lock()
	if c.closed || c.byText[query] != nil {
		// Closed meanwhile, or cached by a concurrent prepare (database/sql
		// does not make those): leave this one uncached.
		c.mu.Unlock()
		return si, nil
	}
	e.cached = true
	c.byText[query] = e
	c.pushFront(e)
	if len(c.byText) > c.size {
		victim = c.tail
		c.remove(victim)
		evicted = true
		if victim.inUse {
			victim = nil // finalized when its handle closes
		}
	}
	c.mu.Unlock()
	if evicted {
		c.stats.evictions.Add(1)
		c.own.evictions.Add(1)
	}
	if victim != nil {
		victim.finalize() // not in use, so no one else can reach it
	}
	return &stmtHandle{c: c, e: e}, nil
}

// release returns e to the cache, or finalizes it if it was evicted while
// checked out.
func (c *cachingConn) release(e *cacheEntry) error {
	c.mu.Lock()
	e.inUse = false
	orphan := !e.cached
	c.mu.Unlock()
	if orphan {
		return e.finalize()
	}
	return nil
}

func (e *cacheEntry) finalize() error {
	if e.si == nil {
		return nil
	}
	si := e.si
	e.si, e.exec, e.queryer = nil, nil, nil
	return si.Close()
}

// Close implements driver.Conn: it finalizes every cached statement, then
// closes the connection.
func (c *cachingConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	var all []*cacheEntry
	for e := c.head; e != nil; e = e.next {
		all = append(all, e)
	}
	for _, e := range all {
		c.remove(e)
	}
	c.mu.Unlock()
	var errs []error
	for _, e := range all {
		// database/sql closes statements before their connection; an entry
		// still checked out here is finalized anyway, as the connection is
		// going away, and its handle then reports driver.ErrBadConn.
		if err := e.finalize(); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, c.ci.Close())
	return errors.Join(errs...)
}

// Begin implements driver.Conn.
//
// Deprecated: database/sql calls BeginTx.
func (c *cachingConn) Begin() (driver.Tx, error) {
	return c.beginTx.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx implements driver.ConnBeginTx; the driver's transaction, including
// BEGIN IMMEDIATE from _txlock=immediate, is used as is.
func (c *cachingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.beginTx.BeginTx(ctx, opts)
}

// ResetSession implements driver.SessionResetter.
func (c *cachingConn) ResetSession(ctx context.Context) error {
	if c.resetter == nil {
		return nil
	}
	return c.resetter.ResetSession(ctx)
}

// IsValid implements driver.Validator.
func (c *cachingConn) IsValid() bool {
	return c.validator == nil || c.validator.IsValid()
}

// Ping implements driver.Pinger.
func (c *cachingConn) Ping(ctx context.Context) error {
	if c.pinger == nil {
		return nil
	}
	return c.pinger.Ping(ctx)
}

// LRU list, guarded by mu.

func (c *cachingConn) pushFront(e *cacheEntry) {
	e.prev, e.next = nil, c.head
	if c.head != nil {
		c.head.prev = e
	}
	c.head = e
	if c.tail == nil {
		c.tail = e
	}
}

func (c *cachingConn) remove(e *cacheEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = nil, nil
	e.cached = false
	delete(c.byText, e.query)
}

func (c *cachingConn) moveToFront(e *cacheEntry) {
	if c.head == e {
		return
	}
	// e is not the head, so e.prev != nil.
	e.prev.next = e.next
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = nil, c.head
	c.head.prev = e
	c.head = e
}

// stmtHandle is one checkout of a cached statement, handed to database/sql.
// Its Close returns the statement to the cache instead of finalizing it.
type stmtHandle struct {
	c      *cachingConn
	e      *cacheEntry
	closed bool
}

var (
	_ driver.Stmt             = (*stmtHandle)(nil)
	_ driver.StmtExecContext  = (*stmtHandle)(nil)
	_ driver.StmtQueryContext = (*stmtHandle)(nil)
)

func (h *stmtHandle) live() (*cacheEntry, error) {
	if h.closed || h.e.si == nil {
		return nil, driver.ErrBadConn
	}
	return h.e, nil
}

// Close implements driver.Stmt.
func (h *stmtHandle) Close() error {
	if h.closed {
		return nil
	}
	h.closed = true
	return h.c.release(h.e)
}

// NumInput implements driver.Stmt.
func (h *stmtHandle) NumInput() int {
	if h.e.si == nil {
		return -1
	}
	return h.e.si.NumInput()
}

// ExecContext implements driver.StmtExecContext.
func (h *stmtHandle) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	e, err := h.live()
	if err != nil {
		return nil, err
	}
	return e.exec.ExecContext(ctx, args)
}

// QueryContext implements driver.StmtQueryContext.
func (h *stmtHandle) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	e, err := h.live()
	if err != nil {
		return nil, err
	}
	return e.queryer.QueryContext(ctx, args)
}

// Exec implements driver.Stmt.
//
// Deprecated: database/sql calls ExecContext.
func (h *stmtHandle) Exec(args []driver.Value) (driver.Result, error) {
	return h.ExecContext(context.Background(), namedValues(args))
}

// Query implements driver.Stmt.
//
// Deprecated: database/sql calls QueryContext.
func (h *stmtHandle) Query(args []driver.Value) (driver.Rows, error) {
	return h.QueryContext(context.Background(), namedValues(args))
}

func namedValues(args []driver.Value) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(args))
	for i, v := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return nv
}
