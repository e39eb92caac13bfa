package api

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/store/sqlite"
)

// TestRevokedKeyStopsWorking: a key whose row is deleted (how a key is
// revoked) stops being accepted once its verification is older than the
// recheck, without a restart. (Found by an audit: verified keys were
// kept for the process's life.)
func TestRevokedKeyStopsWorking(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "k.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.AddAPIKey(ctx, "t", HashKey("fry_secret")); err != nil {
		t.Fatal(err)
	}
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
