package sqlite

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/store"
)

// gateSync is a WAL syncer the test holds and releases.
type gateSync struct {
	entered chan struct{}
	release chan error
	calls   atomic.Int32
}

func (g *gateSync) sync() error {
	g.calls.Add(1)
	g.entered <- struct{}{}
	return <-g.release
}

func (g *gateSync) close() error { return nil }

func openGated(t *testing.T) (store.Store, *gateSync) {
	t.Helper()
	g := &gateSync{entered: make(chan struct{}), release: make(chan error)}
	s, err := open(filepath.Join(t.TempDir(), "s.db"), g)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, g
}

// async runs fn and delivers its error.
func async(fn func() error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	return done
}

// createTask creates a task (with key, when not empty) in the background.
func createTask(t *testing.T, s store.Store, key string) <-chan error {
	return async(func() error {
		_, _, err := s.CreateTask(t.Context(), &store.Task{Type: "x.y.v1", IdempotencyKey: key, Payload: json.RawMessage(`{}`), RunAt: time.Now()}, time.Now())
		return err
	})
}

// notYet fails the test if done has already answered.
func notYet(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s answered (err %v) before the WAL sync", what, err)
	default:
	}
}

// TestAnswersWaitForTheWALSync: a write is answered only after the WAL was
// synced following its commit, and a failed sync fails it.
func TestAnswersWaitForTheWALSync(t *testing.T) {
	s, g := openGated(t)
	done := createTask(t, s, "")
	<-g.entered // committed; the sync has begun
	notYet(t, done, "the write")
	g.release <- nil
	if err := <-done; err != nil {
		t.Fatalf("CreateTask: %v", err)
	}

	boom := errors.New("disk gone")
	done = createTask(t, s, "")
	<-g.entered
	g.release <- boom
	if err := <-done; !errors.Is(err, boom) {
		t.Fatalf("err = %v after a failed sync, want it to wrap %v", err, boom)
	}
}

// TestDefaultSyncsTheWAL: the default (synchronous=full) syncs the
// database's WAL file; synchronous=normal syncs nothing.
func TestDefaultSyncsTheWAL(t *testing.T) {
	for _, c := range []struct {
		opts string
		want bool
	}{{"", true}, {"?synchronous=full", true}, {"?synchronous=FULL", true}, {"?synchronous=normal", false}} {
		path, sync, err := parseOptions("/data/f.db" + c.opts)
		if err != nil {
			t.Fatal(err)
		}
		sy := syncerFor(path, sync)
		if got := sy != nil; got != c.want {
			t.Errorf("%q: syncs = %v, want %v", c.opts, got, c.want)
		}
		if w, ok := sy.(*walFile); ok && w.path != "/data/f.db-wal" {
			t.Errorf("%q: syncs %s, want the WAL /data/f.db-wal", c.opts, w.path)
		}
	}
	// The WAL it names is the one SQLite writes, and it can be synced.
	path := filepath.Join(t.TempDir(), "w.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	w := syncerFor(path, "FULL")
	defer w.close()
	if err := w.sync(); err != nil {
		t.Errorf("sync the WAL of a live database: %v", err)
	}
	if err := syncerFor(filepath.Join(t.TempDir(), "none.db"), "").sync(); err == nil {
		t.Error("syncing a WAL that does not exist succeeded")
	}
}

// TestFoundByKeyWaitsForTheSync: a retried create that finds the first
// one by its idempotency key is answered only once that one is on disk.
func TestFoundByKeyWaitsForTheSync(t *testing.T) {
	s, g := openGated(t)
	first := createTask(t, s, "k")
	<-g.entered // the first is committed, not yet synced
	second := createTask(t, s, "k")
	g.release <- nil
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// The second found the first by its key: it must still be answered
	// only after a sync that began after it looked.
	select {
	case err := <-second:
		t.Fatalf("the retry was answered (err %v) without a sync of its own", err)
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the retry neither answered nor synced")
	}
	g.release <- nil
	if err := <-second; err != nil {
		t.Fatal(err)
	}
}

// TestDirectWritesAreSynced: writes that do not go through the group
// writer (workflows, API keys, task types) are synced before they return.
func TestDirectWritesAreSynced(t *testing.T) {
	s, g := openGated(t)
	done := async(func() error {
		_, err := s.CreateWorkflow(t.Context(), &store.Workflow{Name: "w", Definition: json.RawMessage(`{}`), Fingerprint: "f", Enabled: true})
		return err
	})
	<-g.entered
	notYet(t, done, "CreateWorkflow")
	g.release <- nil
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestFailedSyncStopsWrites: after a failed sync nothing is known to be on
// disk, so every later write fails without being attempted.
func TestFailedSyncStopsWrites(t *testing.T) {
	s, g := openGated(t)
	boom := errors.New("disk gone")
	ws := s.(interface{ WriteError() error }) // what /healthz asks
	if err := ws.WriteError(); err != nil {
		t.Fatalf("WriteError before any sync failed: %v", err)
	}
	done := createTask(t, s, "")
	<-g.entered
	g.release <- boom
	if err := <-done; !errors.Is(err, boom) {
		t.Fatalf("err = %v, want it to wrap %v", err, boom)
	}
	// What /healthz answers 503 with (the reads still work).
	if err := ws.WriteError(); !errors.Is(err, boom) {
		t.Errorf("WriteError after the failed sync: %v, want it to wrap %v", err, boom)
	}
	calls := g.calls.Load()
	if _, _, err := s.CreateTask(t.Context(), &store.Task{Type: "x.y.v1", Payload: json.RawMessage(`{}`), RunAt: time.Now()}, time.Now()); !errors.Is(err, boom) {
		t.Errorf("a write after the failed sync: err %v, want it to wrap %v", err, boom)
	}
	if g.calls.Load() != calls {
		t.Error("a write after the failed sync was attempted")
	}
}

// TestWALFileFollowsARecreatedLog: SQLite deletes the WAL when its last
// connection closes; a later sync must sync the new file, not the old.
func TestWALFileFollowsARecreatedLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db-wal")
	if err := os.WriteFile(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	w := &walFile{path: path}
	defer w.close()
	if err := w.sync(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := w.sync(); err != nil {
		t.Fatal(err)
	}
	held, err := w.f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	cur, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(held, cur) {
		t.Error("sync kept the deleted log's descriptor")
	}
}
