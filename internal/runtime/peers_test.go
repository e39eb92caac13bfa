package runtime_test

import (
	"context"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/testwait"
)

// twoPeers opens two servers on one fresh Postgres schema, closed when
// the test ends; bs is the second's store.
func twoPeers(t *testing.T) (a, b *env, bs *postgres.Store) {
	t.Helper()
	dsn := pgtest.DSN(t)
	open := func() *postgres.Store {
		s, err := postgres.Open(t.Context(), dsn)
		if err != nil {
			t.Fatalf("postgres.Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a = newEnv(t, open())
	bs = open()
	return a, newEnv(t, bs), bs
}

// TestPeerTaskWakesWaitingClaim: on Postgres, a task created through one
// server reaches a claim waiting on another at once: the first server's
// notification says tasks of that type became claimable, the second tells
// its own commit hook, and the hook wakes its waiting claims. The waiting
// server's clock is fake, so its claim wakes for nothing else; and its
// listener's wake-ups for everything (what Run would answer by waking every
// claim) must not come, so only the told path can wake it.
func TestPeerTaskWakesWaitingClaim(t *testing.T) {
	a, b, bs := twoPeers(t)
	ctx, cancel := context.WithCancel(t.Context())
	everything := bs.Wakeups(ctx) // b's listener, without Run
	t.Cleanup(func() {
		cancel()
		for range everything {
		}
	})
	// b's listener is up once its hello has gone out on it: a NOTIFY
	// reaches only sessions already listening.
	testwait.Until(t, 15*time.Second, "the second server's listener", bs.Listening)

	const wait = 57 * time.Second
	type result struct {
		tasks []*store.Task
		err   error
	}
	claimed := make(chan result, 1)
	go func() {
		got, err := b.rt.ClaimTasks(t.Context(), runtime.ClaimRequest{Types: []string{"peer.%"}, WorkerID: "w", Lease: time.Minute, Max: 1, Wait: wait})
		claimed <- result{got, err}
	}()
	select {
	case d := <-b.clk.timers: // the claim waits
		if d != wait {
			t.Fatalf("the claim waits %v, want %v", d, wait)
		}
	case r := <-claimed:
		t.Fatalf("the claim returned before waiting: %d tasks, %v", len(r.tasks), r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the claim did not wait within 10s")
	}
	k := a.create(t, runtime.NewTask{Type: "peer.new.v1"})
	select {
	case r := <-claimed:
		if r.err != nil || len(r.tasks) != 1 || r.tasks[0].ID != k.ID {
			t.Fatalf("the waiting claim got %d tasks, %v; want the other server's task %s", len(r.tasks), r.err, k.ID)
		}
	case <-everything:
		t.Fatal("the other server's task woke this one for everything, not through what its notification said")
	case <-time.After(10 * time.Second):
		t.Fatal("a claim waiting on one server was not woken within 10s by a task created through another")
	}
}

// TestPeerDisabledTypeStopsHandOversAtOnce: a task type disabled through
// one server stops being handed to completing workers on another as soon
// as the first server's notification reaches it, not when the second's
// cached registry entry runs out: the servers' clocks are fake, so that
// entry never would. (The second went on handing the type's tasks out for
// up to a second.)
func TestPeerDisabledTypeStopsHandOversAtOnce(t *testing.T) {
	a, b, bs := twoPeers(t)
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- b.rt.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })
	testwait.Until(t, 15*time.Second, "the second server's listener", bs.Listening)

	b.workflow(t, `{"name": "peer-eager", "tasks": {
		"a": {"task": {"type": "peer.first.v1"}},
		"b": {"needs": ["a"], "task": {"type": "peer.off.v1"}}}}`)
	next := runtime.ClaimRequest{Types: []string{"peer.%"}, WorkerID: "w", Lease: time.Minute, Max: 1}
	// handOver completes a fresh run's first step on b and returns what
	// b handed over with it.
	handOver := func() []*store.Task {
		t.Helper()
		b.trigger(t, "peer-eager", `{}`)
		k := b.claimOne(t, "peer.first.v1")
		_, got, err := b.rt.CompleteTaskAndClaim(t.Context(), k.ID, k.LeaseToken, nil, next)
		must(t, err, "CompleteTaskAndClaim")
		return got
	}
	if got := handOver(); len(got) != 1 || got[0].Type != "peer.off.v1" {
		t.Fatalf("before the type is disabled, b handed over %d tasks, want its b step", len(got))
	}
	// As PUT /api/v1/task-types/{type} does, on a.
	if _, err := a.st.PutTaskType(t.Context(), &store.TaskType{Type: "peer.off.v1", Enabled: false}); err != nil {
		t.Fatal(err)
	}
	a.rt.TaskTypesChanged()
	// The notification takes a moment to arrive; until then b may hand
	// the type out, from then on it must not.
	testwait.Until(t, 15*time.Second, "b to stop handing over a type disabled on a", func() bool { return len(handOver()) == 0 })
}
