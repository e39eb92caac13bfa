package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"sync"
	"testing"

	msqlite "modernc.org/sqlite"
)

// cacheDB opens a database/sql pool over the caching connector on a fresh
// file, with the pragmas Open uses, and a table t.
func cacheDB(t *testing.T, size, maxConns int, extra string) (*sql.DB, *connector) {
	t.Helper()
	q := url.Values{}
	for _, p := range []string{"busy_timeout(10000)", "journal_mode(WAL)", "synchronous(NORMAL)", "foreign_keys(1)"} {
		q.Add("_pragma", p)
	}
	dsn := "file:" + filepath.Join(t.TempDir(), "c.db") + "?" + q.Encode() + extra
	c, err := newConnector(dsn, size)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("db.Close: %v", err)
		}
	})
	if _, err := db.Exec(`CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT, b INTEGER, c BLOB, v INTEGER)`); err != nil {
		t.Fatal(err)
	}
	return db, c
}

// rawConn runs f on the *cachingConn behind one pooled connection of db.
func rawConn(t *testing.T, db *sql.DB, f func(*cachingConn)) {
	t.Helper()
	conn, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Raw(func(dc any) error {
		cc, ok := dc.(*cachingConn)
		if !ok {
			return fmt.Errorf("driver conn is %T, want *cachingConn", dc)
		}
		f(cc)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestWrapperForwardsDriverInterfaces(t *testing.T) {
	mc, err := msqlite.NewConnector("file:" + filepath.Join(t.TempDir(), "i.db"))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := mc.Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	c, err := newCachingConn(inner, 4, &cacheStats{})
	if err != nil {
		t.Fatal(err)
	}
	var wrapped driver.Conn = c

	// What database/sql looks for on a driver.Conn, and whether the wrapper
	// must forward it when the driver has it.
	checks := []struct {
		name    string
		forward bool
		has     func(driver.Conn) bool
	}{
		{"ConnPrepareContext", true, func(c driver.Conn) bool { _, ok := c.(driver.ConnPrepareContext); return ok }},
		{"ConnBeginTx", true, func(c driver.Conn) bool { _, ok := c.(driver.ConnBeginTx); return ok }},
		{"SessionResetter", true, func(c driver.Conn) bool { _, ok := c.(driver.SessionResetter); return ok }},
		{"Validator", true, func(c driver.Conn) bool { _, ok := c.(driver.Validator); return ok }},
		{"Pinger", true, func(c driver.Conn) bool { _, ok := c.(driver.Pinger); return ok }},
		{"NamedValueChecker", true, func(c driver.Conn) bool { _, ok := c.(driver.NamedValueChecker); return ok }},
		{"ExecerContext", false, func(c driver.Conn) bool { _, ok := c.(driver.ExecerContext); return ok }},
		{"QueryerContext", false, func(c driver.Conn) bool { _, ok := c.(driver.QueryerContext); return ok }},
		{"Execer", false, func(c driver.Conn) bool { _, ok := c.(driver.Execer); return ok }},   //nolint:staticcheck
		{"Queryer", false, func(c driver.Conn) bool { _, ok := c.(driver.Queryer); return ok }}, //nolint:staticcheck
	}
	for _, ck := range checks {
		got, driverHas := ck.has(wrapped), ck.has(inner)
		switch {
		case ck.forward && driverHas && !got:
			t.Errorf("modernc conn implements %s but the wrapper does not forward it", ck.name)
		case !ck.forward && got:
			t.Errorf("wrapper implements %s; database/sql would bypass the statement cache", ck.name)
		}
	}
}

func TestStmtCachePreparesOncePerConn(t *testing.T) {
	db, c := cacheDB(t, stmtCacheSize, 1, "")
	ctx := t.Context()
	before := c.stats.prepares.Load()
	const n = 200
	for i := range n {
		if _, err := db.ExecContext(ctx, `INSERT INTO t (a, b, v) VALUES (?, ?, ?)`, fmt.Sprint("a", i), i, i); err != nil {
			t.Fatal(err)
		}
		var got int
		if err := db.QueryRowContext(ctx, `SELECT b FROM t WHERE v = ?`, i).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != i {
			t.Fatalf("row %d: b = %d", i, got)
		}
	}
	if got := c.stats.prepares.Load() - before; got != 2 {
		t.Errorf("prepared %d statements for 2 query texts run %d times each on 1 conn, want 2", got, n)
	}
	if got := c.stats.hits.Load(); got < 2*(n-1) {
		t.Errorf("cache hits = %d, want >= %d", got, 2*(n-1))
	}
	rawConn(t, db, func(cc *cachingConn) {
		if got := cc.own.prepares.Load(); got != 3 { // CREATE TABLE, INSERT, SELECT
			t.Errorf("conn prepared %d statements, want 3", got)
		}
		cc.mu.Lock()
		defer cc.mu.Unlock()
		if len(cc.byText) != 3 {
			t.Errorf("conn caches %d statements, want 3", len(cc.byText))
		}
	})
}

func TestStmtCachePoolConcurrent(t *testing.T) {
	db, c := cacheDB(t, stmtCacheSize, 4, "")
	ctx := t.Context()
	for i := range 50 {
		if _, err := db.ExecContext(ctx, `INSERT INTO t (b, v) VALUES (?, ?)`, i, i*2); err != nil {
			t.Fatal(err)
		}
	}
	const query = `SELECT v FROM t WHERE b = ?`
	before := c.stats.prepares.Load()
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 300 {
				b := (g*31 + i) % 50
				var v int
				if err := db.QueryRowContext(ctx, query, b).Scan(&v); err != nil {
					errc <- err
					return
				}
				if v != b*2 {
					errc <- fmt.Errorf("b=%d: v=%d", b, v)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	conns := c.stats.conns.Load()
	if got := c.stats.prepares.Load() - before; got > conns {
		t.Errorf("prepared %q %d times over %d connections, want at most once per connection", query, got, conns)
	}
}

// A query run again inside a transaction while the Rows of its first run are
// still open gets a statement of its own; both runs see correct results.
func TestStmtCacheBusyStatement(t *testing.T) {
	db, c := cacheDB(t, stmtCacheSize, 1, "&_txlock=immediate")
	ctx := t.Context()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	for i := 1; i <= 5; i++ {
		if _, err := tx.ExecContext(ctx, `INSERT INTO t (v) VALUES (?)`, i); err != nil {
			t.Fatal(err)
		}
	}
	const q = `SELECT v FROM t WHERE v >= ? ORDER BY v`
	busyBefore := c.stats.busy.Load()
	rows, err := tx.QueryContext(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	var outer []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		outer = append(outer, v)
		// The same text again, with other arguments, while rows is open.
		inner, err := tx.QueryContext(ctx, q, v)
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		for inner.Next() {
			var w int
			if err := inner.Scan(&w); err != nil {
				t.Fatal(err)
			}
			got = append(got, w)
		}
		if err := inner.Close(); err != nil {
			t.Fatal(err)
		}
		if err := inner.Err(); err != nil {
			t.Fatal(err)
		}
		if want := seq(v, 5); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("inner run from %d = %v, want %v", v, got, want)
		}
		var first int
		if err := tx.QueryRowContext(ctx, q, 4).Scan(&first); err != nil || first != 4 {
			t.Errorf("QueryRow inside iteration = %d, %v; want 4", first, err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if want := seq(1, 5); fmt.Sprint(outer) != fmt.Sprint(want) {
		t.Errorf("outer run = %v, want %v", outer, want)
	}
	if got := c.stats.busy.Load() - busyBefore; got != 10 {
		t.Errorf("busy fallbacks = %d, want 10 (2 per outer row)", got)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// Released: the next run uses the cached statement again.
	hits, prepares := c.stats.hits.Load(), c.stats.prepares.Load()
	var n int
	if err := db.QueryRowContext(ctx, q, 3).Scan(&n); err != nil || n != 3 {
		t.Fatalf("after commit: %d, %v", n, err)
	}
	if c.stats.hits.Load() != hits+1 || c.stats.prepares.Load() != prepares {
		t.Errorf("query after the busy phase was not a cache hit")
	}
}

func seq(from, to int) []int {
	var s []int
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// A reused statement carries no binding from one execution to the next.
func TestStmtCacheNoBindingLeak(t *testing.T) {
	db, c := cacheDB(t, stmtCacheSize, 1, "")
	ctx := t.Context()
	const ins = `INSERT INTO t (id, a, b, c) VALUES (?, ?, ?, ?)`
	before := c.stats.prepares.Load()
	// id, a, b, c; nil is NULL.
	cases := [][]any{
		{1, "x", int64(7), []byte("blob")},
		{2, nil, nil, nil},
		{3, "y", nil, []byte("b3")},
		{4, nil, int64(0), nil},
		{5, "", int64(1), []byte("z")},
		{6, nil, nil, nil},
	}
	for _, args := range cases {
		if _, err := db.ExecContext(ctx, ins, args...); err != nil {
			t.Fatal(err)
		}
	}
	// Too few arguments must fail, not reuse the previous execution's.
	if _, err := db.ExecContext(ctx, ins, 7, "only a"); err == nil {
		t.Error("INSERT with 2 of 4 arguments succeeded on a reused statement")
	}
	// A failed step (duplicate key) leaves the statement reusable.
	if _, err := db.ExecContext(ctx, ins, 1, "dup", 1, nil); err == nil {
		t.Error("duplicate INSERT succeeded")
	}
	if _, err := db.ExecContext(ctx, ins, 8, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	cases = append(cases, []any{8, nil, nil, nil})
	if got := c.stats.prepares.Load() - before; got != 1 {
		t.Errorf("INSERT prepared %d times, want 1", got)
	}
	for _, want := range cases {
		var a, b, cc any
		if err := db.QueryRowContext(ctx, `SELECT a, b, c FROM t WHERE id = ?`, want[0]).Scan(&a, &b, &cc); err != nil {
			t.Fatal(err)
		}
		got := []any{want[0], a, b, cc}
		if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", want) {
			t.Errorf("row %v:\n got %#v\nwant %#v", want[0], got, want)
		}
	}
	// Named and numbered parameters.
	const upd = `UPDATE t SET a = :a, b = :b WHERE id = :id`
	if _, err := db.ExecContext(ctx, upd, sql.Named("a", "n"), sql.Named("b", 9), sql.Named("id", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, upd, sql.Named("a", nil), sql.Named("b", nil), sql.Named("id", 1)); err != nil {
		t.Fatal(err)
	}
	var a sql.NullString
	var b sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT a, b FROM t WHERE id = ?`, 1).Scan(&a, &b); err != nil {
		t.Fatal(err)
	}
	if a.Valid || b.Valid {
		t.Errorf("after named UPDATE to NULL: a=%v b=%v", a, b)
	}
}

// A query abandoned after its first row, or failed by its context, leaves the
// cached statement reset: the next run starts from the first row.
func TestStmtCacheCursorReset(t *testing.T) {
	db, _ := cacheDB(t, stmtCacheSize, 1, "")
	ctx := t.Context()
	for i := 1; i <= 10; i++ {
		if _, err := db.ExecContext(ctx, `INSERT INTO t (v) VALUES (?)`, i); err != nil {
			t.Fatal(err)
		}
	}
	const q = `SELECT v FROM t ORDER BY v`
	for range 3 {
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if !rows.Next() {
			t.Fatal("no rows")
		}
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v != 1 {
			t.Fatalf("first row = %d, want 1 (cursor not reset)", v)
		}
		rows.Close()
	}
	cctx, cancel := context.WithCancel(ctx)
	rows, err := db.QueryContext(cctx, q)
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	cancel()
	for rows.Next() {
	}
	rows.Close()
	if _, err := db.ExecContext(cctx, `INSERT INTO t (v) VALUES (?)`, 99); !errors.Is(err, context.Canceled) {
		t.Errorf("Exec with canceled context: %v, want context.Canceled", err)
	}
	var sum, n int
	rows, err = db.QueryContext(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		sum += v
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if n != 10 || sum != 55 {
		t.Errorf("after cancel: %d rows summing to %d, want 10 and 55", n, sum)
	}
}

func TestStmtCacheEviction(t *testing.T) {
	db, c := cacheDB(t, 2, 1, "")
	ctx := t.Context()
	for i := 1; i <= 3; i++ {
		if _, err := db.ExecContext(ctx, `INSERT INTO t (v) VALUES (?)`, i); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 5 {
		for k := 1; k <= 3; k++ {
			var v int
			if err := db.QueryRowContext(ctx, fmt.Sprintf(`SELECT v FROM t WHERE v = ? AND %d = %d`, k, k), k).Scan(&v); err != nil || v != k {
				t.Fatalf("round %d query %d: %d, %v", round, k, v, err)
			}
		}
	}
	if c.stats.evictions.Load() == 0 {
		t.Error("no evictions with 3 query texts and room for 2")
	}
	rawConn(t, db, func(cc *cachingConn) {
		cc.mu.Lock()
		defer cc.mu.Unlock()
		if len(cc.byText) != 2 {
			t.Errorf("conn caches %d statements, want 2", len(cc.byText))
		}
		n := 0
		for e := cc.head; e != nil; e = e.next {
			n++
		}
		if n != 2 {
			t.Errorf("LRU list holds %d entries, want 2", n)
		}
	})

	// A statement evicted while its Rows are open stays usable until closed.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	rows, err := tx.QueryContext(ctx, `SELECT v FROM t ORDER BY v`)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for i := 0; rows.Next(); i++ {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
		for k := range 3 {
			var x int
			if err := tx.QueryRowContext(ctx, fmt.Sprintf(`SELECT %d + %d`, i, k)).Scan(&x); err != nil || x != i+k {
				t.Fatalf("SELECT %d + %d = %d, %v", i, k, x, err)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if fmt.Sprint(got) != "[1 2 3]" {
		t.Errorf("rows of evicted statement = %v", got)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// _txlock=immediate still reaches the driver: a second writer's BEGIN fails
// at once while the first holds its transaction.
func TestStmtCacheTxLockImmediate(t *testing.T) {
	dir := t.TempDir()
	dsn := "file:" + filepath.Join(dir, "l.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(50)&_txlock=immediate"
	open := func() *sql.DB {
		c, err := newConnector(dsn, 8)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(c)
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { db.Close() })
		return db
	}
	a, b := open(), open()
	ctx := t.Context()
	if _, err := a.ExecContext(ctx, `CREATE TABLE x (v INTEGER)`); err != nil {
		t.Fatal(err)
	}
	ta, err := a.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ta.Rollback() //nolint:errcheck
	if tb, err := b.BeginTx(ctx, nil); err == nil {
		tb.Rollback() //nolint:errcheck
		t.Fatal("second BEGIN succeeded while the first transaction is open; want BEGIN IMMEDIATE to fail with SQLITE_BUSY")
	}
}

// Open wires the cache into both pools.
func TestOpenUsesStmtCache(t *testing.T) {
	w, r, err := openPools(filepath.Join(t.TempDir(), "ferry.db"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	defer r.Close()
	for _, db := range []*sql.DB{w, r} {
		rawConn(t, db, func(*cachingConn) {})
	}
}
