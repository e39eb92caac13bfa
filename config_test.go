package ferry_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry"
)

// TestOpenRefusesUnusablePublicURL: Open refuses a PublicURL callback
// URLs cannot be made from, as `ferry server --public-url` does: not an
// absolute http or https URL, or with a query or fragment, after which
// /wh/<token> is no path (https://host/?via=lb/wh/…: every callback
// missed). It opened, and every run's {{wait.<step>.url}} was wrong.
func TestOpenRefusesUnusablePublicURL(t *testing.T) {
	for _, public := range []string{
		"ferry.example.com", "ftp://ferry.example.com", "https://",
		"https://ferry.example.com/?via=lb", "https://ferry.example.com?", "https://ferry.example.com/#x", "https://ferry.example.com#",
	} {
		e, err := ferry.Open(context.Background(), ferry.Config{Database: "sqlite:" + filepath.Join(t.TempDir(), "f.db"), Migrate: true, PublicURL: public, Logger: slog.New(slog.DiscardHandler)})
		if err == nil {
			e.Close()
			t.Errorf("PublicURL %q: opened, want refused", public)
		} else if !strings.Contains(err.Error(), "public URL") {
			t.Errorf("PublicURL %q: %v, want an error naming the public URL", public, err)
		}
	}
	for _, public := range []string{"", "https://ferry.example.com", "http://127.0.0.1:8080/ferry/"} {
		e, err := ferry.Open(context.Background(), ferry.Config{Database: "sqlite:" + filepath.Join(t.TempDir(), "f.db"), Migrate: true, PublicURL: public, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Errorf("PublicURL %q: %v, want it opened", public, err)
			continue
		}
		e.Close()
	}
}
