package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

// TestTimerShares: two nodes that hear each other read disjoint shares of
// the due timers, together all of them; a timer overdue by the grace is
// read by both (its node may have stopped); a node alone reads them all.
func TestTimerShares(t *testing.T) {
	dsn := pgtest.DSN(t)
	a, wf := withWorkflow(t, dsn, "share")
	b := openNode(t, dsn)
	now := time.Now().UTC().Truncate(time.Microsecond)
	var due, overdue []string
	for i := range 40 {
		at := now
		if i >= 30 {
			at = now.Add(-2 * sqlstore.TimerShareGrace)
		}
		r := napRun(t, a, wf, status.StepSleeping, at, now.Add(time.Hour), now)
		if i >= 30 {
			overdue = append(overdue, r.ID)
		} else {
			due = append(due, r.ID)
		}
	}
	read := func(s *Store) []string {
		t.Helper()
		items, err := s.DueTimers(t.Context(), now, now, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var runs []string
		for _, it := range items {
			runs = append(runs, it.RunID)
		}
		slices.Sort(runs)
		return runs
	}
	all := slices.Sorted(slices.Values(append(slices.Clone(due), overdue...)))
	if got := read(a); !slices.Equal(got, all) {
		t.Fatalf("a node that heard no other read %d of the %d due timers", len(got), len(all))
	}

	hearEachOther(t, a, b)
	ia, _ := a.timerShare()
	ib, _ := b.timerShare()
	if ia == ib {
		t.Fatalf("both nodes took share %d", ia)
	}
	ra, rb := read(a), read(b)
	// When the next timer is: a node's own at its due time, the other's
	// once the grace has passed.
	next := func(s *Store, after time.Time) time.Time {
		t.Helper()
		at, ok, err := s.NextDue(t.Context(), after, store.TimerKinds...)
		if err != nil || !ok {
			t.Fatalf("NextDue: %v %v", at, err)
		}
		return at
	}
	later := now.Add(90 * time.Minute) // past the other runs' expiry
	r := napRun(t, a, wf, status.StepSleeping, later, now.Add(3*time.Hour), now)
	owner, other := a, b
	if items, _ := b.DueTimers(t.Context(), later, later, 1000); slices.ContainsFunc(items, func(it *store.QueueItem) bool { return it.RunID == r.ID }) {
		owner, other = b, a
	}
	after := now.Add(61 * time.Minute)
	if got := next(owner, after); !got.Equal(later) {
		t.Errorf("the owner's next timer: %v, want %v", got, later)
	}
	if got := next(other, after); !got.Equal(later.Add(sqlstore.TimerShareGrace)) {
		t.Errorf("the other node's next timer: %v, want %v (the grace after)", got, later.Add(sqlstore.TimerShareGrace))
	}
	for _, id := range overdue {
		if !slices.Contains(ra, id) || !slices.Contains(rb, id) {
			t.Errorf("overdue timer of run %s: read by a %v, by b %v; want both", id, slices.Contains(ra, id), slices.Contains(rb, id))
		}
	}
	var mine [2]int
	for _, id := range due {
		inA, inB := slices.Contains(ra, id), slices.Contains(rb, id)
		if inA == inB {
			t.Errorf("timer of run %s due now: read by a %v, by b %v; want exactly one", id, inA, inB)
		}
		if inA {
			mine[0]++
		} else {
			mine[1]++
		}
	}
	if mine[0] == 0 || mine[1] == 0 {
		t.Errorf("shares of the 30 timers due now: %v; want both nodes to have some", mine)
	}
}

// TestOptimisticBatchRereadsRunWrittenElsewhere: a report decided on a
// cached run that another node has since moved on (it started the step
// the report finishes, as a node firing the run's timer does), which on
// the stale copy would leave the run unwritten, is decided once more on
// the run read afresh and written in one go, not the locking way.
func TestOptimisticBatchRereadsRunWrittenElsewhere(t *testing.T) {
	dsn := pgtest.DSN(t)
	a, run, ks, now := twoTaskRunWith(t, oneWriter(t, dsn), status.StepPending)
	b := openNode(t, dsn)
	ctx := t.Context()
	var calls int
	if err := succeed(t, a, run, ks["a"], now, &calls); err != nil { // a caches the run
		t.Fatal(err)
	}
	// Alone, a store does not suspect its cached runs: a hears b first.
	hearEachOther(t, a, b)
	setStep(t, b, run.ID, "b", status.StepRunning, now)
	before := counts(a)
	rereads := a.OptimisticRereads()
	calls = 0
	// The report finishes step b only if it is running; otherwise it
	// records the task alone, which leaves the run it read unwritten.
	errs, err := a.InTasks(ctx, []string{ks["b"].ID}, map[string]string{ks["b"].ID: run.ID}, now, func(_ int, tx store.TaskTx) error {
		calls++
		if tx.Run().Step("b").Status != status.StepRunning {
			k := tx.Task()
			k.Status = status.TaskSucceeded
			return tx.UpdateTask(k)
		}
		return succeedStep(tx)
	})
	if err == nil {
		err = errs[0]
	}
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Errorf("the report was decided %d times, want twice (cached, then read afresh)", calls)
	}
	if got := counts(a); got.written != before.written+1 || got.redecided != before.redecided || got.stale != before.stale {
		t.Errorf("optimistic batches %+v after %+v, want one more written, none the locking way", got, before)
	}
	if got := a.OptimisticRereads(); got != rereads+1 {
		t.Errorf("rereads %d, want %d", got, rereads+1)
	}
	wantSteps(t, a, run.ID, map[string]string{"a": status.StepSuccess, "b": status.StepSuccess})
}

// TestTimerShareCountsRunningNodes: only nodes that listen (they run their
// timer loop) count in the share, heard by their hellos; a store that
// only writes and notifies its commits owns no share, and a node that
// closes leaves the others' share at once.
func TestTimerShareCountsRunningNodes(t *testing.T) {
	dsn := pgtest.DSN(t)
	a, wf := withWorkflow(t, dsn, "members")
	writer := openNode(t, dsn) // never listens
	listen(t, a)
	// a listens (its own hello came back) before the writer commits, so
	// it hears the writer's notifications.
	poll(t, "a's own hello back", func() bool { return a.self.Load() >= 0 })
	now := time.Now().UTC().Truncate(time.Microsecond)
	for range 3 {
		if _, _, err := writer.CreateRun(t.Context(), &store.NewRun{
			Run:   store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: now.Add(time.Hour), StartedAt: now},
			Queue: []store.QueueItem{{Kind: store.KindWake, Step: "nap", DueAt: now}},
		}, now); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, "a hears the writer's commits", func() bool { return a.heard.Load() > math.MinInt64/2 })
	if _, of := a.timerShare(); of != 1 {
		t.Fatalf("a counts %d nodes with a writer that never listens, want 1", of)
	}
	b := openNode(t, dsn)
	listen(t, b)
	poll(t, "a counts b", func() bool { _, of := a.timerShare(); return of == 2 })
	poll(t, "b said hello", b.helloed.Load)
	// a's timer loop is woken when b leaves: part of b's share, held back
	// at a's last read, is a's now. (Waited for before a reads its share,
	// which would wake the loop itself on finding it changed.)
	woken := timerWakes(a)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	waitWoken(t, woken, "b's goodbye wakes a's timer loop")
	if _, of := a.timerShare(); of != 1 {
		t.Errorf("a counts %d nodes after b's goodbye, want 1", of)
	}
}

// timerWakes records the wake-ups of s's timer loop (its commit hook told
// of a timer due).
func timerWakes(s *Store) <-chan struct{} {
	woken := make(chan struct{}, 100)
	s.OnCommit(func(c store.Committed) {
		if !c.TimerDue.IsZero() {
			woken <- struct{}{}
		}
	})
	return woken
}

// waitWoken waits for a wake-up on woken.
func waitWoken(t *testing.T, woken <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting: %s", what)
	}
}

// TestFireRereadsRunWrittenElsewhere: a fire transaction decided on a
// cached run that another node has since changed, which on the stale
// copy fails, is decided once more on the run read afresh: the caller is
// told to drop the first decision (fn(nil, nil)) before it, and the
// second is written in one go, not the locking way.
func TestFireRereadsRunWrittenElsewhere(t *testing.T) {
	dsn := pgtest.DSN(t)
	a, wf := withWorkflow(t, dsn, "fire-reread")
	b := openNode(t, dsn)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	run := napRun(t, a, wf, status.StepPending, now, now.Add(time.Hour), now)
	// a writes the run, and so caches it as it is.
	if err := a.InRun(ctx, run.ID, now, func(tx store.RunTx) error {
		return tx.Append(store.NewEvent{Type: "noted"})
	}); err != nil {
		t.Fatal(err)
	}
	hearEachOther(t, a, b)
	setStep(t, b, run.ID, "nap", status.StepSleeping, now)
	// Read as the run's owner would (overdue, so either node reads it).
	read, err := a.DueTimers(ctx, now.Add(time.Second), now.Add(time.Second), 10)
	if err != nil || len(read) != 1 {
		t.Fatalf("due timers: %v (%d items)", err, len(read))
	}
	before, rereads := counts(a), a.OptimisticRereads()
	var calls []string
	taken, errs, err := a.FireTimers(ctx, []string{run.ID}, read, now.Add(time.Second), time.Minute, func(it *store.QueueItem, tx store.RunTx) error {
		if it == nil {
			calls = append(calls, "drop")
			return nil
		}
		st := tx.Step("nap")
		if st.Status != status.StepSleeping {
			calls = append(calls, "stale")
			return errors.New("the step is not sleeping")
		}
		calls = append(calls, "fire")
		st.Status = status.StepSuccess
		return tx.UpdateStep(st)
	})
	if err != nil || len(errs) != 0 || taken != 1 {
		t.Fatalf("FireTimers: taken %d, errs %v, err %v", taken, errs, err)
	}
	if want := []string{"stale", "drop", "fire"}; !slices.Equal(calls, want) {
		t.Errorf("fn calls %q, want %q: the first decision dropped before the second", calls, want)
	}
	if got := counts(a); got.written != before.written+1 || got.redecided != before.redecided || got.stale != before.stale {
		t.Errorf("optimistic batches %+v after %+v, want one more written, none the locking way", got, before)
	}
	if got := a.OptimisticRereads(); got != rereads+1 {
		t.Errorf("rereads %d, want %d", got, rereads+1)
	}
	wantSteps(t, a, run.ID, map[string]string{"nap": status.StepSuccess})
	if left, err := a.DueTimers(ctx, now.Add(time.Second), now.Add(time.Second), 10); err != nil || len(left) != 0 {
		t.Errorf("due timers after the fire: %d (%v), want none", len(left), err)
	}
}

// hearEachOther starts both nodes' listeners and waits until each counts
// the other in its timer share.
func hearEachOther(t *testing.T, a, b *Store) {
	t.Helper()
	listen(t, a)
	listen(t, b)
	poll(t, "each node counts the other in its share", func() bool {
		_, ofA := a.timerShare()
		_, ofB := b.timerShare()
		return ofA == 2 && ofB == 2
	})
}

// setStep sets a step's status through s, as another node's write.
func setStep(t *testing.T, s *Store, runID, step, to string, now time.Time) {
	t.Helper()
	if err := s.InRun(t.Context(), runID, now, func(tx store.RunTx) error {
		st := tx.Step(step)
		st.Status = to
		return tx.UpdateStep(st)
	}); err != nil {
		t.Fatal(err)
	}
}

// TestTimerShareDropsGoneNode: a node whose process ended without a
// goodbye (its connections closed with it) leaves the others' timer share
// at their next check of its listener, not after peerTTL, and that wakes
// their timer loops; a node whose listener is still connected stays, and
// so does one whose hello did not say its listener is named (a version
// before named listeners), which leaves after peerTTL.
func TestTimerShareDropsGoneNode(t *testing.T) {
	dsn := pgtest.DSN(t)
	a := openNode(t, dsn)
	listen(t, a)
	poll(t, "a's own hello back", func() bool { return a.self.Load() >= 0 })
	// The other node is a bare connection named as a node's listener is
	// (with the URL's own name after it), which says hello as one does.
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = listenerName("OTHER", "billing app")
	other, err := pgx.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.WithoutCancel(t.Context()))
	// NAMELESS says hello as nodes before named listeners did.
	for _, id := range []string{"OTHER?" + namedMark, "NAMELESS"} {
		if _, err := other.Exec(t.Context(), helloSQL, channel, id+":"+a.scope); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, "a counts both other nodes", func() bool { _, of := a.timerShare(); return of == 3 })
	if err := a.dropGonePeers(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, of := a.timerShare(); of != 3 {
		t.Fatalf("a counts %d nodes after checking a node whose listener is connected and one whose listener is not named, want 3", of)
	}
	woken := timerWakes(a)
	if err := other.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	// a's own check, every peerCheckEvery, finds the listener gone.
	waitWoken(t, woken, "a drops the node whose listener is gone, waking its timer loop")
	a.peersMu.Lock()
	_, otherKept := a.peers["OTHER"]
	_, namelessKept := a.peers["NAMELESS"]
	a.peersMu.Unlock()
	if otherKept || !namelessKept {
		t.Errorf("after OTHER's listener went: OTHER kept %v (want false), NAMELESS kept %v (want true: its listener is not named)", otherKept, namelessKept)
	}
	if _, of := a.timerShare(); of != 2 {
		t.Errorf("a counts %d nodes, want 2", of)
	}
}

// TestPeerCheckKeepsNodesHeardSince: a node heard from after a check of
// the listeners began is kept, though the check did not find its
// listener (one that reconnected says hello again as it comes back); and
// a check that cannot find this node's own listener (a pooler renaming
// connections) drops no one.
func TestPeerCheckKeepsNodesHeardSince(t *testing.T) {
	dsn := pgtest.DSN(t)
	a := openNode(t, dsn)
	listen(t, a)
	poll(t, "a's listener up", a.Listening)
	a.heardFrom("EARLIER", true)
	a.peersMu.Lock()
	// Heard, as it were, while the check runs (set in one step: a's own
	// checks run beside this test).
	a.peers["LATER"] = &peer{at: a.since() + int64(time.Hour), named: true}
	a.peersMu.Unlock()
	if err := a.dropGonePeers(t.Context()); err != nil {
		t.Fatal(err)
	}
	a.peersMu.Lock()
	_, later := a.peers["LATER"]
	_, earlier := a.peers["EARLIER"]
	a.peersMu.Unlock()
	if !later {
		t.Error("the check dropped a node heard from after it began")
	}
	if earlier {
		t.Error("the check kept a node heard from before it began, with no listener connected")
	}

	w := openNode(t, dsn) // never listens: its own listener is nowhere
	w.heardFrom("EARLIER", true)
	if err := w.dropGonePeers(t.Context()); err == nil {
		t.Error("a check that found no listener of its own node did not fail")
	}
	if _, of := w.timerShare(); of != 2 {
		t.Errorf("a failed check dropped a node: %d counted, want 2", of)
	}
}

// TestHelloSaysListenerNamed: a node whose listener Postgres shows under
// its name says so in its hello and in its answers to the others' hellos
// (hi), so a newcomer may drop an older node that dies as soon as the
// older one may drop it.
func TestHelloSaysListenerNamed(t *testing.T) {
	dsn := pgtest.DSN(t)
	a, b := openNode(t, dsn), openNode(t, dsn)
	// a listens and says hello before b listens: b learns of a from a's
	// answer to b's hello (hi) alone.
	listen(t, a)
	poll(t, "a's listener up", a.Listening)
	listen(t, b)
	poll(t, "each node counts the other in its share", func() bool {
		_, ofA := a.timerShare()
		_, ofB := b.timerShare()
		return ofA == 2 && ofB == 2
	})
	for _, n := range []struct {
		who     string
		s       *Store
		of      string
		heardBy *Store
	}{{"a", a, "b", b}, {"b", b, "a", a}} {
		if !n.s.named.Load() || !strings.Contains(n.s.hello(), "?"+namedMark+":") {
			t.Errorf("%s: named %v, hello %q: want its listener named, and the hello to say so", n.who, n.s.named.Load(), n.s.hello())
		}
		n.heardBy.peersMu.Lock()
		p := n.heardBy.peers[n.s.node]
		named := p != nil && p.named
		n.heardBy.peersMu.Unlock()
		if !named {
			t.Errorf("%s does not know %s's listener is named", n.of, n.who)
		}
	}
}

// napRun creates through s a running run of wf whose step nap, in status
// st, has its wake-up queued at due; the run expires at expires.
func napRun(t *testing.T, s *Store, wf *store.Workflow, st string, due, expires, now time.Time) *store.Run {
	t.Helper()
	r, _, err := s.CreateRun(t.Context(), &store.NewRun{
		Run:   store.Run{WorkflowID: wf.ID, Version: 1, Status: status.RunRunning, Input: json.RawMessage(`{}`), ExpiresAt: expires, StartedAt: now},
		Steps: []*store.StepRun{{Name: "nap", Type: "sleep", Status: st}},
		Queue: []store.QueueItem{{Kind: store.KindWake, Step: "nap", DueAt: due}},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestGoodbyeWhenListenerStops: a node says goodbye when its listener
// stops with its context (the node stops running), before any Close, so
// the others take its share at once; no hello or hi of it follows until
// it listens again, and then it is counted again.
func TestGoodbyeWhenListenerStops(t *testing.T) {
	a, b, heard, _, stopB := listeningPair(t)
	// Only the goodbye takes b out at once: a's check of the listeners
	// would in a second, but drops only nodes whose hellos say theirs is
	// named.
	a.peersMu.Lock()
	a.peers[b.node].named = false
	a.peersMu.Unlock()
	woken := timerWakes(a)
	stopB() // b's Run ends; b stays open
	waitFor(t, heard, byePrefix+b.node)
	waitWoken(t, woken, "b's goodbye wakes a's timer loop")
	if _, of := a.timerShare(); of != 1 {
		t.Fatalf("a counts %d nodes after b stopped running, want 1", of)
	}
	// A hello after the goodbye (its peer check's, or its publisher's)
	// would have a count b again: none goes out, and a hi's wake-up goes
	// as a plain one. A notification of a's marks where they would have
	// arrived.
	b.present(b.hello(), "")
	b.present(hiPrefix+b.node+b.mark()+":"+b.scope, b.node+":"+b.scope)
	got := heardUntilMark(t, a, heard)
	if !slices.Contains(got, b.node) {
		t.Errorf("b's hi after its goodbye did not wake the others as a plain wake-up: heard %q", got)
	}
	for _, n := range got {
		if strings.HasSuffix(n, b.node) && n != b.node {
			t.Fatalf("b sent %q after its goodbye", n)
		}
	}
	listen(t, b)
	poll(t, "a counts b once it listens again", func() bool { _, of := a.timerShare(); return of == 2 })
}

// TestNoGoodbyeAfterANewerRun: a listener whose context ended says no
// goodbye once another listener of the node has begun (Run started again
// before the last one's listener had ended): the goodbye would have the
// others stop counting a node that runs, and its hellos would stop.
func TestNoGoodbyeAfterANewerRun(t *testing.T) {
	a, b, heard, first, stopFirst := listeningPair(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// A second listener begins (its hello heard: a's check of the
	// listeners then finds it), then the first ends.
	heardUntilMark(t, a, heard) // the first listener's hello read
	second := b.Wakeups(ctx)
	waitFor(t, heard, helloPrefix+b.node)
	stopFirst()
	for range first {
	}
	for _, n := range heardUntilMark(t, a, heard) {
		if n == byePrefix+b.node {
			t.Fatal("the first listener's end said goodbye for a node whose second listener runs")
		}
	}
	b.sayMu.Lock()
	gone := b.gone
	b.sayMu.Unlock()
	if gone {
		t.Fatal("b takes itself for gone while it runs: its hellos would not go out")
	}
	if _, of := a.timerShare(); of != 2 {
		t.Fatalf("a counts %d nodes while b runs, want 2", of)
	}
	cancel()
	for range second {
	}
	waitFor(t, heard, byePrefix+b.node)
}

// TestCloseEndsListener: a store closed while its node still runs stops
// listening (its goodbye said, no listener starts again to say hello for
// a store whose pools are closed).
func TestCloseEndsListener(t *testing.T) {
	_, b, heard, wake, _ := listeningPair(t) // b's context does not end
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, heard, byePrefix+b.node)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range wake {
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("b's listener still runs after b closed")
	}
	if b.Listening() {
		t.Fatal("b says it listens after it closed")
	}
}

// listeningPair opens two nodes of one database, both listening and a
// counting b, with a raw listener of their notifications (see
// rawListener) and b's listener: its wake-ups and what stops it.
func listeningPair(t *testing.T) (a, b *Store, heard <-chan string, bWake <-chan struct{}, stopB func()) {
	t.Helper()
	dsn := pgtest.DSN(t)
	a, b = openNode(t, dsn), openNode(t, dsn)
	heard = rawListener(t, dsn, a.scope)
	listen(t, a)
	bWake, stopB = listen(t, b)
	poll(t, "a counts b", func() bool { _, of := a.timerShare(); return of == 2 })
	return a, b, heard, bWake, stopB
}

// heardUntilMark is what heard receives up to a mark a sends now: every
// notification committed before it.
func heardUntilMark(t *testing.T, a *Store, heard <-chan string) []string {
	t.Helper()
	mark := "mark" + a.node
	a.notify(mark + ":" + a.scope)
	return waitFor(t, heard, mark)
}

// TestListenerReconnectsAtOnce: a listener whose connection breaks after
// it was up connects again at once, not after the retry wait of a failed
// attempt: the others' check of the listeners, each second, would
// otherwise find the node gone, and both would fire its share until it
// is back.
func TestListenerReconnectsAtOnce(t *testing.T) {
	dsn := pgtest.DSN(t)
	b := openNode(t, dsn)
	b.listenRetry = time.Hour // only a reconnection at once is back in time
	b.listenUp = 0            // however briefly its connection was up
	listen(t, b)
	poll(t, "b listens", b.Listening)
	n := b.listens.Load()
	var ended int
	if err := b.DB().QueryRowContext(t.Context(), "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE $1) x", listenerPrefix+b.node+"%").Scan(&ended); err != nil || ended != 1 {
		t.Fatalf("ending b's listener's connection: %d ended, %v", ended, err)
	}
	poll(t, "b's listener back", func() bool { return b.listens.Load() > n && b.Listening() })
}
