package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

// stopped is a store whose writes have stopped for good, as SQLite's do
// after a failed sync (sqlite's TestFailedSyncStopsWrites makes a real
// one); its reads still answer.
type stopped struct {
	*sqlstore.Store
	err error
}

func (s stopped) WriteError() error { return s.err }

// TestHealthzWhenWritesStopped: /healthz answers 503 once the store has
// stopped writing, though reads still succeed. It answered 200 while
// every write failed until a restart, so a load balancer kept sending
// work to the server.
func TestHealthzWhenWritesStopped(t *testing.T) {
	st := keyedStore(t, "k")
	get := func(s *Server) (int, map[string]any) {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		var body map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		return rec.Code, body
	}
	if code, body := get(New(Config{Store: st})); code != http.StatusOK || body["status"] != "ok" {
		t.Fatalf("a writing store: %d %v", code, body)
	}
	code, body := get(New(Config{Store: stopped{st, errors.New("sync: disk gone")}}))
	if msg, _ := body["error"].(string); code != http.StatusServiceUnavailable || body["status"] != "unavailable" || !strings.Contains(msg, "disk gone") {
		t.Errorf("a store that stopped writing: %d %v, want 503 unavailable naming why", code, body)
	}
}
