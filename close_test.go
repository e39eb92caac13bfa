package ferry_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/ferryhq/ferry"
)

// TestCloseTwice: a second Engine.Close (an explicit Close beside a
// deferred one) does nothing and returns the first's error. (It panicked
// on SQLite.)
func TestCloseTwice(t *testing.T) {
	e, err := ferry.Open(context.Background(), ferry.Config{Database: "sqlite:" + filepath.Join(t.TempDir(), "f.db"), Migrate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
