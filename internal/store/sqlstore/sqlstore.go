package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// Dialect is what differs between the backends.
type Dialect struct {
	Name string
	// Dollar placeholders ($1) instead of ?.
	Dollar bool
	// LockRun is appended to the run SELECT inside InRun (FOR UPDATE).
	LockRun string
	// SkipLocked is appended to the claim sub-select.
	SkipLocked string
	// Lateral says the database joins LATERAL subqueries: a claim then
	// walks a type's due pending tasks priority by priority in one (see
	// Store.duePending); without it (SQLite) as an IN over the
	// priorities, which SQLite walks in the index's order.
	Lateral bool
	// ShareLock is appended to reads that must hold a row unchanged until
	// the transaction ends (Postgres: FOR SHARE; SQLite has one writer).
	ShareLock string
	// IsUnique classifies unique-constraint violations.
	IsUnique func(error) bool
	// MigrationLock/Unlock serialise concurrent migrators (Postgres).
	MigrationLock, MigrationUnlock string
	// RowVersion is an expression on runs r that changes whenever the row
	// is written (Postgres: r.xmin::text); set, it enables EnableVersionCache.
	RowVersion string
	// Analyze, when set, is the statement that refreshes the planner's
	// statistics of the hot tables given (each an entry of AnalyzeTables)
	// (see Store.grew).
	Analyze func(tables []string) string
	// Pipeline, when set, sends statements on conn in one round trip and
	// reads their results in order (see pipeline.go).
	Pipeline func(ctx context.Context, conn *sql.Conn, qs []PipeQuery) error
	// Generic, when set, is the statement that makes the rest of a
	// pipelined transaction run its prepared statements on generic plans
	// (see pipeline.go).
	Generic string
	// SizeParams, when set, takes a combined write statement's arguments
	// before they are sent, and may return them wrapped for the driver
	// (Postgres: so that pgx sizes its buffers for them once).
	SizeParams func(args []any) []any
	// RunRowSteps is the most steps a run may have and keep its small
	// steps in its own row rather than in step_runs (see packedsteps.go);
	// 0 keeps every step in step_runs.
	RunRowSteps int
}

// shortRun says whether a run of this many steps keeps its small steps in
// its row.
func (s *Store) shortRun(steps int) bool { return steps <= s.d.RunRowSteps }

// Store implements store.Store over database/sql.
type Store struct {
	d Dialect
	w *sql.DB // writes (SQLite: a single connection)
	r *sql.DB // reads (may equal w)

	closers []func() error
	// log is where the store's own messages go (SetLogger; nil: slog's
	// default): atomic, for goroutines started before it is set.
	log atomic.Pointer[slog.Logger]
	// afterClose run once the pools are closed (AfterClose).
	afterClose []func() error
	ptypes     typeCache     // the types of the tasks that may be pending
	group      *groupCommit  // SQLite: one writer applying requests in groups
	cache      *runCache     // SQLite: runs as the writer last wrote them
	vcache     *versionCache // Postgres: runs by row version
	tcache     *taskCache    // Postgres: the tasks this store leased, by row version
	hook       atomic.Pointer[func(store.Committed)]
	evHook     atomic.Pointer[func([]store.EventCount)]
	finHook    atomic.Pointer[func([]store.Finished)]
	share      atomic.Pointer[func() (index, of int)] // see ShareTimers

	written    [len(AnalyzeTables)]atomic.Int64 // rows this server inserted, by table
	analyzedAt [len(AnalyzeTables)]atomic.Int64 // written at the table's last ANALYZE
	analyzing  atomic.Bool
	bgMu       sync.Mutex // orders bg.Add before Close's bg.Wait
	closing    bool
	bg         sync.WaitGroup

	// claimFilled: the last claim transaction got all it asked for (see
	// ClaimTasks).
	claimFilled atomic.Bool
	qcache      sync.Map // query text -> dialect text
	stmts       sync.Map // stmtKey -> generated statement (dialect text)
	stmtsN      atomic.Int64
	qcached     atomic.Int64
}

// OnCommit registers fn to learn what each committed write made ready.
func (s *Store) OnCommit(fn func(store.Committed)) { s.hook.Store(&fn) }

// OnEvents registers fn to learn how many events of each type each
// committed write appended (metrics). fn runs on the committing
// goroutine: it must be quick and must not write.
func (s *Store) OnEvents(fn func([]store.EventCount)) { s.evHook.Store(&fn) }

// OnFinished registers fn to learn which steps and runs each committed
// write ended (tracing). fn runs on the committing goroutine: it must be
// quick and must not write.
func (s *Store) OnFinished(fn func([]store.Finished)) { s.finHook.Store(&fn) }

// DBs returns the connection pools, for their statistics: writes and
// reads (the same pool when reads have none of their own).
func (s *Store) DBs() (write, read *sql.DB) { return s.w, s.r }

// countEvents tallies events by type. A write holds few distinct types
// (a report batch: claimed, succeeded, step and run events), so a slice
// searched in order costs less than a map.
func countEvents(evs []eventRow) []store.EventCount {
	var out []store.EventCount
next:
	for i := range evs {
		for j := range out {
			if out[j].Type == evs[i].typ {
				out[j].N++
				continue next
			}
		}
		out = append(out, store.EventCount{Type: evs[i].typ, N: 1})
	}
	return out
}

// note collects, inside a write, what its commit will make ready.
type note struct {
	c store.Committed
	// now says some task the commit made pending may be claimable at
	// once; later is the earliest run_at of those that are not yet (see
	// Committed.TasksAt).
	now   bool
	later time.Time
}

// pending notes a task made pending, claimable from runAt, by a write at
// now.
func (n *note) pending(runAt, now time.Time) {
	n.c.Tasks = true
	if !runAt.After(now) {
		n.now = true
	} else if n.later.IsZero() || runAt.Before(n.later) {
		n.later = runAt
	}
}

// claimable notes tasks that may be claimable at once.
func (n *note) claimable() { n.c.Tasks, n.now = true, true }

func (n *note) queued(kind string, due time.Time) {
	at := &n.c.HTTPDue
	if store.IsTimer(kind) {
		at = &n.c.TimerDue
	}
	if at.IsZero() || due.Before(*at) {
		*at = due
	}
}

// merge takes in what o's commit would make ready.
func (n *note) merge(o note) {
	if !o.c.HTTPDue.IsZero() {
		n.queued(store.KindHTTP, o.c.HTTPDue)
	}
	if !o.c.TimerDue.IsZero() {
		n.queued(store.KindWake, o.c.TimerDue)
	}
	n.c.Tasks = n.c.Tasks || o.c.Tasks
	// (Tasks noted some other way may be claimable at once.)
	n.now = n.now || o.now || (o.c.Tasks && o.later.IsZero())
	if !o.later.IsZero() && (n.later.IsZero() || o.later.Before(n.later)) {
		n.later = o.later
	}
	n.c.Leased = append(n.c.Leased, o.c.Leased...)
	n.c.Registry = n.c.Registry || o.c.Registry
}

// committed tells the hook about a write that has committed, and keeps
// the planner's statistics in step with the tables' growth.
func (s *Store) committed(cs *changeset) {
	if s.vcache != nil && len(cs.cacheIDs) > 0 {
		s.vcache.put(cs.cacheIDs, cs.cacheRuns)
	}
	if s.tcache != nil {
		s.tcache.put(cs)
	}
	s.grew(cs.newRows())
	if fn := s.evHook.Load(); fn != nil && len(cs.events) > 0 {
		(*fn)(countEvents(cs.events))
	}
	if fn := s.finHook.Load(); fn != nil && len(cs.events) > 0 {
		if f := finishedIn(cs); len(f) > 0 {
			(*fn)(f)
		}
	}
	n := &cs.note
	if n.c.HTTPDue.IsZero() && n.c.TimerDue.IsZero() && !n.c.Tasks && len(n.c.Leased) == 0 && !n.c.Registry {
		return
	}
	if n.c.Tasks {
		n.c.Types = s.ptypes.note(cs) // before the claims it wakes look
		if !n.now && !n.later.IsZero() {
			n.c.TasksAt = n.later
		}
	}
	if fn := s.hook.Load(); fn != nil {
		(*fn)(n.c)
	}
}

// AnalyzeTables are the tables the background ANALYZE refreshes (see
// Store.grew), in the order changeset.newRows counts their rows.
var AnalyzeTables = [...]string{"runs", "step_runs", "tasks", "queue"}

// analyzeFloor is the fewest new rows of a table that make a fresh
// ANALYZE of it worth it.
const analyzeFloor = 1000

// analyzeCeiling: a table whose last refresh saw this many new rows or
// more is left to autovacuum. Its statistics then describe a table of
// thousands of rows, which the planner scales by the table's size as it
// plans; what the refresh exists for is a table summarized while nearly
// empty. Each refresh after that one sampled 3,000 rows of every table
// due while the burst that grew them was still being written (the
// `sleep` benchmark on Postgres: ≈0.3 s of Postgres's CPU in its few
// seconds, its tasks refreshed at 8,000 rows as the wake-ups ran).
const analyzeCeiling = 4000

// grew counts the rows this server inserted into each hot table and,
// once a table's at least double what its last ANALYZE saw (and number
// analyzeFloor or more), analyzes it in the background, with any other
// table due. Postgres's autovacuum looks only once a minute: a fresh
// database filled in seconds kept the statistics of its empty tables,
// and the planner sorted whole tables where an index walk would do (a
// claim took 8 ms instead of a fraction of one).
//
// Each table on its own count: the refresh used to follow the rows of
// all four, so a burst of sleeping runs (runs and queue items) analyzed
// tasks while it held a few rows, and the ten thousand tasks their
// wake-ups then wrote were not enough to refresh it again. Planned on
// those statistics, while the table was a page or two, a write's generic
// plan walked every task for each batch (UPDATE … FROM the batch's
// arrays, with the tasks as the outer side), and kept doing so as the
// table grew: reports and claims took 160–460 ms each and a `sleep`
// run took 86 s instead of 4 (twenty-third pass). A table analyzed at
// analyzeFloor rows or more plans its batches' writes as lookups by key.
func (s *Store) grew(n [len(AnalyzeTables)]int) {
	if s.d.Analyze == nil {
		return
	}
	wrote := false
	for i, k := range n {
		if k > 0 {
			s.written[i].Add(int64(k))
			wrote = true
		}
	}
	if !wrote || len(s.dueTables()) == 0 || !s.analyzing.CompareAndSwap(false, true) {
		return
	}
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.closing {
		s.analyzing.Store(false)
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		// Tables that came due while an ANALYZE ran are refreshed
		// next, not left until they grow again: a burst of tasks that
		// ends during the refresh of runs would otherwise keep the
		// statistics this refresh exists for.
		for {
			s.bgMu.Lock()
			closing := s.closing
			s.bgMu.Unlock()
			due := s.dueTables()
			if closing || len(due) == 0 {
				s.analyzing.Store(false)
				// A write that saw analyzing set may have made a
				// table due after the read above.
				if closing || len(s.dueTables()) == 0 || !s.analyzing.CompareAndSwap(false, true) {
					return
				}
				continue
			}
			s.analyze(due)
		}
	}()
}

// dueTables are the tables (of AnalyzeTables) whose inserted rows have
// at least doubled since their last ANALYZE and number analyzeFloor or
// more, up to analyzeCeiling.
func (s *Store) dueTables() []string {
	var due []string
	for i, t := range AnalyzeTables {
		w, last := s.written[i].Load(), s.analyzedAt[i].Load()
		if last < analyzeCeiling && w-last >= max(analyzeFloor, last) {
			due = append(due, t)
		}
	}
	return due
}

// analyze refreshes the statistics of tables, recording the rows written
// to each as of now as analyzed.
func (s *Store) analyze(tables []string) {
	for i, t := range AnalyzeTables {
		if slices.Contains(tables, t) {
			s.analyzedAt[i].Store(s.written[i].Load())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.w.ExecContext(ctx, s.d.Analyze(tables)); err != nil {
		s.Log().Warn("refreshing planner statistics failed", "tables", tables, "err", err)
	}
}

// New builds a Store from a writer and a reader pool (they may be the same).
func New(d Dialect, writer, reader *sql.DB, closers ...func() error) *Store {
	return &Store{d: d, w: writer, r: reader, closers: closers}
}

var _ store.Store = (*Store)(nil)

// Dialect names the backend.
func (s *Store) Dialect() string { return s.d.Name }

// DB exposes the writer pool for tests and tools.
func (s *Store) DB() *sql.DB { return s.w }

// ReadDB exposes the reader pool (it may be the writer pool) for tests.
func (s *Store) ReadDB() *sql.DB { return s.r }

// EnableGroupCommit makes writes go through one writer that commits up to
// max requests at once (for a single-writer database such as SQLite). With
// sync, commits need not be durable when they return: sync makes every
// commit so far durable, and requests are answered only after it (see
// groupCommit).
func (s *Store) EnableGroupCommit(max int, sync func() error) {
	s.cache = newRunCache()
	s.cache.check = os.Getenv("FERRY_RUNCACHE_CHECK") != ""
	s.group = newGroupCommit(s.w, max, s.cache, sync)
}

// WriteError is why the store no longer writes, or nil: on SQLite, the
// first failed sync, after which every write fails (nothing since the
// last sync is known to be on disk) until the server restarts. /healthz
// answers 503 with it, so that a load balancer stops sending work to a
// server whose reads still succeed.
func (s *Store) WriteError() error {
	if s.group == nil {
		return nil
	}
	return s.group.failed()
}

// SerialWrites tells whether one writer applies every write in turn
// (SQLite's group commit): concurrent write transactions never wait for
// each other's locks then.
func (s *Store) SerialWrites() bool { return s.group != nil }

// durable returns once every write committed so far is on disk. With
// SQLite's deferred sync, a commit made outside the group writer (workflow
// and key changes) or a row found by a read is not yet known to be; this
// waits for the next sync. Elsewhere a commit is durable when it returns.
func (s *Store) durable(ctx context.Context) error {
	if s.group == nil || s.group.sync == nil {
		return nil
	}
	return s.group.barrier(ctx)
}

// stage keeps the runs a write request wrote for the requests after it
// (SQLite); it is the request's last step.
func (s *Store) stage(ctx context.Context, tx querier, runs map[string]*runTx, cs *changeset) error {
	switch {
	case s.cache != nil:
		s.cache.stage(runs, cs)
	case s.vcache != nil:
		return s.vstage(ctx, tx, runs, cs)
	}
	return nil
}

// EnableVersionCache keeps runs' steps between transactions, used while
// the run's row version is unchanged (Dialect.RowVersion; see
// versionCache), and the tasks this store leased, for optimistic report
// batches (see optimistic.go).
func (s *Store) EnableVersionCache() {
	s.vcache = newVersionCache()
	s.vcache.check = os.Getenv("FERRY_RUNCACHE_CHECK") != ""
	s.tcache = newTaskCache()
}

// Close closes the pools and any extra resources.
func (s *Store) Close() error {
	s.bgMu.Lock()
	s.closing = true
	s.bgMu.Unlock()
	s.bg.Wait()
	if s.group != nil {
		s.group.close()
	}
	var errs []error
	for _, c := range s.closers {
		errs = append(errs, c())
	}
	errs = append(errs, s.w.Close())
	if s.r != s.w {
		errs = append(errs, s.r.Close())
	}
	for _, c := range s.afterClose {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// SetLogger sends the store's own messages (a failed statistics refresh,
// Postgres's nodes joining and leaving, a listener reconnecting) to l, the
// engine's logger, rather than to slog's default, which a server does not
// set: they then follow its level and format.
func (s *Store) SetLogger(l *slog.Logger) { s.log.Store(l) }

// Log is the store's logger (SetLogger), slog's default until one is set.
func (s *Store) Log() *slog.Logger {
	if l := s.log.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// AfterClose has Close call fn once both pools are closed: for what must
// outlive every connection (the SQLite store's -shm descriptor, whose
// closing would drop the connections' locks).
func (s *Store) AfterClose(fn func() error) { s.afterClose = append(s.afterClose, fn) }

// q rewrites ? placeholders for the dialect. Queries never hold a literal ?.
// Rewritten texts are kept: the set-wise statements are long, and their
// shapes few (power-of-two sizes).
func (s *Store) q(query string) string {
	if !s.d.Dollar {
		return query
	}
	if v, ok := s.qcache.Load(query); ok {
		return v.(string)
	}
	out := dollars(query)
	if s.qcached.Add(1) <= maxCachedQueries {
		s.qcache.Store(query, out)
	}
	return out
}

// maxCachedQueries bounds the rewritten texts kept (list filters and claim
// patterns make a few more shapes than the fixed statements).
const maxCachedQueries = 2048

func dollars(query string) string {
	var b strings.Builder
	b.Grow(len(query) + len(query)/8)
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(query[i])
	}
	return b.String()
}

// Times are stored as Unix microseconds on both backends: exact, comparable
// and free of driver time-zone conversions.
func ts(t time.Time) int64 { return t.UnixMicro() }

func fromTS(v int64) time.Time { return time.UnixMicro(v).UTC() }

func tsPtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixMicro()
}

func fromNullTS(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := fromTS(v.Int64)
	return &t
}

func nullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func newID() string { return uuid.Must(uuid.NewV7()).String() }

func token() string { return rand.Text() }

// ---- workflows ----

const wfCols = `w.id, w.name, w.version, w.enabled, w.deleted_at, w.created_at, w.updated_at, v.fingerprint, v.definition`

func scanWorkflow(row interface{ Scan(...any) error }) (*store.Workflow, error) {
	var w store.Workflow
	var deleted sql.NullInt64
	var created, updated int64
	var def string
	if err := row.Scan(&w.ID, &w.Name, &w.Version, &w.Enabled, &deleted, &created, &updated, &w.Fingerprint, &def); err != nil {
		return nil, err
	}
	w.DeletedAt = fromNullTS(deleted)
	w.CreatedAt, w.UpdatedAt = fromTS(created), fromTS(updated)
	w.Definition = json.RawMessage(def)
	return &w, nil
}

// CreateWorkflow inserts version 1 of a new workflow.
func (s *Store) CreateWorkflow(ctx context.Context, w *store.Workflow) (*store.Workflow, error) {
	now := time.Now()
	id := newID()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO workflows (id, name, version, enabled, created_at, updated_at) VALUES (?, ?, 1, ?, ?, ?)`),
		id, w.Name, w.Enabled, ts(now), ts(now)); err != nil {
		if s.d.IsUnique(err) {
			return nil, fmt.Errorf("workflow %q already exists: %w", w.Name, store.ErrConflict)
		}
		return nil, fmt.Errorf("insert workflow: %w", err)
	}
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO workflow_versions (workflow_id, version, fingerprint, definition, created_at) VALUES (?, 1, ?, ?, ?)`),
		id, w.Fingerprint, string(w.Definition), ts(now)); err != nil {
		return nil, fmt.Errorf("insert workflow version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	if err := s.durable(ctx); err != nil {
		return nil, err
	}
	return s.GetWorkflow(ctx, id)
}

// resolveRef finds the live workflow id for an id or a name.
func (s *Store) resolveRef(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, ref string) (string, error) {
	var id string
	err := q.QueryRowContext(ctx, s.q(`SELECT id FROM workflows WHERE (id = ? OR name = ?) AND deleted_at IS NULL ORDER BY CASE WHEN id = ? THEN 0 ELSE 1 END LIMIT 1`), ref, ref, ref).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("workflow %q: %w", ref, store.ErrNotFound)
	}
	return id, err
}

// UpdateWorkflow writes a new version unless nothing changed.
func (s *Store) UpdateWorkflow(ctx context.Context, ref string, w *store.Workflow) (*store.Workflow, error) {
	now := time.Now()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck
	id, err := s.resolveRef(ctx, tx, ref)
	if err != nil {
		return nil, err
	}
	// The workflow's row alone is locked, and its version read from it
	// once the lock is held. Locked through a join with its version, a
	// second update that waited for the first re-checked the join against
	// the new version and the old version's row on Postgres, found no row
	// and failed (a 500 for concurrent updates). A workflow deleted while
	// this waited is not found.
	var version int
	err = tx.QueryRowContext(ctx, s.q(`SELECT version FROM workflows WHERE id = ? AND deleted_at IS NULL`+s.d.LockRun), id).Scan(&version)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("workflow %q: %w", ref, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("load workflow: %w", err)
	}
	var fp string
	if err := tx.QueryRowContext(ctx, s.q(`SELECT fingerprint FROM workflow_versions WHERE workflow_id = ? AND version = ?`), id, version).Scan(&fp); err != nil {
		return nil, fmt.Errorf("load workflow version: %w", err)
	}
	if fp != w.Fingerprint {
		version++
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO workflow_versions (workflow_id, version, fingerprint, definition, created_at) VALUES (?, ?, ?, ?, ?)`),
			id, version, w.Fingerprint, string(w.Definition), ts(now)); err != nil {
			return nil, fmt.Errorf("insert workflow version: %w", err)
		}
	}
	// updated_at moves only when something did: an update that changes
	// nothing (the same definition, name and state, as `ferry apply`
	// sends on every deploy) leaves the workflow as it was.
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE workflows SET updated_at = CASE WHEN name = ? AND version = ? AND enabled = ? THEN updated_at ELSE ? END, name = ?, version = ?, enabled = ? WHERE id = ?`),
		w.Name, version, w.Enabled, ts(now), w.Name, version, w.Enabled, id); err != nil {
		if s.d.IsUnique(err) {
			return nil, fmt.Errorf("workflow %q already exists: %w", w.Name, store.ErrConflict)
		}
		return nil, fmt.Errorf("update workflow: %w", err)
	}
	// The answer is the workflow as this update left it, read before the
	// commit: read after it, a concurrent update's version could answer
	// for this one.
	out, err := scanWorkflow(tx.QueryRowContext(ctx, s.q(`SELECT `+wfCols+` FROM workflows w JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.version WHERE w.id = ?`), id))
	if err != nil {
		return nil, fmt.Errorf("read updated workflow: %w", err)
	}
	if s.cache != nil {
		// Runs carry their workflow's name; counted before the commit, so
		// no group that starts after it misses it.
		s.cache.outside.Add(1)
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	if err := s.durable(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// GetWorkflow returns a live workflow by id or name.
func (s *Store) GetWorkflow(ctx context.Context, ref string) (*store.Workflow, error) {
	// One query for id-or-name: an id wins over a name that looks like one.
	row := s.r.QueryRowContext(ctx, s.q(`SELECT `+wfCols+` FROM workflows w JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.version
		WHERE (w.id = ? OR w.name = ?) AND w.deleted_at IS NULL ORDER BY CASE WHEN w.id = ? THEN 0 ELSE 1 END LIMIT 1`), ref, ref, ref)
	w, err := scanWorkflow(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("workflow %q: %w", ref, store.ErrNotFound)
	}
	return w, err
}

// GetWorkflowVersion returns one pinned version, even of a deleted workflow,
// because in-flight runs finish after a delete.
func (s *Store) GetWorkflowVersion(ctx context.Context, id string, version int) (*store.Workflow, error) {
	row := s.r.QueryRowContext(ctx, s.q(`SELECT w.id, w.name, v.version, w.enabled, w.deleted_at, w.created_at, w.updated_at, v.fingerprint, v.definition FROM workflows w JOIN workflow_versions v ON v.workflow_id = w.id WHERE w.id = ? AND v.version = ?`), id, version)
	w, err := scanWorkflow(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("workflow %s version %d: %w", id, version, store.ErrNotFound)
	}
	return w, err
}

func limit(p store.Page) int {
	if p.Limit <= 0 || p.Limit > 500 {
		return 50
	}
	return p.Limit
}

// ListWorkflows pages live workflows by name.
func (s *Store) ListWorkflows(ctx context.Context, p store.Page) ([]*store.Workflow, string, error) {
	n := limit(p)
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT `+wfCols+` FROM workflows w JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.version WHERE w.deleted_at IS NULL AND w.name > ? ORDER BY w.name LIMIT ?`), p.Cursor, n+1)
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	var out []*store.Workflow
	for rows.Next() {
		w, err := scanWorkflow(rows)
		if err != nil {
			return nil, "", err
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > n {
		out = out[:n]
		next = out[n-1].Name
	}
	return out, next, nil
}

// DeleteWorkflow soft-deletes; runs keep their pinned version.
func (s *Store) DeleteWorkflow(ctx context.Context, ref string) error {
	id, err := s.resolveRef(ctx, s.w, ref)
	if err != nil {
		return err
	}
	now := ts(time.Now())
	res, err := s.w.ExecContext(ctx, s.q(`UPDATE workflows SET deleted_at = ?, updated_at = ? WHERE id = ? AND deleted_at IS NULL`), now, now, id)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		// Deleted by another request since it was found: that one
		// deleted it, this one found it gone, once that delete is on
		// disk (a crash must not bring back what a 404 said was gone).
		if err := s.durable(ctx); err != nil {
			return err
		}
		return fmt.Errorf("workflow %q: %w", ref, store.ErrNotFound)
	}
	return s.durable(ctx)
}

// ---- API keys ----

// AddAPIKey stores a key hash.
func (s *Store) AddAPIKey(ctx context.Context, name, hash string) error {
	_, err := s.w.ExecContext(ctx, s.q(`INSERT INTO api_keys (hash, name, created_at) VALUES (?, ?, ?)`), hash, name, ts(time.Now()))
	if err != nil && !s.d.IsUnique(err) {
		return err
	}
	return s.durable(ctx)
}

// HasAPIKeys reports whether any key exists.
func (s *Store) HasAPIKeys(ctx context.Context) (bool, error) {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM api_keys`).Scan(&n)
	return n > 0, err
}

// APIKeyExists looks a key hash up.
func (s *Store) APIKeyExists(ctx context.Context, hash string) (bool, error) {
	var n int
	err := s.r.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM api_keys WHERE hash = ?`), hash).Scan(&n)
	return n > 0, err
}

// statusTerminalSQL lists the run statuses that end a run.
var statusTerminalSQL = "('" + strings.Join([]string{status.RunCompleted, status.RunFailed, status.RunCancelled, status.RunTimeout}, "','") + "')"
