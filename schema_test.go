package ferry_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

// TestSchemaNewerOrMissing: a server does not start without migrating on
// a database never migrated, nor on one an older Ferry migrated (it says
// so: its statements need the missing migrations' columns); on a database a newer Ferry
// migrated (a node left behind in a rolling upgrade) it starts, whether
// it migrates on start or not, and says loudly that it is older than the
// schema. (An audit found it silent; refusing would crash-loop an old
// node restarting mid-upgrade.)
func TestSchemaNewerOrMissing(t *testing.T) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := "sqlite:" + filepath.Join(t.TempDir(), "f.db")
			if db == "postgres" {
				dsn = pgtest.DSN(t)
			}
			var logged bytes.Buffer
			open := func(migrate bool) error {
				logged.Reset()
				e, err := ferry.Open(ctx, ferry.Config{Database: dsn, Migrate: migrate, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
				if err == nil {
					e.Close()
				}
				return err
			}
			if err := open(false); !errors.Is(err, sqlstore.ErrNotMigrated) {
				t.Fatalf("not migrated, opened without migrating: %v, want ErrNotMigrated", err)
			}
			if err := open(true); err != nil {
				t.Fatal(err)
			}
			if err := open(false); err != nil || strings.Contains(logged.String(), "older than") {
				t.Fatalf("migrated, opened without migrating: %v; log %q", err, logged.String())
			}
			st, err := ferry.OpenStore(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			db := st.(interface{ DB() *sql.DB }).DB()
			// As an older Ferry left it: its last migration not applied
			// (an upgrade whose ferry migrate has not run yet).
			var last int
			var name string
			if err := db.QueryRow(`SELECT version, name FROM ferry_migrations ORDER BY version DESC LIMIT 1`).Scan(&last, &name); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(fmt.Sprintf(`DELETE FROM ferry_migrations WHERE version = %d`, last)); err != nil {
				t.Fatal(err)
			}
			if err := open(false); !errors.Is(err, sqlstore.ErrSchemaOlder) || !strings.Contains(err.Error(), fmt.Sprintf("database at migration %d, this ferry needs %d", last-1, last)) {
				t.Errorf("older schema, opened without migrating: %v, want ErrSchemaOlder naming both numbers", err)
			}
			if _, err := db.Exec(fmt.Sprintf(`INSERT INTO ferry_migrations (version, name) VALUES (%d, '%s')`, last, name)); err != nil {
				t.Fatal(err)
			}
			// A migration from a later version of Ferry.
			_, err = db.Exec(`INSERT INTO ferry_migrations (version, name) VALUES (9999, '9999_from_the_future.up.sql')`)
			st.Close()
			if err != nil {
				t.Fatal(err)
			}
			for _, migrate := range []bool{true, false} {
				err := open(migrate)
				if err != nil || !strings.Contains(logged.String(), "level=ERROR") || !strings.Contains(logged.String(), "database at migration 9999") {
					t.Errorf("newer schema, migrate %v: %v; log %q; want started, saying it is older", migrate, err, logged.String())
				}
			}
			if err := ferry.Migrate(ctx, dsn); !errors.Is(err, sqlstore.ErrSchemaNewer) {
				t.Errorf("ferry migrate with an older ferry: %v, want ErrSchemaNewer", err)
			}
		})
	}
}
