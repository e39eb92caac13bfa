package sqlstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

//go:embed migrations
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	up      string
}

func loadMigrations(dialect string) ([]migration, error) {
	dir := "migrations/" + dialect
	entries, err := fs.ReadDir(migrationFS, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []migration
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".up.sql") {
			continue
		}
		v, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migration %s: bad number: %w", name, err)
		}
		b, err := fs.ReadFile(migrationFS, dir+"/"+name)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{v, name, string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// Migrate applies every embedded migration not yet applied, each in its own
// transaction together with its bookkeeping row, so a crash leaves the
// schema at a numbered version, never between two.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := loadMigrations(s.d.Name)
	if err != nil {
		return err
	}
	var db migrator = s.w
	if s.d.MigrationLock != "" {
		// Several servers may start at once on one Postgres. Lock before
		// creating the bookkeeping table: concurrent CREATE TABLE IF NOT
		// EXISTS races on Postgres (unique violation in pg_type). The
		// migrations run on the locked connection: the pool may have no
		// other (ferry_max_conns=2 leaves one writer connection).
		conn, err := s.w.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, s.d.MigrationLock); err != nil {
			return fmt.Errorf("migration lock: %w", err)
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), s.d.MigrationUnlock) //nolint:errcheck
		db = conn
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS ferry_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL)`); err != nil {
		return fmt.Errorf("create migrations table: %w", err)
	}
	if err := s.notNewer(ctx, db, ms); err != nil {
		return err
	}
	for _, m := range ms {
		if err := s.apply(ctx, db, m); err != nil {
			return err
		}
	}
	return nil
}

// ErrSchemaNewer: the database was migrated by a newer Ferry than this
// one, which may misread what newer servers write (a node left behind in a
// rolling upgrade, a rollback). ferry.Open starts all the same, saying so
// loudly: a rolling upgrade runs old and new servers on one database for a
// while, and an old one restarting then must not be refused.
var ErrSchemaNewer = errors.New("the database's schema is newer than this ferry: upgrade ferry")

// ErrNotMigrated: the database has no Ferry schema yet.
var ErrNotMigrated = errors.New("the database is not migrated: run ferry migrate, or start the server with --migrate")

// ErrSchemaOlder: the database lacks migrations this Ferry knows (an older
// Ferry migrated it, and ferry migrate has not run since). This binary's
// statements need its migrations' columns: started on it, it failed
// every trigger and step for a missing column.
var ErrSchemaOlder = errors.New("the database's schema is older than this ferry: run ferry migrate, or start the server with --migrate")

// notNewer refuses a database holding migrations this binary does not
// know.
func (s *Store) notNewer(ctx context.Context, db interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, ms []migration) error {
	var top sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT MAX(version) FROM ferry_migrations`).Scan(&top); err != nil {
		return fmt.Errorf("read migrations: %w", err)
	}
	if known := ms[len(ms)-1].version; top.Valid && int(top.Int64) > known {
		return fmt.Errorf("%w (database at migration %d, this ferry knows up to %d)", ErrSchemaNewer, top.Int64, known)
	}
	return nil
}

// CheckSchema tells, without changing anything, whether this binary can
// work on the database: migrated (ErrNotMigrated), with every migration
// this binary knows (ErrSchemaOlder), and not by a newer Ferry
// (ErrSchemaNewer).
func (s *Store) CheckSchema(ctx context.Context) error {
	ms, err := loadMigrations(s.d.Name)
	if err != nil {
		return err
	}
	// Whether the table is there, asked apart: a failed read (the
	// database down, no permission) is that error, not "not migrated".
	exists := `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'ferry_migrations'`
	if s.postgres() {
		exists = `SELECT COUNT(*) FROM pg_catalog.pg_tables WHERE schemaname = current_schema() AND tablename = 'ferry_migrations'`
	}
	var n int
	if err := s.r.QueryRowContext(ctx, exists).Scan(&n); err != nil {
		return fmt.Errorf("read the schema's version: %w", err)
	}
	if n == 0 {
		return ErrNotMigrated
	}
	var top sql.NullInt64
	if err := s.r.QueryRowContext(ctx, `SELECT MAX(version) FROM ferry_migrations`).Scan(&top); err != nil {
		return fmt.Errorf("read the schema's version: %w", err)
	}
	if !top.Valid {
		return ErrNotMigrated
	}
	if known := ms[len(ms)-1].version; int(top.Int64) < known {
		return fmt.Errorf("%w (database at migration %d, this ferry needs %d)", ErrSchemaOlder, top.Int64, known)
	}
	return s.notNewer(ctx, s.r, ms)
}

// migrator is a pool or one connection of it.
type migrator interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

func (s *Store) apply(ctx context.Context, db migrator, m migration) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	var n int
	if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM ferry_migrations WHERE version = ?`), m.version).Scan(&n); err != nil {
		return fmt.Errorf("check migration %s: %w", m.name, err)
	}
	if n > 0 {
		return nil
	}
	for _, stmt := range splitSQL(m.up) {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("migration %s: %w", m.name, err)
		}
	}
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO ferry_migrations (version, name) VALUES (?, ?)`), m.version, m.name); err != nil {
		return fmt.Errorf("record migration %s: %w", m.name, err)
	}
	return tx.Commit()
}

func splitSQL(src string) []string {
	var out []string
	for _, part := range strings.Split(src, ";") {
		if p := strings.TrimSpace(part); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// SchemaVersion returns the highest applied migration.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v sql.NullInt64
	err := s.r.QueryRowContext(ctx, `SELECT MAX(version) FROM ferry_migrations`).Scan(&v)
	return int(v.Int64), err
}
