package postgres_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
	"github.com/ferryhq/ferry/internal/store/storetest"
	"github.com/ferryhq/ferry/internal/testwait"
)

// openDSN opens dsn without migrating; the store is closed when t ends.
func openDSN(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatalf("postgres.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// open returns a migrated store on a fresh schema.
func open(t *testing.T) *postgres.Store {
	t.Helper()
	s := openDSN(t, pgtest.DSN(t))
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// TestConformance runs the conformance suite, then has Postgres plan
// every statement the suite made the stores generate: none may read its
// column arrays through a Function Scan (unnest(a, b, …) in FROM), which
// copies each column into a tuplestore of its own first, ≈21 µs of
// Postgres's CPU a column in every statement (sqlstore's arrayRows).
func TestConformance(t *testing.T) {
	probe := open(t) // a schema to plan in; closed after the check below
	var mu sync.Mutex
	var stores []*postgres.Store
	t.Cleanup(func() { // after the suite's parallel tests
		mu.Lock()
		defer mu.Unlock()
		checkNoFunctionScans(t, probe, stores)
	})
	storetest.Run(t, func(t *testing.T) store.Store {
		s := open(t)
		mu.Lock()
		stores = append(stores, s)
		mu.Unlock()
		return s
	})
}

// checkNoFunctionScans has Postgres plan, in probe's schema, each
// distinct statement the stores generated, and fails t for each plan
// with a Function Scan; and unless some plan unnests arrays in a
// ProjectSet (so the statements checked are the ones that matter). The
// plans are generic, as the store's are (Dialect.Generic): a plan for
// NULL parameters would fold the guards' checks into their failure.
func checkNoFunctionScans(t *testing.T, probe *postgres.Store, stores []*postgres.Store) {
	t.Helper()
	ctx := context.Background() // t's context has ended by now
	conn, err := probe.ReadDB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	projectSets := 0
	for _, s := range stores {
		for _, q := range s.GeneratedStatements() {
			if seen[q] {
				continue
			}
			seen[q] = true
			plan, err := genericPlan(ctx, conn, q)
			if err != nil {
				t.Errorf("plan %s: %v", q, err)
				continue
			}
			if strings.Contains(plan, "Function Scan") {
				t.Errorf("a Function Scan in the plan of\n%s\n%s", q, plan)
			}
			if strings.Contains(plan, "ProjectSet") {
				projectSets++
			}
		}
	}
	// Only a run of the whole suite is sure to write batches (a run of
	// some of its tests, -run 'TestConformance/…', may write none).
	if f := flag.Lookup("test.run"); projectSets == 0 && (f == nil || !strings.Contains(f.Value.String(), "/")) {
		t.Errorf("none of the %d generated statements unnests arrays in a ProjectSet", len(seen))
	}
}

// genericPlan is the plan of q (prepared on conn, whose plan_cache_mode
// forces generic plans) as EXPLAIN EXECUTE gives it.
func genericPlan(ctx context.Context, conn *sql.Conn, q string) (string, error) {
	if _, err := conn.ExecContext(ctx, "PREPARE ferry_probe AS "+q); err != nil {
		return "", err
	}
	// A failure to deallocate shows at the next PREPARE.
	defer func() { _, _ = conn.ExecContext(ctx, "DEALLOCATE ferry_probe") }()
	nulls := strings.TrimSuffix(strings.Repeat("NULL, ", maxParam(q)), ", ")
	rows, err := conn.QueryContext(ctx, "EXPLAIN EXECUTE ferry_probe("+nulls+")")
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			return "", err
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n"), rows.Err()
}

// maxParam is the highest $n in q.
func maxParam(q string) int {
	n := 0
	for i := strings.IndexByte(q, '$'); i >= 0; i = strings.IndexByte(q, '$') {
		q = q[i+1:]
		j := 0
		for j < len(q) && q[j] >= '0' && q[j] <= '9' {
			j++
		}
		if k, err := strconv.Atoi(q[:j]); err == nil {
			n = max(n, k)
		}
	}
	return n
}

// TestSchemaIsolation checks pgtest: two DSNs are two empty schemas, and the
// store works in the one its DSN names.
func TestSchemaIsolation(t *testing.T) {
	a, b := open(t), open(t)
	if _, err := a.CreateWorkflow(t.Context(), &store.Workflow{Name: "only-in-a", Fingerprint: "f", Definition: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetWorkflow(t.Context(), "only-in-a"); err == nil {
		t.Fatal("a workflow created in one schema is visible in another")
	}
	var schema string
	if err := a.DB().QueryRowContext(t.Context(), "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	if len(schema) <= len(pgtest.SchemaPrefix) || schema[:len(pgtest.SchemaPrefix)] != pgtest.SchemaPrefix {
		t.Errorf("current_schema() = %q, want a %s* schema", schema, pgtest.SchemaPrefix)
	}
}

// TestNoForeignKeysOnRunRows: runs and step_runs carry no foreign keys
// (migration 8: each row's check was a query and a lock, and guarded
// nothing the writes do not), while workflow_versions keeps its own.
func TestNoForeignKeysOnRunRows(t *testing.T) {
	s := open(t)
	tables := strs(t, s.DB(), `SELECT conrelid::regclass::text FROM pg_constraint WHERE contype = 'f' AND connamespace = current_schema()::regnamespace ORDER BY 1`)
	if want := []string{"workflow_versions"}; !slices.Equal(tables, want) {
		t.Errorf("tables with foreign keys = %v, want %v", tables, want)
	}
}

// TestKeysCompareBytewise: the columns Ferry's indexes compare ids, keys
// and statuses on have the "C" collation (memcmp, not the C library's
// strcoll), and the planner keeps using their indexes for lookups.
func TestKeysCompareBytewise(t *testing.T) {
	s := open(t)
	keys := map[string][]string{
		"workflows":         {"id"},
		"workflow_versions": {"workflow_id"},
		"runs":              {"id", "workflow_id", "status", "idempotency_key"},
		"step_runs":         {"run_id", "name", "callback_token"},
		"tasks":             {"id", "run_id", "idempotency_key", "status", "type"},
		"queue":             {"run_id"},
		"events":            {"run_id"},
	}
	for table, cols := range keys {
		for _, col := range cols {
			var coll sql.NullString
			err := s.DB().QueryRowContext(t.Context(), `SELECT collation_name FROM information_schema.columns
				WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2`, table, col).Scan(&coll)
			if err != nil {
				t.Fatalf("%s.%s: %v", table, col, err)
			}
			if coll.String != "C" {
				t.Errorf("%s.%s has collation %q, want C", table, col, coll.String)
			}
		}
	}
	// A run is still found by its id through the primary key with a
	// text parameter (the comparison must not fall back to a scan).
	var plan string
	if err := s.DB().QueryRowContext(t.Context(), `EXPLAIN SELECT id FROM runs WHERE id = $1`, "x").Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan, "runs_pkey") {
		t.Errorf("lookup by id does not use the primary key: %s", plan)
	}
}

// TestRunsByWorkflow: a workflow's runs are paged and counted by status
// through one index (migration 12), so a run's insert and the update that
// finishes it enter one index for its workflow, not two.
func TestRunsByWorkflow(t *testing.T) {
	s := open(t)
	ctx := t.Context()
	names := strs(t, s.DB(), `SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'runs' ORDER BY indexname`)
	if want := "runs_by_workflow,runs_expiry,runs_idempotency,runs_pkey"; strings.Join(names, ",") != want {
		t.Errorf("runs has indexes %v, want %s", names, want)
	}
	// Plans are read with sequential scans off: on a table this small the
	// planner would rightly prefer one, and what matters is that the
	// index can serve both reads.
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SET enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SELECT id FROM runs WHERE workflow_id = $1 AND id < $2 ORDER BY id DESC LIMIT 10`,
		`SELECT status, COUNT(*) FROM runs WHERE workflow_id = $1 GROUP BY status`,
	} {
		plan := strings.Join(strs(t, conn, `EXPLAIN `+q, []any{"wf", "z"}[:strings.Count(q, "$")]...), "\n")
		if !strings.Contains(plan, "runs_by_workflow") {
			t.Errorf("%s does not use runs_by_workflow:\n%s", q, plan)
		}
	}
}

// queryer is what strs reads through: a pool or one connection.
type queryer interface {
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
}

// strs returns the one text column of q's rows.
func strs(t *testing.T, db queryer, q string, args ...any) []string {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestConcurrentMigrate starts three servers on one fresh schema at once:
// every Migrate succeeds and the schema ends up migrated exactly once.
func TestConcurrentMigrate(t *testing.T) {
	dsn := pgtest.DSN(t)
	const n = 3
	stores := make([]*postgres.Store, n)
	for i := range stores {
		stores[i] = openDSN(t, dsn)
	}
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Go(func() {
			<-start
			errs[i] = s.Migrate(t.Context())
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Migrate %d: %v", i, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	var applied, rows int
	db := stores[0].DB()
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*), COUNT(DISTINCT version) FROM ferry_migrations").Scan(&rows, &applied); err != nil {
		t.Fatal(err)
	}
	if rows != applied {
		t.Errorf("ferry_migrations has %d rows for %d versions: a migration was recorded twice", rows, applied)
	}
	v, err := stores[0].SchemaVersion(t.Context())
	if err != nil || v < 1 {
		t.Errorf("SchemaVersion = %d, %v; want >= 1", v, err)
	}
	// Every store works on the result.
	for i, s := range stores {
		if _, err := s.HasAPIKeys(t.Context()); err != nil {
			t.Errorf("store %d after concurrent Migrate: %v", i, err)
		}
	}
}

// migrated opens a store on dsn with its tables.
func migrated(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	s := openDSN(t, dsn)
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// listeningNode is a node of a deployment in a fresh schema, listening for
// wake-ups; other nodes of it open dsn.
func listeningNode(t *testing.T) (dsn string, wake <-chan peerWake) {
	t.Helper()
	dsn = pgtest.DSN(t)
	return dsn, listening(t, migrated(t, dsn))
}

// peerWake is how another node's notification reached a node: told to
// its commit hook as what the commits made ready, or, with all, as a
// wake-up of its Wakeups channel for everything.
type peerWake struct {
	c   store.Committed
	all bool
}

// listening starts s's Wakeups and returns once its connection has run
// LISTEN and said hello: NOTIFY reaches only sessions already listening. The wake-ups it returns are the channel's and s's commit
// hook's (the tests' listening nodes commit nothing themselves).
func listening(t *testing.T, s *postgres.Store) <-chan peerWake {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	out := make(chan peerWake, 100)
	s.OnCommit(func(c store.Committed) {
		select {
		case out <- peerWake{c: c}:
		default:
		}
	})
	wake := s.Wakeups(ctx)
	forwarded := make(chan struct{})
	go func() {
		defer close(forwarded)
		for range wake {
			select {
			case out <- peerWake{all: true}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		// The channel is closed once the listener has stopped.
		<-forwarded
	})
	testwait.Until(t, 15*time.Second, "the Wakeups listener LISTENing", s.Listening)
	// Drop wake-ups some other test may have caused meanwhile.
	for {
		select {
		case <-out:
			continue
		default:
		}
		return out
	}
}

// enqueue commits a run with an HTTP attempt due now on s and returns
// its due time.
func enqueue(t *testing.T, s *postgres.Store) time.Time {
	t.Helper()
	wf, err := s.CreateWorkflow(t.Context(), &store.Workflow{Name: "wf-" + strings.ToLower(rand.Text()[:8]), Fingerprint: "f", Definition: json.RawMessage(`{}`), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	_, created, err := s.CreateRun(t.Context(), &store.NewRun{
		Run: store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`),
			ExpiresAt: now.Add(time.Hour), StartedAt: now},
		Queue: []store.QueueItem{{Kind: store.KindHTTP, Step: "a", DueAt: now}},
	}, now)
	if err != nil || !created {
		t.Fatalf("CreateRun: created=%v err=%v", created, err)
	}
	return now
}

// TestWakeupsOnlyOwnSchema: the NOTIFY channel is the database's, but a
// commit of a deployment in another schema does not wake this one, while
// another node of this one does.
func TestWakeupsOnlyOwnSchema(t *testing.T) {
	dsn, wake := listeningNode(t)
	enqueue(t, migrated(t, pgtest.DSN(t))) // another deployment, in its own schema
	// A bounded window for what must not happen.
	select {
	case <-wake:
		t.Fatal("a commit in another schema woke this deployment")
	case <-time.After(300 * time.Millisecond):
	}

	enqueue(t, openDSN(t, dsn))
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up within 10s of another node of this schema enqueueing")
	}
}

// TestWakeups checks that CreateRun with queue items on one node tells
// another node's commit hook what it queued (its notification says), and
// tells the committing node's own hook.
func TestWakeups(t *testing.T) {
	dsn, wake := listeningNode(t)

	// The writer is another node on the same database.
	other := openDSN(t, dsn)
	local := make(chan store.Committed, 1)
	other.OnCommit(func(c store.Committed) {
		select {
		case local <- c:
		default:
		}
	})
	now := enqueue(t, other)
	check := func(who string, c store.Committed) {
		t.Helper()
		if !c.HTTPDue.Equal(now.Truncate(time.Microsecond)) && !c.HTTPDue.Equal(now) {
			t.Errorf("%s: HTTPDue = %v, want %v", who, c.HTTPDue, now)
		}
		// The run's expiry is the only timer: an hour on (see enqueue).
		if want := now.Add(time.Hour).Truncate(time.Microsecond); !c.TimerDue.Equal(want) && !c.TimerDue.Equal(now.Add(time.Hour)) {
			t.Errorf("%s: TimerDue = %v, want the run's expiry %v", who, c.TimerDue, want)
		}
		if c.Tasks {
			t.Errorf("%s: Tasks set for a commit that made no task pending", who)
		}
	}

	select {
	case w := <-wake:
		if w.all {
			t.Fatal("the other node was woken for everything, not told what the commit queued")
		}
		check("the other node's hook", w.c)
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up within 10s of CreateRun enqueueing an item")
	}
	select {
	case c := <-local:
		check("the local commit hook", c)
	default:
		t.Error("the committing node's hook was not told of the queued item")
	}
}

// TestMaxConnsOption: ferry_max_conns sizes the pools (writes and a
// separate quarter for reads) and never reaches Postgres; a bad value is
// refused.
func TestMaxConnsOption(t *testing.T) {
	dsn := pgtest.DSN(t)
	s, err := postgres.Open(t.Context(), dsn+"&ferry_max_conns=5")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if w, r := s.DB().Stats().MaxOpenConnections, s.ReadDB().Stats().MaxOpenConnections; w+r != 5 || r < 1 || w < 1 {
		t.Errorf("max open connections = %d writers + %d readers, want 5 with at least one of each", w, r)
	}
	if _, err := postgres.Open(t.Context(), dsn+"&ferry_max_conns=zero"); err == nil {
		t.Error("ferry_max_conns=zero accepted")
	}
	// Given twice, which one was meant is not guessed (the second was
	// ignored).
	if _, err := postgres.Open(t.Context(), dsn+"&ferry_max_conns=5&ferry_max_conns=500"); err == nil || !strings.Contains(err.Error(), "give it once") {
		t.Errorf("ferry_max_conns given twice: %v, want refused", err)
	}
	d, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if w, r := d.DB().Stats().MaxOpenConnections, d.ReadDB().Stats().MaxOpenConnections; w+r != postgres.DefaultMaxConns || r == 0 {
		t.Errorf("default max open connections = %d writers + %d readers, want %d in all", w, r, postgres.DefaultMaxConns)
	}
}

// TestStatisticsRefreshedAsTablesGrow: the background ANALYZE follows
// each hot table's own growth. A burst of sleeping runs (runs and queue
// items, no tasks) refreshes runs and queue and leaves tasks alone: tasks
// analyzed while it held a few rows had every later write of a batch of
// tasks planned as a walk of the whole table (sqlstore's Store.grew).
// Then the runs' tasks refresh tasks, summarizing only the columns plans
// filter, join or order on.
func TestStatisticsRefreshedAsTablesGrow(t *testing.T) {
	s := openDSN(t, pgtest.DSN(t))
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Ferry's own refresh only (last_analyze): one of autovacuum's would
	// summarize every column and hide which tables the store refreshed.
	analyzed := func(table string) bool {
		var n int
		err := s.DB().QueryRowContext(t.Context(), `SELECT COUNT(*) FROM pg_stat_user_tables
			WHERE schemaname = current_schema() AND relname = $1 AND last_analyze IS NOT NULL`, table).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	waitAnalyzed := func(table, after string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for !analyzed(table) {
			if time.Now().After(deadline) {
				t.Fatalf("%s was not analyzed within 30s of %s", table, after)
			}
			<-tick.C
		}
	}
	for _, table := range []string{"runs", "tasks", "queue"} {
		if analyzed(table) {
			t.Fatalf("%s was analyzed before anything was written", table)
		}
	}
	wf, err := s.CreateWorkflow(t.Context(), &store.Workflow{Name: "wf", Fingerprint: "f", Definition: json.RawMessage(`{}`), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	create := func(n int, withTask bool) {
		t.Helper()
		var nrs []*store.NewRun
		for range n {
			nr := &store.NewRun{
				Run:   store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), StartedAt: now, ExpiresAt: now.Add(time.Hour)},
				Steps: []*store.StepRun{{Name: "a", Type: "task", Status: status.StepRunning}},
			}
			if withTask {
				nr.Tasks = []*store.Task{{Type: "stats.x.v1", Payload: json.RawMessage(`{}`), Priority: 100, RunAt: now, Step: "a"}}
			} else {
				nr.Steps[0].Type, nr.Steps[0].Status = "sleep", status.StepSleeping
				nr.Queue = []store.QueueItem{{Kind: store.KindWake, Step: "a", DueAt: now.Add(time.Hour)}}
			}
			nrs = append(nrs, nr)
		}
		if _, err := s.CreateRuns(t.Context(), nrs, now); err != nil {
			t.Fatal(err)
		}
	}
	// 1,100 sleepers: 1,100 runs and 1,100 queue items, each table past
	// the floor of 1,000 new rows; their steps stay in their run's rows.
	create(1100, false)
	waitAnalyzed("runs", "1,100 runs written")
	waitAnalyzed("queue", "1,100 queue items written")
	if analyzed("tasks") {
		t.Fatal("tasks was analyzed with no task written")
	}
	// 1,100 runs of a task each: tasks passes its floor; runs, at 2,200,
	// has doubled since its refresh.
	create(1100, true)
	waitAnalyzed("tasks", "1,100 tasks written")
	got := strs(t, s.DB(), `SELECT attname FROM pg_stats WHERE schemaname = current_schema() AND tablename = 'tasks' ORDER BY attname`)
	for _, col := range []string{"status", "run_at", "lease_until", "type"} {
		if !slices.Contains(got, col) {
			t.Errorf("tasks.%s has no statistics after the refresh (have %v)", col, got)
		}
	}
	for _, col := range []string{"payload", "result", "events"} {
		if slices.Contains(got, col) {
			t.Errorf("tasks.%s was analyzed: wide columns no plan reads should not be", col)
		}
	}
}

// TestCreateRunsKeyRace: a batch whose idempotency key another server is
// writing at the same moment waits for it, then answers every run of the
// batch properly: the existing ones as found (whole runs, not stubs), the
// raced one as the other server's run, the rest as created.
func TestCreateRunsKeyRace(t *testing.T) {
	s := openDSN(t, pgtest.DSN(t))
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	wf, err := s.CreateWorkflow(ctx, &store.Workflow{Name: "wf", Fingerprint: "f", Definition: json.RawMessage(`{}`), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	newRun := func(key string) *store.NewRun {
		return &store.NewRun{Run: store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), IdempotencyKey: key, StartedAt: now, ExpiresAt: now.Add(time.Hour)}}
	}
	first, created, err := s.CreateRun(ctx, newRun("k0"), now)
	if err != nil || !created {
		t.Fatalf("CreateRun k0: created=%v err=%v", created, err)
	}
	// "Another server" holds key k1 in an open transaction.
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, `INSERT INTO runs (id, workflow_id, version, status, input, trigger_headers, idempotency_key, error, event_seq, expires_at, started_at, updated_at)
		VALUES ('other-run', $1, 1, 'running', '{}', '{}', 'k1', '', 0, 0, 0, 0)`, wf.ID); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res []store.CreateResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := s.CreateRuns(ctx, []*store.NewRun{newRun("k0"), newRun("k1"), newRun("")}, now)
		done <- answer{res, err}
	}()
	// Wait until the batch waits on the other transaction's key, then
	// commit it.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := s.ReadDB().QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database() AND application_name = current_setting('application_name') AND query LIKE '%INSERT INTO runs%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the batch never waited on the other transaction's key")
		}
		select {
		case a := <-done:
			t.Fatalf("CreateRuns returned before the key was committed: %+v", a)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var a answer
	select {
	case a = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("CreateRuns did not return after the key was committed")
	}
	if a.err != nil {
		t.Fatalf("CreateRuns: %v", a.err)
	}
	r := a.res
	if r[0].Err != nil || r[0].Created || r[0].Run == nil || r[0].Run.ID != first.ID || r[0].Run.Status != status.RunRunning || r[0].Run.WorkflowID != wf.ID {
		t.Errorf("existing key k0: %+v (run %+v), want the first run, whole, not created", r[0], r[0].Run)
	}
	if r[1].Err != nil || r[1].Created || r[1].Run == nil || r[1].Run.ID != "other-run" {
		t.Errorf("raced key k1: %+v, want the other server's run, not created", r[1])
	}
	if r[2].Err != nil || !r[2].Created || r[2].Run == nil || r[2].Run.Status != status.RunRunning {
		t.Errorf("run without a key: %+v, want created", r[2])
	}
	// The batch started again as a whole: the run without a key exists once.
	counts, err := s.CountRuns(ctx, wf.ID)
	if err != nil {
		t.Fatal(err)
	}
	if counts[status.RunRunning] != 3 {
		t.Errorf("runs after the race: %v, want 3 running (k0, the other server's k1, one without a key)", counts)
	}
}

// TestCreateRunsWaitsForWorkflowUpdate: the check of a run's workflow in
// the writing transaction holds the workflow row, so a run is never
// written for a workflow whose disabling committed first. While another
// transaction has disabled the workflow but not committed, CreateRuns
// waits; once it commits, the run is refused.
func TestCreateRunsWaitsForWorkflowUpdate(t *testing.T) {
	s := open(t)
	ctx := t.Context()
	wf, err := s.CreateWorkflow(ctx, &store.Workflow{Name: "held", Fingerprint: "f", Definition: json.RawMessage(`{}`), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, `UPDATE workflows SET enabled = FALSE WHERE id = $1`, wf.ID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res []store.CreateResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		nr := &store.NewRun{Workflow: wf, Run: store.Run{WorkflowID: wf.ID, Version: wf.Version, Status: "running", Input: json.RawMessage(`{}`),
			StartedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}}
		res, err := s.CreateRuns(context.WithoutCancel(ctx), []*store.NewRun{nr}, time.Now())
		done <- result{res, err}
	}()
	// Wait until the check is blocked on the row lock.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := s.ReadDB().QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%FROM workflows%FOR SHARE%' AND datname = current_database() AND application_name = current_setting('application_name')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("CreateRuns returned while the workflow's update was uncommitted: %+v, %v", r.res, r.err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("CreateRuns never waited for the workflow row")
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !errors.Is(r.res[0].Err, store.ErrWorkflowChanged) || r.res[0].Created {
		t.Fatalf("CreateRuns after the disable committed: %+v, want ErrWorkflowChanged", r.res[0])
	}
}

// pipeStore is a store with one writer connection (ferry_max_conns=2:
// the next transaction reuses the connection a failed one used) and n runs,
// each with a running task step "a" whose task is claimed and a sleeping
// step "s"; it returns the runs and their tasks in order. extra URL
// parameters are added to the DSN.
func pipeStore(t *testing.T, n int, extra ...string) (*postgres.Store, []*store.Run, []*store.Task, time.Time) {
	t.Helper()
	base := pgtest.WithParam(t, pgtest.DSN(t), "ferry_max_conns", "2")
	dsn := base
	for i := 0; i+1 < len(extra); i += 2 {
		dsn = pgtest.WithParam(t, dsn, extra[i], extra[i+1])
	}
	ctx := t.Context()
	// Migrated without the extra settings: the migration lock is one for
	// the whole database, and a short lock_timeout would fail it while a
	// parallel test migrates its own schema.
	if err := openDSN(t, base).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s := openDSN(t, dsn)
	wf, err := s.CreateWorkflow(ctx, &store.Workflow{Name: "pipe", Fingerprint: "f", Definition: json.RawMessage(`{}`), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	var runs []*store.Run
	for range n {
		run, _, err := s.CreateRun(ctx, &store.NewRun{
			Run:   store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour), StartedAt: now},
			Steps: []*store.StepRun{{Name: "a", Type: "task", Status: status.StepRunning}, {Name: "s", Position: 1, Type: "sleep", Status: status.StepSleeping}},
			Tasks: []*store.Task{{Type: "pipe.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: "a"}},
		}, now)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run)
	}
	got, err := s.ClaimTasks(ctx, store.ClaimTasks{Patterns: []string{"pipe.x.v1"}, WorkerID: "w", Lease: time.Minute, Max: n, Now: now})
	if err != nil || len(got) != n {
		t.Fatalf("claim: %v (%d tasks)", err, len(got))
	}
	byRun := map[string]*store.Task{}
	for _, k := range got {
		byRun[k.RunID] = k
	}
	tasks := make([]*store.Task, n)
	for i, r := range runs {
		tasks[i] = byRun[r.ID]
	}
	return s, runs, tasks, now
}

// openTransactions counts the store's sessions idle in a transaction (its
// schema's, by application_name: tests beside it share the database),
// seen from the reader pool (the writer connection may be the one).
func openTransactions(t *testing.T, s *postgres.Store) int {
	t.Helper()
	var n int
	if err := s.ReadDB().QueryRowContext(t.Context(), `SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = current_setting('application_name') AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// failOn makes row operation op on table fail with a trigger error, for
// the rows when matches (a trigger WHEN condition; "" for all).
func failOn(t *testing.T, s *postgres.Store, op, table, when string) (undo func()) {
	t.Helper()
	ctx := t.Context()
	name := "pipe_fail_" + strings.ToLower(op) + "_" + table
	if when != "" {
		when = " WHEN (" + when + ")"
	}
	for _, q := range []string{
		`CREATE OR REPLACE FUNCTION pipe_fail() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER ` + name + ` BEFORE ` + op + ` ON ` + table + ` FOR EACH ROW` + when + ` EXECUTE FUNCTION pipe_fail()`,
	} {
		if _, err := s.ReadDB().ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return func() {
		if _, err := s.ReadDB().ExecContext(ctx, `DROP TRIGGER `+name+` ON `+table); err != nil {
			t.Fatal(err)
		}
	}
}

// complete reports tasks[i] succeeded in one batch.
func complete(t *testing.T, s *postgres.Store, run *store.Run, k *store.Task, now time.Time) error {
	t.Helper()
	errs, err := s.InTasks(t.Context(), []string{k.ID}, map[string]string{k.ID: run.ID}, now, func(_ int, tx store.TaskTx) error {
		t2 := *tx.Task()
		t2.Status = status.TaskSucceeded
		return tx.UpdateTask(&t2)
	})
	if err == nil {
		err = errs[0]
	}
	return err
}

// TestPipelineFailureLeavesNoTransaction: a report batch goes as two
// pipelined round trips (begin and locks; write and commit). When its
// write fails, nothing of it is written, no transaction is left open on
// its connection, and the next batch (on that same, only writer
// connection) commits.
func TestPipelineFailureLeavesNoTransaction(t *testing.T) {
	s, runs, ks, now := pipeStore(t, 1)
	ctx := t.Context()
	k := ks[0]
	// The write fails: a new task with the id of an existing one.
	_, err := s.InTasks(ctx, []string{k.ID}, map[string]string{k.ID: runs[0].ID}, now, func(_ int, tx store.TaskTx) error {
		st := tx.Run().Step("a")
		st.Status = status.StepSuccess
		if err := tx.Run().UpdateStep(st); err != nil {
			return err
		}
		return tx.Run().CreateTask(&store.Task{ID: k.ID, Type: "pipe.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: "a"})
	})
	if err == nil {
		t.Fatal("a batch whose write violates a primary key committed")
	}
	if n := openTransactions(t, s); n != 0 {
		t.Fatalf("%d sessions idle in a transaction right after the failed batch", n)
	}
	_, steps, err := s.GetRun(ctx, runs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if steps[0].Status != status.StepRunning {
		t.Fatalf("the failed batch wrote its step: %s", steps[0].Status)
	}
	if err := complete(t, s, runs[0], k, now); err != nil {
		t.Fatalf("batch after a failed one: %v", err)
	}
	if k2, err := s.GetTask(ctx, k.ID); err != nil || k2.Status != status.TaskSucceeded {
		t.Fatalf("task after the second batch: %+v, %v; want succeeded", k2, err)
	}
}

// TestPipelineInRunAndClaimFailures: a single-run transaction whose fn
// fails, one on an unknown run, one whose write fails, and a claim whose
// write fails each leave no transaction open and nothing written, and the
// store works afterwards.
func TestPipelineInRunAndClaimFailures(t *testing.T) {
	s, runs, _, now := pipeStore(t, 1)
	ctx := t.Context()
	boom := errors.New("boom")
	setStep := func(tx store.RunTx) error {
		st := tx.Step("s")
		st.Status = status.StepSuccess
		return tx.UpdateStep(st)
	}
	err := s.InRun(ctx, runs[0].ID, now, func(tx store.RunTx) error {
		if err := setStep(tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InRun whose fn fails = %v, want boom", err)
	}
	if err := s.InRun(ctx, "no-such-run", now, setStep); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("InRun on an unknown run = %v, want ErrNotFound", err)
	}
	undo := failOn(t, s, "UPDATE", "runs", "")
	if err := s.InRun(ctx, runs[0].ID, now, setStep); err == nil {
		t.Fatal("InRun whose write fails succeeded")
	}
	undo()
	if n := openTransactions(t, s); n != 0 {
		t.Fatalf("%d sessions idle in a transaction after the failed InRun calls", n)
	}
	if _, steps, err := s.GetRun(ctx, runs[0].ID); err != nil || steps[1].Status != status.StepSleeping {
		t.Fatalf("step s after the failed InRun calls: %v, %v; want sleeping", steps, err)
	}
	if err := s.InRun(ctx, runs[0].ID, now, setStep); err != nil {
		t.Fatalf("InRun after the failed ones: %v", err)
	}

	// A task to claim, then a claim whose write fails.
	if err := s.InRun(ctx, runs[0].ID, now, func(tx store.RunTx) error {
		return tx.CreateTask(&store.Task{Type: "pipe.y.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now, Step: "s"})
	}); err != nil {
		t.Fatal(err)
	}
	claim := store.ClaimTasks{Patterns: []string{"pipe.y.v1"}, WorkerID: "w", Lease: time.Minute, Max: 1, Now: now}
	undo = failOn(t, s, "UPDATE", "tasks", "")
	if got, err := s.ClaimTasks(ctx, claim); err == nil {
		t.Fatalf("a claim whose write fails returned %d tasks", len(got))
	}
	undo()
	if n := openTransactions(t, s); n != 0 {
		t.Fatalf("%d sessions idle in a transaction after the failed claim", n)
	}
	if got, err := s.ClaimTasks(ctx, claim); err != nil || len(got) != 1 || got[0].Attempt != 1 {
		t.Fatalf("claim after the failed one: %v, %v; want the task at attempt 1", got, err)
	}
}

// TestPipelineCommitOfAbortedTransaction: a statement that fails while the
// batch is being decided aborts the transaction; the COMMIT that follows
// is answered with a rollback, and the batch must report that, not
// success. (The first report's Dequeue succeeded and wrote nothing else:
// without the check it would be taken as applied.)
func TestPipelineCommitOfAbortedTransaction(t *testing.T) {
	s, runs, ks, now := pipeStore(t, 2)
	ctx := t.Context()
	for _, r := range runs {
		if err := s.InRun(ctx, r.ID, now, func(tx store.RunTx) error {
			return tx.Enqueue(store.QueueItem{Kind: store.KindHTTP, Step: "a", DueAt: now.Add(-time.Second)})
		}); err != nil {
			t.Fatal(err)
		}
	}
	items, err := s.Claim(ctx, now, time.Minute, 10, store.KindHTTP)
	if err != nil || len(items) != 2 {
		t.Fatalf("claim: %v (%d items)", err, len(items))
	}
	itemOf := map[string]*store.QueueItem{}
	for _, it := range items {
		itemOf[it.RunID] = it
	}
	// The second report's Dequeue fails on the server.
	defer failOn(t, s, "DELETE", "queue", fmt.Sprintf("OLD.id = %d", itemOf[runs[1].ID].ID))()
	known := map[string]string{ks[0].ID: runs[0].ID, ks[1].ID: runs[1].ID}
	errs, err := s.InTasks(ctx, []string{ks[0].ID, ks[1].ID}, known, now, func(_ int, tx store.TaskTx) error {
		it := itemOf[tx.Task().RunID]
		return tx.Run().Dequeue(it.ID, it.LeaseToken)
	})
	if err == nil {
		t.Fatalf("a batch whose transaction was aborted reported success (errs %v)", errs)
	}
	var left int
	if err := s.ReadDB().QueryRowContext(ctx, `SELECT COUNT(*) FROM queue WHERE id = $1`, itemOf[runs[0].ID].ID).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 1 {
		t.Errorf("the rolled-back batch's dequeue is gone from the table")
	}
	if n := openTransactions(t, s); n != 0 {
		t.Errorf("%d sessions idle in a transaction after the failed commit", n)
	}
}

// TestPipelineFireTimersFailure: a timer transaction whose write, or the
// deletion of the fired rows sent after it, fails writes nothing and
// leaves the timer due; once the failure is gone it fires.
func TestPipelineFireTimersFailure(t *testing.T) {
	s, runs, _, now := pipeStore(t, 1)
	ctx := t.Context()
	run := runs[0]
	if err := s.InRun(ctx, run.ID, now, func(tx store.RunTx) error {
		return tx.Enqueue(store.QueueItem{Kind: store.KindWake, Step: "s", DueAt: now.Add(-time.Second)})
	}); err != nil {
		t.Fatal(err)
	}
	fire := func() (int, []error, error) {
		return s.FireTimers(ctx, []string{run.ID}, nil, now, time.Minute, func(_ *store.QueueItem, tx store.RunTx) error {
			st := tx.Step("s")
			st.Status = status.StepSuccess
			return tx.UpdateStep(st)
		})
	}
	check := func(what string) {
		t.Helper()
		if n := openTransactions(t, s); n != 0 {
			t.Errorf("%s: %d sessions idle in a transaction", what, n)
		}
		_, steps, err := s.GetRun(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if steps[1].Status != status.StepSleeping {
			t.Errorf("%s: the step was written: %s", what, steps[1].Status)
		}
		if due, err := s.DueTimers(ctx, now, now, 10); err != nil || len(due) != 1 {
			t.Errorf("%s: due timers %d, %v; want the wake-up still due", what, len(due), err)
		}
	}
	for _, f := range []struct{ op, table string }{{"UPDATE", "runs"}, {"DELETE", "queue"}} {
		undo := failOn(t, s, f.op, f.table, "")
		if _, _, err := fire(); err == nil {
			t.Fatalf("a timer transaction with a failing %s of %s committed", f.op, f.table)
		}
		check("after a failing " + f.op + " of " + f.table)
		undo()
	}
	if n, errs, err := fire(); err != nil || n != 1 || len(errs) != 0 {
		t.Fatalf("fire once nothing fails: %d, %v, %v", n, errs, err)
	}
}

// TestPipelineLockReadFailure: a batch that meets a row locked elsewhere
// past the lock timeout (at its lock read, or, decided on the rows this
// store cached, at its guarded write) fails and leaves no transaction
// open; the batch succeeds once the lock is free.
func TestPipelineLockReadFailure(t *testing.T) {
	s, runs, ks, now := pipeStore(t, 1, "lock_timeout", "100")
	ctx := t.Context()
	holder, err := s.ReadDB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.ExecContext(ctx, `SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE`, ks[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := complete(t, s, runs[0], ks[0], now); err == nil {
		t.Fatal("a batch committed while its task was locked elsewhere")
	}
	var open int
	if err := holder.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = current_setting('application_name') AND state LIKE 'idle in transaction%'`).Scan(&open); err != nil {
		t.Fatal(err)
	}
	if open != 0 { // the holder itself is active while it asks
		t.Errorf("%d sessions idle in a transaction after the failed lock read", open)
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := complete(t, s, runs[0], ks[0], now); err != nil {
		t.Fatalf("batch once the lock is free: %v", err)
	}
}

// TestMigrateWithOneWriterConnection: ferry_max_conns=2 leaves one writer
// connection; migrating holds it for the advisory lock and must run the
// migrations on it rather than wait for another (it used to hang).
func TestMigrateWithOneWriterConnection(t *testing.T) {
	s := openDSN(t, pgtest.WithParam(t, pgtest.DSN(t), "ferry_max_conns", "2"))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate with one writer connection: %v", err)
	}
	if v, err := s.SchemaVersion(ctx); err != nil || v == 0 {
		t.Fatalf("schema version after Migrate = %d, %v", v, err)
	}
}

// TestWarmOpensConnections: Warm leaves the connections a light load uses
// open and idle in the pools, each having read the hot tables, and fits a
// pool smaller than that without waiting for a connection it holds itself.
func TestWarmOpensConnections(t *testing.T) {
	s := open(t)
	if n := s.DB().Stats().OpenConnections; n > 2 {
		t.Fatalf("%d write connections open before Warm, want at most the migration's", n)
	}
	if err := s.Warm(t.Context()); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	if w, r := s.DB().Stats(), s.ReadDB().Stats(); w.Idle < 8 || r.Idle < 1 {
		t.Errorf("after Warm: %d write and %d read connections idle, want at least 8 and 1", w.Idle, r.Idle)
	}

	small := openDSN(t, pgtest.WithParam(t, pgtest.DSN(t), "ferry_max_conns", "2"))
	if err := small.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := small.Warm(ctx); err != nil {
		t.Fatalf("Warm with one writer and one reader: %v", err)
	}
	if w, r := small.DB().Stats().Idle, small.ReadDB().Stats().Idle; w != 1 || r != 1 {
		t.Errorf("after Warm of a two-connection store: %d write and %d read connections idle, want 1 and 1", w, r)
	}
}

// TestWarmBeforeMigrateFails: Warm reads the hot tables, so on a schema
// without them it says so, and the store works once migrated.
func TestWarmBeforeMigrateFails(t *testing.T) {
	s := openDSN(t, pgtest.DSN(t))
	err := s.Warm(t.Context())
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("Warm on an empty schema = %v, want undefined_table (42P01)", err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate after a failed Warm: %v", err)
	}
	if _, err := s.CreateWorkflow(t.Context(), &store.Workflow{Name: "after-warm", Fingerprint: "f", Definition: json.RawMessage(`{}`)}); err != nil {
		t.Fatalf("CreateWorkflow after a failed Warm: %v", err)
	}
}

// TestClaimWalkSkipsTasksScheduledAhead: a claim's walk of the pending
// tasks reads the due ones of each priority, not the tasks scheduled
// ahead that sit between them in the pending index. A walk of the index
// in claim order read every one of them whenever it found fewer due tasks
// than it asked for (≈250 pages for 50,000 tasks scheduled ahead); the
// bound is on pages read, which do not depend on the machine's speed.
func TestClaimWalkSkipsTasksScheduledAhead(t *testing.T) {
	s := openDSN(t, pgtest.DSN(t))
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0).UTC()
	us := now.UnixMicro()
	fill := func(prefix string, n, priority int, runAt int64) {
		t.Helper()
		_, err := s.DB().ExecContext(t.Context(), `INSERT INTO tasks (id, type, payload, status, priority, run_at, attempt, max_attempts, created_at, updated_at)
			SELECT $1 || lpad(g::text, 8, '0'), 'sched.a.v1', '{}', 'pending', $2, $3::bigint + g, 0, 3, $4::bigint, $4::bigint FROM generate_series(1, $5) AS g`,
			prefix, priority, runAt, us, n)
		if err != nil {
			t.Fatal(err)
		}
	}
	fill("due-a", 3, 100, us-1000)
	fill("ahead", 50_000, 100, us+3_600_000_000)
	fill("due-b", 2, 200, us-1000)
	if _, err := s.DB().ExecContext(t.Context(), `ANALYZE tasks`); err != nil {
		t.Fatal(err)
	}
	qs, err := s.ClaimReads(t.Context(), store.ClaimTasks{Patterns: []string{"sched.%"}, WorkerID: "w", Lease: time.Minute, Max: 16, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	q := qs[0]
	rows, pages := explainPages(t, s, q)
	if rows != 5 {
		t.Errorf("the walk found %d tasks, want the 5 due", rows)
	}
	if pages > 60 {
		t.Errorf("the walk read %d pages for 5 due tasks among 50,000 scheduled ahead, want at most 60", pages)
	}
}

// explainPages runs q under EXPLAIN ANALYZE in a transaction it rolls
// back, and returns the rows it returned and the pages it read.
func explainPages(t *testing.T, s *postgres.Store, q sqlstore.PipeQuery) (rows, pages int) {
	t.Helper()
	tx, err := s.DB().BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // only read (and locked) rows
	var out string
	if err := tx.QueryRowContext(t.Context(), `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+q.SQL, q.Args...).Scan(&out); err != nil {
		t.Fatalf("explain %s: %v", q.SQL, err)
	}
	var plans []struct {
		Plan struct {
			Rows int `json:"Actual Rows"`
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		}
	}
	if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("plan %s: %v", out, err)
	}
	p := plans[0].Plan
	t.Logf("%d rows, %d pages: %s", p.Rows, p.Hit+p.Read, q.SQL)
	return p.Rows, p.Hit + p.Read
}

// TestPeerTasksOfNewTypes: a node whose claim of a prefix found nothing
// takes the task of a new type of it that another node created, at the
// same moment, once that node's notification has reached it (a node
// remembers the pending tasks' types for claims of a prefix; a peer's
// notification names the types, and the node adds them without a read).
func TestPeerTasksOfNewTypes(t *testing.T) {
	dsn := pgtest.DSN(t)
	node := migrated(t, dsn)
	wake := listening(t, node)
	other := openDSN(t, dsn)
	now := time.Unix(1_700_000_000, 0).UTC()
	claim := func() []*store.Task {
		t.Helper()
		got, err := node.ClaimTasks(t.Context(), store.ClaimTasks{Patterns: []string{"peer.%"}, WorkerID: "w", Lease: time.Minute, Max: 10, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := claim(); len(got) != 0 {
		t.Fatalf("claim with no task: %d tasks", len(got))
	}
	k, _, err := other.CreateTask(t.Context(), &store.Task{Type: "peer.new.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now}, now)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case w := <-wake:
		if w.all || !w.c.Tasks || !slices.Equal(w.c.Types, []string{"peer.new.v1"}) {
			t.Fatalf("the other node's task told this node %+v, want tasks of peer.new.v1 claimable", w)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up within 10s of the other node's task")
	}
	if got := claim(); len(got) != 1 || got[0].ID != k.ID {
		t.Fatalf("claim after the other node's notification: %d tasks, want its task %s", len(got), k.ID)
	}
}

// TestClaimLeavingLockedTasksSignals: a claim that locked more due tasks
// than it leased (a claim of two types locks up to max of each) tells its
// commit hook tasks are claimable (which wakes waiting claims: a claim at
// the same time skipped them); one that locked only what it leased does
// not.
func TestClaimLeavingLockedTasksSignals(t *testing.T) {
	s := open(t)
	now := time.Unix(1_700_000_000, 0).UTC()
	for _, typ := range []string{"lock.a.v1", "lock.b.v1", "lock.b.v1"} {
		if _, _, err := s.CreateTask(t.Context(), &store.Task{Type: typ, Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now}, now); err != nil {
			t.Fatal(err)
		}
	}
	var commits []store.Committed
	s.OnCommit(func(c store.Committed) { commits = append(commits, c) })
	claim := func(types ...string) {
		t.Helper()
		commits = nil
		got, err := s.ClaimTasks(t.Context(), store.ClaimTasks{Patterns: types, WorkerID: "w", Lease: time.Minute, Max: 1, Now: now})
		if err != nil || len(got) != 1 {
			t.Fatalf("claim of %v: %d tasks, %v", types, len(got), err)
		}
	}
	claim("lock.a.v1", "lock.b.v1")
	if len(commits) != 1 || !commits[0].Tasks {
		t.Errorf("a claim leaving a locked task: commits %+v, want one saying tasks are claimable", commits)
	}
	claim("lock.b.v1")
	for _, c := range commits {
		if c.Tasks {
			t.Errorf("a claim that leased all it locked said tasks are claimable: %+v", commits)
		}
	}
}

// TestClaimWalkSkipsOtherTypes: a claim of a type, and the read of when
// its next task is due, read only that type's tasks, not the 50,000 due
// tasks of another type waiting before them in claim order.
func TestClaimWalkSkipsOtherTypes(t *testing.T) {
	s := migrated(t, pgtest.DSN(t))
	now := time.Unix(1_700_000_000, 0).UTC()
	us := now.UnixMicro()
	fill := func(prefix, typ string, n int, runAt int64) {
		t.Helper()
		_, err := s.DB().ExecContext(t.Context(), `INSERT INTO tasks (id, type, payload, status, priority, run_at, attempt, max_attempts, created_at, updated_at)
			SELECT $1 || lpad(g::text, 8, '0'), $2, '{}', 'pending', 100, $3::bigint + g, 0, 3, $4::bigint, $4::bigint FROM generate_series(1, $5) AS g`,
			prefix, typ, runAt, us, n)
		if err != nil {
			t.Fatal(err)
		}
	}
	fill("busy", "busy.a.v1", 50_000, us-3_600_000_000)
	fill("rare-due", "rare.a.v1", 2, us-1000)
	fill("rare-ahead", "rare.a.v1", 3, us+60_000_000)
	if _, err := s.DB().ExecContext(t.Context(), `ANALYZE tasks`); err != nil {
		t.Fatal(err)
	}
	qs, err := s.ClaimReads(t.Context(), store.ClaimTasks{Patterns: []string{"rare.%"}, WorkerID: "w", Lease: time.Minute, Max: 16, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if rows, pages := explainPages(t, s, qs[0]); rows != 2 || pages > 60 {
		t.Errorf("the claim walk found %d tasks reading %d pages, want the 2 due in at most 60", rows, pages)
	}
	claimed, err := s.ClaimTasks(t.Context(), store.ClaimTasks{Patterns: []string{"rare.a.v1"}, WorkerID: "w", Lease: time.Hour, Max: 16, Now: now})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %d tasks, %v", len(claimed), err)
	}
	next, ok, err := s.NextTaskDue(t.Context(), []string{"rare.a.v1"}, now)
	if err != nil || !ok || !next.Equal(time.UnixMicro(us+60_000_001).UTC()) {
		t.Errorf("next due: %v, %v, %v", next, ok, err)
	}
	// The same read, timed by pages: NextTaskDue's pending walk is the
	// first of its two values.
	q, err := s.NextDueRead(t.Context(), []string{"rare.a.v1"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, pages := explainPages(t, s, q); pages > 60 {
		t.Errorf("the next-due walk read %d pages, want at most 60", pages)
	}
}

// BenchmarkClaimPastOtherType: see storetest.BenchClaimPastOtherType.
func BenchmarkClaimPastOtherType(b *testing.B) {
	s, err := postgres.Open(b.Context(), pgtest.DSN(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(b.Context()); err != nil {
		b.Fatal(err)
	}
	storetest.BenchClaimPastOtherType(b, s, s.DB(), 100_000)
}

// TestRefusedIsTheDataNotTheDatabase: Postgres refusing what a write
// carries (NUL in text, an index entry too large) is a refusal; a failed
// connection or a cancelled query is not.
func TestRefusedIsTheDataNotTheDatabase(t *testing.T) {
	s := open(t)
	ctx := t.Context()
	_, nul := s.DB().ExecContext(ctx, `SELECT $1::text`, "a\x00b")
	if nul == nil || !s.Refused(nul) {
		t.Errorf("NUL in text: %v, want an error Refused reports", nul)
	}
	noise := make([]byte, 3000) // incompressible: the entry stays large
	_, _ = rand.Read(noise)
	_, big := s.DB().ExecContext(ctx, `INSERT INTO runs (id, workflow_id, version, status, input, trigger_headers, idempotency_key, event_seq, started_at, updated_at, expires_at) VALUES ('r1', 'w', 1, 'running', '{}', '{}', $1, 0, 0, 0, 0)`, fmt.Sprintf("%x", noise))
	if big == nil || !strings.Contains(big.Error(), "index row") || !s.Refused(big) {
		t.Errorf("an idempotency key too large for its index: %v, want an error Refused reports", big)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, gone := s.DB().ExecContext(cctx, `SELECT 1`)
	if gone == nil || s.Refused(gone) {
		t.Errorf("a cancelled query: %v, want an error Refused does not report", gone)
	}
	if s.Refused(errors.New("connection refused")) {
		t.Error("a plain error reported as a refusal")
	}
}
