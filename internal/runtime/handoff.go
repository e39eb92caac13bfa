package runtime

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// Direct hand-off: a write that creates claimable tasks (a trigger, a
// timer's wake-up, a completion whose worker did not take them all) leases
// them in the same transaction to claims waiting on this node, the long-polls
// that found nothing to claim. The waiting claim returns them without a
// claim transaction of its own, as a completing worker takes the tasks its
// completion starts (eager dispatch); a new task reaches a waiting worker in
// one commit instead of a commit, a wake-up and a claim.
//
// A waiting claim is reserved by one write at a time and leaves only once
// that write has settled. A task leased to it in a write's attempt that did
// not commit (a request of a batch that failed on its own, a batch retried,
// a trigger whose idempotency key named another run) is not in the
// database: the store reports the lease tokens of the tasks it committed
// created leased (store.Committed.Leased), and only those are handed over.
// The others are put back to pending in memory, in case the same object is
// written again, and the claim, given nothing, claims as usual.

// waiter is a claim waiting on this node.
type waiter struct {
	deadline int64         // when its wait ends (unix ns)
	claim    eagerClaim    // what it asks for; taken: what writes leased to it
	ready    chan struct{} // closed once the write that reserved it settled
	got      []*store.Task // what that write committed, set before ready closes
}

// waiters are the claims waiting on this node and the hand-offs of writes
// not yet settled.
type waiters struct {
	mu   sync.Mutex
	list []*waiter    // waiting and not reserved, oldest first
	n    atomic.Int32 // len(list): writes with nobody to hand to skip the lock
	// last is the latest deadline of the claims in list (unix ns; 0 when
	// none): a lease that ends after it concerns none of them
	// (watchLeases).
	last atomic.Int64
	lent sync.Map     // lease token -> *atomic.Bool (committed) of tasks handed over
	seen atomic.Int32 // entries in lent: commits skip the lookups when zero
}

// WaitingClaims is the number of claims long-polling on this node that a
// write could hand tasks to now.
func (r *Runtime) WaitingClaims() int { return int(r.waiting.n.Load()) }

// wait registers a claim that found nothing and waits until deadline.
func (ws *waiters) wait(req ClaimRequest, deadline time.Time) *waiter {
	w := &waiter{deadline: deadline.UnixNano(), claim: eagerClaim{req: req}, ready: make(chan struct{})}
	ws.mu.Lock()
	ws.list = append(ws.list, w)
	ws.n.Store(int32(len(ws.list)))
	if w.deadline > ws.last.Load() {
		ws.last.Store(w.deadline)
	}
	ws.mu.Unlock()
	return w
}

// leave ends w's wait: the tasks a write handed it, after waiting for that
// write to settle if one reserved it, or nil.
func (ws *waiters) leave(w *waiter) []*store.Task {
	ws.mu.Lock()
	i := slices.Index(ws.list, w)
	if i >= 0 {
		ws.remove(i)
	}
	ws.mu.Unlock()
	if i >= 0 {
		return nil
	}
	<-w.ready // reserved: the write settles within its transaction
	return w.got
}

// remove takes the i-th waiting claim off the list (ws.mu held).
func (ws *waiters) remove(i int) {
	gone := ws.list[i].deadline
	ws.list = slices.Delete(ws.list, i, i+1)
	ws.n.Store(int32(len(ws.list)))
	if gone == ws.last.Load() {
		var last int64
		for _, w := range ws.list {
			last = max(last, w.deadline)
		}
		ws.last.Store(last)
	}
}

// reserve takes the oldest waiting claim whose types match typ.
func (ws *waiters) reserve(typ string) *waiter {
	if ws.n.Load() == 0 {
		return nil
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for i, w := range ws.list {
		if matchesType(w.claim.req.Types, typ) {
			ws.remove(i)
			return w
		}
	}
	return nil
}

// committed records the tasks a commit created leased.
func (ws *waiters) committed(tokens []string) {
	if ws.seen.Load() == 0 {
		return
	}
	for _, tok := range tokens {
		if v, ok := ws.lent.Load(tok); ok {
			v.(*atomic.Bool).Store(true)
		}
	}
}

// offer is one write's hand-offs to waiting claims. Its take runs on the
// write's goroutine; settle once the store call has returned.
type offer struct {
	r    *Runtime
	held []*waiter
}

func (r *Runtime) newOffer() *offer { return &offer{r: r} }

// take leases t to a waiting claim if one matches and has room (the store
// then writes it leased, with its claimed event).
func (of *offer) take(ctx context.Context, t *store.Task, now time.Time) {
	if of == nil || t.Status != status.TaskPending || t.RunAt.After(now) {
		return
	}
	for _, w := range of.held {
		if len(w.claim.taken) < w.claim.req.Max && matchesType(w.claim.req.Types, t.Type) {
			of.lend(ctx, w, t, now)
			return
		}
	}
	if w := of.r.waiting.reserve(t.Type); w != nil {
		of.held = append(of.held, w)
		of.lend(ctx, w, t, now)
	}
}

func (of *offer) lend(ctx context.Context, w *waiter, t *store.Task, now time.Time) {
	n := len(w.claim.taken)
	of.r.take(ctx, &w.claim, t, now)
	if len(w.claim.taken) > n {
		t.ToWaitingClaim = true
		of.r.waiting.lent.Store(t.LeaseToken, new(atomic.Bool))
		of.r.waiting.seen.Add(1)
	}
}

// restart forgets what the write's last decision lent: the store may
// decide a batch of reports or a fire transaction again, and only its
// last decision commits (store.InTasks, store.FireTimers). The reserved
// claims stay reserved, their room free for the decision that follows.
func (of *offer) restart() {
	if of == nil {
		return
	}
	ws := &of.r.waiting
	for _, w := range of.held {
		for _, t := range w.claim.taken {
			if _, ok := ws.lent.LoadAndDelete(t.LeaseToken); ok {
				ws.seen.Add(-1)
			}
		}
		w.claim.taken = w.claim.taken[:0]
	}
}

// settle hands each reserved claim the tasks leased to it that committed
// and puts the others back to pending; err is the store call's. A call
// that failed may still have committed (an error after COMMIT was sent, a
// failed sync): its leases are released, so none waits for its end.
func (of *offer) settle(err error) {
	if of == nil || len(of.held) == 0 {
		return
	}
	ws := &of.r.waiting
	var doubt []*store.Task
	for _, w := range of.held {
		var got []*store.Task
		for _, t := range w.claim.taken {
			v, _ := ws.lent.LoadAndDelete(t.LeaseToken)
			ws.seen.Add(-1)
			if v != nil && v.(*atomic.Bool).Load() {
				got = append(got, t)
				continue
			}
			if err != nil {
				doubt = append(doubt, &store.Task{ID: t.ID, LeaseToken: t.LeaseToken})
			}
			t.Status, t.Attempt, t.LeasedBy, t.LeaseToken, t.LeaseUntil, t.ToWaitingClaim = status.TaskPending, 0, "", "", nil, false
		}
		w.got = got
		close(w.ready)
	}
	of.held = nil
	if len(doubt) > 0 {
		of.r.release(context.Background(), doubt, "the write that handed it to a waiting claim failed")
	}
}
