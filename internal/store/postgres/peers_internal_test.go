package postgres

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// TestLoneNodeNotifiesNoOne: a node that listens and has heard no other
// node of its deployment sends no NOTIFY for its commits. When a second
// node starts, its hello makes the first wake it at once (covering what
// the first committed before it knew), the second answers with a wake-up
// of its own, and from then on the first node's commits wake the second.
// Once the first has heard nothing for peerTTL it is alone again.
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
	commit := func() {
		t.Helper()
		now := time.Now().UTC()
		if _, _, err := a.CreateRun(ctx, &store.NewRun{Run: store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour), StartedAt: now}}, now); err != nil {
			t.Fatal(err)
		}
	}
	listen(t, a)
	waitFor(t, heard, helloPrefix+a.node)

	commit()
	deadline := time.Now().Add(10 * time.Second)
	for a.quiet.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lone node's commit was neither announced nor counted as quiet within 10s")
		}
		time.Sleep(time.Millisecond) // polling a counter, with a deadline
	}

	b := openNode(t, dsn)
	wakeB := listen(t, b)
	got := waitFor(t, heard, b.node) // b's answer, the last of the exchange
	want := []string{helloPrefix + b.node, a.node, b.node}
	if !slices.Equal(got, want) {
		t.Fatalf("notifications after a's hello = %q, want %q (b's hello, a's wake-up, b's): a alone announced nothing", got, want)
	}
	select {
	case <-wakeB:
	case <-time.After(10 * time.Second):
		t.Fatal("a's wake-up did not wake b's runtime")
	}

	commit()
	waitFor(t, heard, a.node)
	select {
	case <-wakeB:
	case <-time.After(10 * time.Second):
		t.Fatal("a's commit did not wake b once a knew of b")
	}

	// Past peerTTL without hearing b (a's clock moved), a is alone again.
	offset.Store(int64(2 * peerTTL))
	quiet := a.quiet.Load()
	commit()
	deadline = time.Now().Add(10 * time.Second)
	for a.quiet.Load() == quiet {
		if time.Now().After(deadline) {
			t.Fatal("a node that has heard no one for peerTTL announced its commit")
		}
		time.Sleep(time.Millisecond) // polling a counter, with a deadline
	}
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

// listen starts s's listener and returns its wake-ups.
func listen(t *testing.T, s *Store) <-chan struct{} {
	ctx, cancel := context.WithCancel(t.Context())
	wake := s.Wakeups(ctx)
	t.Cleanup(func() {
		cancel()
		for range wake {
		}
	})
	return wake
}

// rawListener records the notifications of scope on Ferry's channel, each
// as its node id, prefixed by helloPrefix for a hello; it is LISTENing
// when it returns.
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
			if hello {
				node = helloPrefix + node
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
