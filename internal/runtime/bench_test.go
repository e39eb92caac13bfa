package runtime_test

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/store/sqlite"
)

// benchStores runs fn on a fresh SQLite file and a fresh Postgres schema.
func benchStores(b *testing.B, fn func(b *testing.B, rt *runtime.Runtime)) {
	open := map[string]func(b *testing.B) store.Store{
		"sqlite": func(b *testing.B) store.Store {
			s, err := sqlite.Open(filepath.Join(b.TempDir(), "bench.db"))
			if err != nil {
				b.Fatal(err)
			}
			return s
		},
		"postgres": func(b *testing.B) store.Store {
			s, err := postgres.Open(b.Context(), pgtest.DSN(b))
			if err != nil {
				b.Fatal(err)
			}
			return s
		},
	}
	for _, name := range []string{"sqlite", "postgres"} {
		b.Run(name, func(b *testing.B) {
			s := open[name](b)
			b.Cleanup(func() { s.Close() })
			if err := s.Migrate(b.Context()); err != nil {
				b.Fatal(err)
			}
			rt := runtime.New(runtime.Config{Store: s, Clock: clock.Real{}, HTTP: httpstep.New(nil), Logger: slog.New(slog.DiscardHandler), PublicURL: "http://ferry.test"})
			fn(b, rt)
		})
	}
}

// BenchmarkClaim measures claiming one ready task (one statement plus its
// event, one commit).
func BenchmarkClaim(b *testing.B) {
	benchStores(b, func(b *testing.B, rt *runtime.Runtime) {
		for i := 0; i < b.N; i++ {
			if _, _, err := rt.CreateTask(b.Context(), runtime.NewTask{Type: "bench.noop.v1"}); err != nil {
				b.Fatal(err)
			}
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			got, err := rt.ClaimTasks(b.Context(), runtime.ClaimRequest{Types: []string{"bench.%"}, WorkerID: "b", Lease: time.Minute, Max: 1})
			if err != nil || len(got) != 1 {
				b.Fatalf("claim: %v (%d)", err, len(got))
			}
		}
	})
}

// BenchmarkComplete measures recording a claimed task's result.
func BenchmarkComplete(b *testing.B) {
	benchStores(b, func(b *testing.B, rt *runtime.Runtime) {
		var claimed []*store.Task
		for i := 0; i < b.N; i++ {
			if _, _, err := rt.CreateTask(b.Context(), runtime.NewTask{Type: "bench.noop.v1"}); err != nil {
				b.Fatal(err)
			}
		}
		for len(claimed) < b.N {
			got, err := rt.ClaimTasks(b.Context(), runtime.ClaimRequest{Types: []string{"bench.%"}, WorkerID: "b", Lease: time.Hour, Max: 100})
			if err != nil {
				b.Fatal(err)
			}
			claimed = append(claimed, got...)
		}
		b.ResetTimer()
		for _, t := range claimed {
			if _, err := rt.CompleteTask(b.Context(), t.ID, t.LeaseToken, []byte(`{"ok":true}`)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
