package storetest

import (
	"testing"

	"github.com/ferryhq/ferry/internal/store"
)

var migrateTests = []test{
	{"Dialect", testDialect},
	{"Idempotent", testMigrateIdempotent},
}

func testDialect(t *testing.T, s store.Store) {
	if d := s.Dialect(); d != "sqlite" && d != "postgres" {
		t.Errorf(`Dialect() = %q, want "sqlite" or "postgres"`, d)
	}
}

// testMigrateIdempotent migrates an already migrated store, with data in it,
// twice more: no error, and the data survives.
func testMigrateIdempotent(t *testing.T, s store.Store) {
	ctx := t.Context()
	must(t, s.Migrate(ctx), "Migrate (second time)")
	w := mkWorkflow(t, s, "survivor")
	must(t, s.Migrate(ctx), "Migrate (third time)")
	got, err := s.GetWorkflow(ctx, "survivor")
	must(t, err, "GetWorkflow after re-migrating")
	diff(t, "workflow", w, got)
	// The store still works for writes after re-migrating.
	mkWorkflow(t, s, "after")
}
