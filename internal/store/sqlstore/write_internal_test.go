package sqlstore

import (
	"context"
	"database/sql"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/ferryhq/ferry/internal/testwait"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, 10*time.Second, what, cond)
}

// newTestGroup is a single writer on a fresh SQLite file, without a run
// cache, with sync as its separate sync (nil: none), closed when the test
// ends.
func newTestGroup(t *testing.T, sync func() error) *groupCommit {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "w.db")+"?_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	g := newGroupCommit(db, 128, nil, sync)
	t.Cleanup(func() {
		g.mu.RLock()
		closed := g.closed
		g.mu.RUnlock()
		if !closed { // a test may have closed it
			g.close()
		}
		db.Close()
	})
	return g
}

// TestUrgentWriteCutsTheGroup: an urgent request that arrives while a group
// is being written is applied right after the request in progress, in a
// transaction of its own (so its answer does not wait for the rest of the
// group); the requests it overtook follow, in their order.
func TestUrgentWriteCutsTheGroup(t *testing.T) {
	g := newTestGroup(t, nil)

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
	g := newTestGroup(t, nil)

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

// TestUrgentWritesDoNotStarveOthers: while the urgent queue never runs
// dry (a backlog of timers), an ordinary request is still written: groups
// of urgent requests do not run twice in a row while ordinary ones wait.
func TestUrgentWritesDoNotStarveOthers(t *testing.T) {
	g := newTestGroup(t, nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // keeps urgent requests queued, each a millisecond of work
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if len(g.urgent) >= 8 {
				runtime.Gosched()
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = g.do(context.Background(), func(context.Context, *sql.Tx) error {
					time.Sleep(time.Millisecond) // the work of a fire transaction, not a synchronisation
					return nil
				}, true)
			}()
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()
	waitFor(t, "urgent backlog", func() bool { return len(g.urgent) >= 8 })
	done := make(chan error, 1)
	go func() { done <- g.do(context.Background(), func(context.Context, *sql.Tx) error { return nil }, false) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ordinary request: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an ordinary request was not written within 10s of an urgent backlog")
	}
}

// TestCloseAnswersCarriedRequests: requests cut from a group for urgent
// ones and not yet written when the store closes are answered "store
// closed", and never applied.
func TestCloseAnswersCarriedRequests(t *testing.T) {
	g := newTestGroup(t, nil)
	names := []string{"blocker", "a", "b1", "b2", "u"}
	held := map[string]bool{"blocker": true, "a": true, "u": true}
	hold, in, errs := map[string]chan struct{}{}, map[string]chan struct{}{}, map[string]chan error{}
	for _, n := range names {
		hold[n], in[n], errs[n] = make(chan struct{}), make(chan struct{}), make(chan error, 1)
	}
	var mu sync.Mutex
	applied := map[string]bool{}
	submit := func(name string, urgent bool) {
		go func() {
			errs[name] <- g.do(context.Background(), func(context.Context, *sql.Tx) error {
				mu.Lock()
				applied[name] = true
				mu.Unlock()
				if held[name] {
					close(in[name])
					<-hold[name]
				}
				return nil
			}, urgent)
		}()
	}
	// The blocker holds the writer while a, b1 and b2 queue up: they are
	// the next group. a holds it while u arrives and cuts the group, so
	// b1 and b2 are carried; the store closes while u is being written.
	submit("blocker", false)
	<-in["blocker"]
	for i, name := range []string{"a", "b1", "b2"} {
		submit(name, false)
		waitFor(t, name+" queued", func() bool { return len(g.reqs) == i+1 })
	}
	close(hold["blocker"])
	<-in["a"]
	submit("u", true)
	waitFor(t, "u queued", func() bool { return len(g.urgent) == 1 })
	close(hold["a"])
	<-in["u"]
	closed := make(chan struct{})
	go func() { g.close(); close(closed) }()
	waitFor(t, "close begun", func() bool {
		select {
		case <-g.stop:
			return true
		default:
			return false
		}
	})
	close(hold["u"])
	<-closed
	for _, name := range []string{"blocker", "a", "u"} {
		if err := <-errs[name]; err != nil {
			t.Errorf("%s: %v, want written", name, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"b1", "b2"} {
		if err := <-errs[name]; err == nil || err.Error() != "store closed" {
			t.Errorf("carried %s answered %v, want store closed", name, err)
		}
		if applied[name] {
			t.Errorf("carried %s was applied after close", name)
		}
	}
}

// TestUrgentAnswerWaitsForItsSync: with a separate sync (SQLite's
// default), an urgent request is answered only once a sync after its own
// commit has run.
func TestUrgentAnswerWaitsForItsSync(t *testing.T) {
	var syncs atomic.Int64
	gate := make(chan struct{})
	g := newTestGroup(t, func() error {
		<-gate
		syncs.Add(1)
		return nil
	})
	done := make(chan error, 1)
	go func() {
		done <- g.do(context.Background(), func(context.Context, *sql.Tx) error { return nil }, true)
	}()
	select {
	case <-done:
		t.Fatal("answered before its sync ran")
	case <-time.After(50 * time.Millisecond): // negative check: give it a chance to go wrong
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if syncs.Load() == 0 {
		t.Fatal("answered without a sync")
	}
}
