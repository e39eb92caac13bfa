package sqlite_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/sqlite"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
	"github.com/ferryhq/ferry/internal/store/storetest"
)

// open returns a migrated store on a fresh file, closed when t ends.
func open(t *testing.T) *sqlstore.Store {
	t.Helper()
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "ferry.db"))
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
}

func TestWALMode(t *testing.T) {
	s := open(t)
	var mode string
	if err := s.DB().QueryRowContext(t.Context(), "PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatalf("PRAGMA journal_mode: %v", err)
	}
	if !strings.EqualFold(mode, "wal") {
		t.Errorf("journal_mode = %q, want wal", mode)
	}
}

func TestOpenEmptyPath(t *testing.T) {
	if s, err := sqlite.Open(""); err == nil {
		s.Close()
		t.Fatal("Open(\"\") succeeded, want an error")
	}
}
