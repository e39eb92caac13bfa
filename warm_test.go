package ferry_test

import (
	"database/sql"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// TestOpenWarmsPostgres: the engine opens its Postgres connections before
// it returns, so the first runs after a start do not wait for them.
func TestOpenWarmsPostgres(t *testing.T) {
	eng, err := ferry.Open(t.Context(), ferry.Config{Database: pgtest.DSN(t), Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	pools, ok := eng.Store().(interface{ DB() *sql.DB })
	if !ok {
		t.Fatalf("the Postgres store %T does not expose its pool", eng.Store())
	}
	if n := pools.DB().Stats().Idle; n < 8 {
		t.Errorf("%d write connections idle after Open, want at least 8", n)
	}
}
