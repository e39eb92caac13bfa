package ferry_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

// TestSchemaNewerOrMissingIsRefused: a server does not start on a
// database migrated by a newer Ferry (whose writes it would misread: a
// rollback, a node left behind), whether it migrates on start or not, nor
// without migrating on a database never migrated; each says why. (Found by
// an audit: an older binary started silently on a newer schema and failed
// reads with 500s.)
func TestSchemaNewerOrMissingIsRefused(t *testing.T) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := "sqlite:" + filepath.Join(t.TempDir(), "f.db")
			if db == "postgres" {
				dsn = pgtest.DSN(t)
			}
			open := func(migrate bool) error {
				e, err := ferry.Open(ctx, ferry.Config{Database: dsn, Migrate: migrate, Logger: slog.New(slog.DiscardHandler)})
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
			if err := open(false); err != nil {
				t.Fatalf("migrated, opened without migrating: %v", err)
			}
			st, err := ferry.OpenStore(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			// A migration from a later version of Ferry.
			_, err = st.(interface{ DB() *sql.DB }).DB().Exec(`INSERT INTO ferry_migrations (version, name) VALUES (9999, '9999_from_the_future.up.sql')`)
			st.Close()
			if err != nil {
				t.Fatal(err)
			}
			for _, migrate := range []bool{true, false} {
				if err := open(migrate); !errors.Is(err, sqlstore.ErrSchemaNewer) {
					t.Errorf("newer schema, migrate %v: %v, want ErrSchemaNewer", migrate, err)
				}
			}
		})
	}
}
