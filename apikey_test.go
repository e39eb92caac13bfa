package ferry_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/ferryhq/ferry"
)

// TestAPIKeyWithNewlineWorks: a FERRY_API_KEY read from a file ends in a
// newline; the key registered is the one without it, which a header can
// carry. (It was registered as it came and could never be used.)
func TestAPIKeyWithNewlineWorks(t *testing.T) {
	eng, err := ferry.Open(context.Background(), ferry.Config{Database: "sqlite:" + filepath.Join(t.TempDir(), "k.db"), Migrate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	if created, err := eng.EnsureAPIKey(context.Background(), " fry_secret\n"); err != nil || created != "" {
		t.Fatalf("EnsureAPIKey: %q, %v", created, err)
	}
	srv := httptest.NewServer(eng.Handler())
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/api/v1/workflows", nil)
	req.Header.Set("Authorization", "Bearer fry_secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the key without its newline: %d, want 200", resp.StatusCode)
	}
}
