package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/store/sqlite"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

// keyedStore is a fresh, migrated SQLite store holding the API key key,
// closed when the test ends.
func keyedStore(t *testing.T, key string) *sqlstore.Store {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "k.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := st.AddAPIKey(t.Context(), "t", HashKey(key)); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestRevokedKeyStopsWorking: a key whose row is deleted (how a key is
// revoked) stops being accepted once its verification is older than the
// recheck, without a restart. (Found by an audit: verified keys were
// kept for the process's life.)
func TestRevokedKeyStopsWorking(t *testing.T) {
	st := keyedStore(t, "fry_secret")
	ctx := context.Background()
	s := New(Config{Store: st})
	if ok, err := s.checkKey(ctx, "fry_secret"); !ok || err != nil {
		t.Fatalf("a stored key: %v %v", ok, err)
	}
	if _, err := st.DB().Exec(`DELETE FROM api_keys`); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.checkKey(ctx, "fry_secret"); !ok {
		t.Fatal("within the recheck the verified key is taken as it was (no read a request)")
	}
	s.keyTTL = time.Nanosecond // the recheck's time has come
	if ok, err := s.checkKey(ctx, "fry_secret"); ok || err != nil {
		t.Errorf("a revoked key past the recheck: %v %v, want refused", ok, err)
	}
}

// TestAuthorizationScheme: the scheme of an Authorization header is
// case-insensitive (RFC 9110) and may be followed by more than one space
// (RFC 6750); a request that says "bearer <key>" was refused as sending
// no key.
func TestAuthorizationScheme(t *testing.T) {
	s := New(Config{Store: keyedStore(t, "fry_secret")})
	for h, want := range map[string]int{
		"Bearer fry_secret":  http.StatusOK,
		"bearer fry_secret":  http.StatusOK,
		"BEARER fry_secret":  http.StatusOK,
		"Bearer  fry_secret": http.StatusOK,
		"Bearer fry_other":   http.StatusUnauthorized,
		"Basic fry_secret":   http.StatusUnauthorized,
		"Bearerfry_secret":   http.StatusUnauthorized,
		"Bearer ":            http.StatusUnauthorized,
		"fry_secret":         http.StatusUnauthorized,
	} {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/task-types", nil)
		req.Header.Set("Authorization", h)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("Authorization: %q: %d, want %d: %s", h, rec.Code, want, rec.Body)
		}
		if got := rec.Header().Get("WWW-Authenticate"); want == http.StatusUnauthorized && got != `Bearer realm="ferry"` {
			t.Errorf("Authorization: %q: WWW-Authenticate %q, want the Bearer challenge", h, got)
		}
	}
}
