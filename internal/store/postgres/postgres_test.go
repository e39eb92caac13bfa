package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/store/storetest"
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

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
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

// TestWakeups checks that CreateRun with queue items on one node wakes
// another node's listener, and tells the committing node's own hook.
func TestWakeups(t *testing.T) {
	// A unique application_name identifies our LISTEN connection in
	// pg_stat_activity.
	app := "ferry_wakeups_" + strings.ToLower(rand.Text())
	dsn := withParam(t, pgtest.DSN(t), "application_name", app)
	s := openDSN(t, dsn)
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	wake := s.Wakeups(ctx)
	t.Cleanup(func() {
		cancel()
		// The channel is closed once the listener has stopped.
		for range wake {
		}
	})

	// NOTIFY reaches only sessions that already LISTEN: wait until the
	// listener's connection has run LISTEN and gone idle.
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		err := s.DB().QueryRowContext(t.Context(), `SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = $1 AND query ILIKE 'LISTEN %' AND state = 'idle'`, app).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Wakeups listener did not start LISTENing within 15s")
		}
		<-tick.C
	}
	// Drop a wake-up some other test may have caused meanwhile.
	select {
	case <-wake:
	default:
	}

	// The writer is another node on the same database.
	other := openDSN(t, dsn)
	local := make(chan store.Committed, 1)
	other.OnCommit(func(c store.Committed) {
		select {
		case local <- c:
		default:
		}
	})
	wf, err := other.CreateWorkflow(t.Context(), &store.Workflow{Name: "wf", Fingerprint: "f", Definition: json.RawMessage(`{}`), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	_, created, err := other.CreateRun(t.Context(), &store.NewRun{
		Run: store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`),
			ExpiresAt: now.Add(time.Hour), StartedAt: now},
		Queue: []store.QueueItem{{Kind: store.KindHTTP, Step: "a", DueAt: now}},
	}, now)
	if err != nil || !created {
		t.Fatalf("CreateRun: created=%v err=%v", created, err)
	}

	select {
	case _, ok := <-wake:
		if !ok {
			t.Fatal("Wakeups channel closed before delivering")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up within 10s of CreateRun enqueueing an item")
	}
	select {
	case c := <-local:
		if !c.QueueDue.Equal(now) {
			t.Errorf("local commit hook: QueueDue = %v, want %v", c.QueueDue, now)
		}
	default:
		t.Error("the committing node's hook was not told of the queued item")
	}
}

func withParam(t *testing.T, dsn, k, v string) string {
	t.Helper()
	if !strings.Contains(dsn, "://") {
		return dsn + " " + k + "=" + v
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestMaxConnsOption: ferry_max_conns sizes the pool and never reaches
// Postgres; a bad value is refused.
func TestMaxConnsOption(t *testing.T) {
	dsn := pgtest.DSN(t)
	s, err := postgres.Open(t.Context(), dsn+"&ferry_max_conns=5")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.DB().Stats().MaxOpenConnections; got != 5 {
		t.Errorf("max open connections = %d, want 5", got)
	}
	if _, err := postgres.Open(t.Context(), dsn+"&ferry_max_conns=zero"); err == nil {
		t.Error("ferry_max_conns=zero accepted")
	}
	d, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := d.DB().Stats().MaxOpenConnections; got != postgres.DefaultMaxConns {
		t.Errorf("default max open connections = %d, want %d", got, postgres.DefaultMaxConns)
	}
}

// TestStatisticsRefreshedAsTablesGrow: once a server has written a few
// thousand rows into fresh tables it analyzes them itself, without waiting
// for autovacuum's next look.
func TestStatisticsRefreshedAsTablesGrow(t *testing.T) {
	s := openDSN(t, pgtest.DSN(t))
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	analyzed := func() bool {
		var n int
		err := s.DB().QueryRowContext(t.Context(), `SELECT COUNT(*) FROM pg_stat_user_tables
			WHERE schemaname = current_schema() AND relname = 'tasks' AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	if analyzed() {
		t.Fatal("tasks was analyzed before anything was written")
	}
	wf, err := s.CreateWorkflow(t.Context(), &store.Workflow{Name: "wf", Fingerprint: "f", Definition: json.RawMessage(`{}`), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var nrs []*store.NewRun
	for range 700 { // a run, a step, a task and its event each: 2,800 rows
		nrs = append(nrs, &store.NewRun{
			Run:   store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), StartedAt: now, ExpiresAt: now.Add(time.Hour)},
			Steps: []*store.StepRun{{Name: "a", Type: "task", Status: status.StepRunning}},
			Tasks: []*store.Task{{Type: "stats.x.v1", Payload: json.RawMessage(`{}`), Priority: 100, RunAt: now, Step: "a"}},
		})
	}
	if _, err := s.CreateRuns(t.Context(), nrs, now); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !analyzed() {
		if time.Now().After(deadline) {
			t.Fatal("tasks was not analyzed within 30s of 2,800 rows written")
		}
		<-tick.C
	}
}
