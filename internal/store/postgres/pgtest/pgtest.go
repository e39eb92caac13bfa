package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultDSN is the local test server used when FERRY_TEST_POSTGRES is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// EnvDSN overrides DefaultDSN.
const EnvDSN = "FERRY_TEST_POSTGRES"

// SchemaPrefix starts the name of every schema DSN creates.
const SchemaPrefix = "ferry_t_"

// ServerDSN is the DSN of the test server: $FERRY_TEST_POSTGRES or DefaultDSN.
func ServerDSN() string {
	if v := os.Getenv(EnvDSN); v != "" {
		return v
	}
	return DefaultDSN
}

// DSN creates a fresh, uniquely named schema and returns a DSN that selects
// it through search_path. The schema is dropped (CASCADE) in t.Cleanup, so
// close anything using it in a cleanup registered after calling DSN (cleanups
// run last-in, first-out).
//
// When the server is unreachable DSN fails the test if the CI environment
// variable is non-empty and skips it otherwise.
func DSN(t testing.TB) string {
	t.Helper()
	base := ServerDSN()
	schema := SchemaPrefix + randomSuffix(t)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		unreachable(t, base, err)
		return ""
	}
	defer conn.Close(context.Background())
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("pgtest: create schema %s: %v", schema, err)
	}
	t.Cleanup(func() { dropSchema(t, base, ident) })

	dsn, err := withSearchPath(base, schema)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsn
}

func unreachable(t testing.TB, dsn string, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("pgtest: Postgres at %s is unreachable and CI is set, so this is a failure, not a skip: %v", redact(dsn), err)
	}
	t.Skipf("pgtest: skipping, Postgres at %s is unreachable (start it, or set %s to a reachable server): %v", redact(dsn), EnvDSN, err)
}

func dropSchema(t testing.TB, base, ident string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Errorf("pgtest: drop schema %s: %v", ident, err)
		return
	}
	defer conn.Close(context.Background())
	// A backend of the test's closed pool may still be finishing work in
	// the schema (a background ANALYZE its client stopped waiting for),
	// and Postgres may break the resulting lock cycle by failing the drop:
	// it is tried again, the other side having been let through.
	for attempt := 1; ; attempt++ {
		_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident+" CASCADE")
		var pgErr *pgconn.PgError
		if err == nil || attempt == 5 || !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
			break
		}
	}
	if err != nil {
		t.Errorf("pgtest: drop schema %s: %v", ident, err)
	}
}

// withSearchPath adds search_path=schema to a URL or keyword/value DSN; pgx
// sends unknown URL parameters to the server as run-time parameters. The
// schema is the sessions' application_name too, so that a test can tell
// its own sessions in pg_stat_activity from those of tests running beside
// it in the same database.
func withSearchPath(dsn, schema string) (string, error) {
	return withParams(dsn, "search_path", schema, "application_name", schema)
}

// WithParam returns dsn (a URL or keyword/value DSN, as DSN returns) with
// the parameter k set to v, e.g. ferry_max_conns.
func WithParam(t testing.TB, dsn, k, v string) string {
	t.Helper()
	out, err := withParams(dsn, k, v)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return out
}

// withParams sets each key of kv (key, value, key, value…) in dsn.
func withParams(dsn string, kv ...string) (string, error) {
	if !strings.Contains(dsn, "://") {
		for i := 0; i < len(kv); i += 2 {
			dsn += " " + kv[i] + "=" + kv[i+1]
		}
		return dsn, nil
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("parse %s: %w", EnvDSN, err)
	}
	q := u.Query()
	for i := 0; i < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func randomSuffix(t testing.TB) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("pgtest: random schema name: %v", err)
	}
	return hex.EncodeToString(b)
}

// redact hides a password in a DSN for messages.
func redact(dsn string) string {
	if !strings.Contains(dsn, "://") {
		if strings.Contains(dsn, "password") {
			return "$" + EnvDSN
		}
		return dsn
	}
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		return dsn
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}
