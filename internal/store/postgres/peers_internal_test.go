package postgres

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/testwait"
)

// TestLoneNodeNotifiesNoOne: a node that listens and has heard no other
// node of its deployment sends no NOTIFY for its commits. When a second
// node starts, its hello makes the first wake it at once (covering what
// the first committed before it knew), the second answers with a wake-up
// of its own (both wake-ups for everything), and from then on the first
// node's commits tell the second what they made ready.
// A third node starting while the two know each other is answered by
// both, so it is not alone either. Once the first has heard nothing for
// peerTTL it is alone again, and when its own hellos stop coming back
// (its listener may be dead) it notifies every commit again.
func TestLoneNodeNotifiesNoOne(t *testing.T) {
	dsn := pgtest.DSN(t)
	ctx := t.Context()
	a := openNode(t, dsn)
	var offset atomic.Int64 // moves a's clock
	a.now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	heard := rawListener(t, dsn, a.scope)
	if err := a.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	wf, err := a.CreateWorkflow(ctx, &store.Workflow{Name: "peers", Fingerprint: "f", Definition: json.RawMessage(`{}`), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	commit := func(s *Store) {
		t.Helper()
		now := time.Now().UTC()
		if _, _, err := s.CreateRun(ctx, &store.NewRun{Run: store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour), StartedAt: now}}, now); err != nil {
			t.Fatal(err)
		}
	}
	// quietly: s's next commit is counted as not announced.
	quietly := func(s *Store, what string) {
		t.Helper()
		before := s.quiet.Load()
		commit(s)
		poll(t, what, func() bool { return s.quiet.Load() > before })
	}
	selfHeard := func(s *Store) {
		t.Helper()
		before := s.self.Load()
		s.notify(helloPrefix + s.node + ":" + s.scope)
		poll(t, "the node's own hello back", func() bool { return s.self.Load() > before })
	}

	listen(t, a)
	waitFor(t, heard, helloPrefix+a.node)
	poll(t, "a's own hello back", func() bool { return a.self.Load() >= 0 })
	quietly(a, "a's commit, alone, counted as quiet")

	b := openNode(t, dsn)
	toldB := make(chan store.Committed, 10) // what a's commits told b
	b.OnCommit(func(c store.Committed) {
		select {
		case toldB <- c:
		default:
		}
	})
	wakeB, stopB := listen(t, b)
	// Wake-ups for everything from listening nodes say they run (hi/).
	got := waitFor(t, heard, hiPrefix+b.node) // b's answer, the last of the exchange
	want := []string{helloPrefix + b.node, hiPrefix + a.node, hiPrefix + b.node}
	if !slices.Equal(got, want) {
		t.Fatalf("notifications after a's hello = %q, want %q (b's hello, a's wake-up, b's): a alone announced nothing", got, want)
	}
	select {
	case <-wakeB:
	case <-time.After(10 * time.Second):
		t.Fatal("a's wake-up did not wake b's runtime")
	}
	commit(a)
	waitFor(t, heard, a.node+"?")
	select {
	case c := <-toldB:
		// The run's expiry is its one timer.
		if c.TimerDue.IsZero() || c.Tasks || !c.HTTPDue.IsZero() {
			t.Fatalf("a's commit told b %+v, want its run's expiry as the timer due", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a's commit did not reach b once a knew of b")
	}

	// A third node, while a and b know each other: both answer its hello.
	c := openNode(t, dsn)
	_, stopC := listen(t, c)
	got = waitFor(t, heard, hiPrefix+c.node) // c's answer to the first of theirs
	for _, n := range []string{helloPrefix + c.node} {
		if !slices.Contains(got, n) {
			t.Fatalf("notifications after c started = %q, want %q among them", got, n)
		}
	}
	if !slices.Contains(got, hiPrefix+a.node) && !slices.Contains(got, hiPrefix+b.node) {
		t.Fatalf("notifications after c started = %q: neither a nor b answered c's hello", got)
	}
	poll(t, "c to hear c's own hello", func() bool { return c.self.Load() >= 0 })
	quiet := c.quiet.Load()
	commit(c)
	waitFor(t, heard, c.node+"?")
	if c.quiet.Load() != quiet {
		t.Fatal("c's commit was not announced though a and b had answered its hello")
	}

	// b and c stop listening (they would answer a's hellos). Past peerTTL
	// without hearing another node (a's clock moved), a is alone again
	// once its own hello is back.
	stopB()
	stopC()
	// Its own hello back first: a listener gets notifications in commit
	// order, so a has taken in everything b and c sent before they
	// stopped, and none of it (read late on a busy machine) counts as
	// heard on the moved clock.
	selfHeard(a)
	offset.Store(int64(2 * peerTTL))
	selfHeard(a)
	quietly(a, "a's commit, alone again, counted as quiet")

	// Its own hellos stop coming back: a notifies every commit again.
	offset.Add(int64(selfTTL + time.Second))
	quiet = a.quiet.Load()
	commit(a)
	waitFor(t, heard, a.node+"?")
	if a.quiet.Load() != quiet {
		t.Fatal("a node whose own hellos stopped coming back counted a commit as quiet")
	}
}

// poll waits for cond, checking a counter or a time the store keeps.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, 10*time.Second, what, cond)
}

func openNode(t *testing.T, dsn string) *Store {
	t.Helper()
	s, err := Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// listen starts s's listener and returns its wake-ups and what stops it.
func listen(t *testing.T, s *Store) (<-chan struct{}, func()) {
	ctx, cancel := context.WithCancel(t.Context())
	wake := s.Wakeups(ctx)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			for range wake {
			}
		})
	}
	t.Cleanup(stop)
	return wake, stop
}

// rawListener records the notifications of scope on Ferry's channel, each
// as its node id, prefixed by helloPrefix for a hello (and as sent, hiPrefix
// or byePrefix for those) and, except for a hello or a hi whose "?L" says
// its listener is named, followed by "?" when it tells what its commits
// made ready (a wake-up for everything does not); it is LISTENing when it
// returns.
func rawListener(t *testing.T, dsn, scope string) <-chan string {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), "LISTEN "+channel); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan string, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			hello := strings.HasPrefix(n.Payload, helloPrefix)
			node, sc, _ := strings.Cut(strings.TrimPrefix(n.Payload, helloPrefix), ":")
			if sc != scope {
				continue
			}
			id, info, told := strings.Cut(node, "?")
			switch {
			case hello:
				node = helloPrefix + id
			case info == namedMark: // a hi of a named listener
				node = id
			case told:
				node = id + "?"
			}
			out <- node
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	})
	return out
}

// waitFor reads notifications until want arrives and returns them all.
func waitFor(t *testing.T, heard <-chan string, want string) []string {
	t.Helper()
	var got []string
	timeout := time.After(10 * time.Second)
	for {
		select {
		case n := <-heard:
			got = append(got, n)
			if n == want {
				return got
			}
		case <-timeout:
			t.Fatalf("no notification %q within 10s; heard %q", want, got)
		}
	}
}
