package sqlstore

import (
	"context"
	"database/sql"
	"path/filepath"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// newTestGroup is a single writer on a fresh SQLite file, without a run
// cache or a separate sync, closed when the test ends.
func newTestGroup(t *testing.T) *groupCommit {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "w.db")+"?_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	g := newGroupCommit(db, 128, nil, nil)
	t.Cleanup(func() {
		g.close()
		db.Close()
	})
	return g
}

// TestUrgentWriteCutsTheGroup: an urgent request that arrives while a group
// is being written is applied right after the request in progress, in a
// transaction of its own (so its answer does not wait for the rest of the
// group); the requests it overtook follow, in their order.
func TestUrgentWriteCutsTheGroup(t *testing.T) {
	g := newTestGroup(t)

	var mu sync.Mutex
	var order []string
	txOf := map[string]*sql.Tx{}
	release := map[string]chan struct{}{"x": make(chan struct{}), "a": make(chan struct{})}
	started := map[string]chan struct{}{"x": make(chan struct{}), "a": make(chan struct{})}
	req := func(name string) func(context.Context, *sql.Tx) error {
		return func(_ context.Context, tx *sql.Tx) error {
			mu.Lock()
			order = append(order, name)
			txOf[name] = tx
			mu.Unlock()
			if ch := release[name]; ch != nil {
				close(started[name])
				<-ch
			}
			return nil
		}
	}
	var wg sync.WaitGroup
	submit := func(name string, urgent bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.do(context.Background(), req(name), urgent); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}()
	}
	// x holds the writer while a, b1, b2 and b3 queue up; they become the
	// next group, in which a holds the writer while u arrives.
	submit("x", false)
	<-started["x"]
	for i, name := range []string{"a", "b1", "b2", "b3"} {
		submit(name, false)
		waitFor(t, name+" queued", func() bool { return len(g.reqs) == i+1 })
	}
	close(release["x"])
	<-started["a"]
	submit("u", true)
	waitFor(t, "u queued", func() bool { return len(g.urgent) == 1 })
	close(release["a"])
	wg.Wait()

	want := []string{"x", "a", "u", "b1", "b2", "b3"}
	if len(order) != len(want) {
		t.Fatalf("applied %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("applied %v, want %v", order, want)
		}
	}
	if txOf["a"] == txOf["u"] || txOf["u"] == txOf["b1"] {
		t.Error("the urgent request shared a transaction with the group it cut")
	}
	if txOf["b1"] != txOf["b3"] {
		t.Error("the requests overtaken were not written together after the urgent one")
	}
}

// TestUrgentWritesGoFirst: urgent requests queued together with ordinary
// ones make the next group, ahead of the ordinary ones.
func TestUrgentWritesGoFirst(t *testing.T) {
	g := newTestGroup(t)

	var mu sync.Mutex
	var order []string
	hold, held := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	submit := func(name string, urgent bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := g.do(context.Background(), func(context.Context, *sql.Tx) error {
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				if name == "hold" {
					close(held)
					<-hold
				}
				return nil
			}, urgent)
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}()
	}
	submit("hold", false)
	<-held
	submit("o1", false)
	waitFor(t, "o1 queued", func() bool { return len(g.reqs) == 1 })
	submit("o2", false)
	waitFor(t, "o2 queued", func() bool { return len(g.reqs) == 2 })
	submit("u1", true)
	waitFor(t, "u1 queued", func() bool { return len(g.urgent) == 1 })
	submit("u2", true)
	waitFor(t, "u2 queued", func() bool { return len(g.urgent) == 2 })
	close(hold)
	wg.Wait()
	want := []string{"hold", "u1", "u2", "o1", "o2"}
	for i := range want {
		if i >= len(order) || order[i] != want[i] {
			t.Fatalf("applied %v, want %v", order, want)
		}
	}
}
