package ferrytest

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/ferryhq/ferry"
)

// Key is the admin API key every test server accepts.
const Key = "fry_test_key"

// Server is a running engine and its HTTP front.
type Server struct {
	URL    string
	Key    string
	Engine *ferry.Engine
}

// Start runs an engine on a fresh SQLite file (unless an option sets another
// database) with loopback egress allowed and logs discarded. Options adjust
// the configuration before it is opened. Everything stops at test cleanup.
func Start(t testing.TB, opts ...func(*ferry.Config)) *Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	cfg := ferry.Config{
		Database:    "sqlite:" + filepath.Join(t.TempDir(), "ferry.db"),
		Migrate:     true,
		EgressAllow: "127.0.0.0/8",
		PublicURL:   "http://" + srv.Listener.Addr().String(),
		Logger:      slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	eng, err := ferry.Open(ctx, cfg)
	if err != nil {
		cancel()
		srv.Listener.Close()
		t.Fatal(err)
	}
	srv.Config.Handler = eng.Handler()
	srv.Start()
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx) }()
	t.Cleanup(func() {
		srv.Close()
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("engine run: %v", err)
		}
		// SQLite keeps the runs it wrote last in memory: they must be
		// what the tables hold after everything the test did.
		if v, ok := eng.Store().(interface{ VerifyRunCache(context.Context) error }); ok {
			if err := v.VerifyRunCache(context.Background()); err != nil {
				t.Errorf("run cache differs from the tables: %v", err)
			}
		}
		if err := eng.Close(); err != nil {
			t.Errorf("engine close: %v", err)
		}
	})
	if _, err := eng.EnsureAPIKey(ctx, Key); err != nil {
		t.Fatal(err)
	}
	return &Server{URL: srv.URL, Key: Key, Engine: eng}
}
