package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/testwait"
)

// fireSpy is a store whose FireTimers calls are observed (and may be held
// or failed) by a test. Embedding the interface hides SQLite's
// SerialWrites, so the runtime uses the concurrent shape (4 lanes).
type fireSpy struct {
	store.Store
	mu     sync.Mutex
	calls  [][]string
	reads  atomic.Int64
	listed [][]string // the runs each read of due timers listed
	// before runs at the start of each call; an error fails the call.
	before func(runs []string) error
}

func (f *fireSpy) DueTimers(ctx context.Context, now, until time.Time, max int, skip ...string) ([]*store.QueueItem, error) {
	items, err := f.Store.DueTimers(ctx, now, until, max, skip...)
	f.mu.Lock()
	var got []string
	for _, it := range items {
		got = append(got, it.RunID)
	}
	f.listed = append(f.listed, got)
	f.mu.Unlock()
	f.reads.Add(1)
	return items, err
}

func (f *fireSpy) FireTimers(ctx context.Context, runs []string, read []*store.QueueItem, now time.Time, lease time.Duration, fn func(*store.QueueItem, store.RunTx) error) (int, []error, error) {
	f.mu.Lock()
	f.calls = append(f.calls, append([]string(nil), runs...))
	before := f.before
	f.mu.Unlock()
	if before != nil {
		if err := before(runs); err != nil {
			return 0, nil, err
		}
	}
	return f.Store.FireTimers(ctx, runs, read, now, lease, fn)
}

func (f *fireSpy) callsOf(run string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		for _, id := range c {
			if id == run {
				n++
			}
		}
	}
	return n
}

// sleepers creates n runs that sleep 1s from the clock's now and returns
// their ids.
func sleepers(t *testing.T, r *Runtime, s store.Store, n int) []string {
	t.Helper()
	return triggered(t, r, s, `{"name": "nap", "tasks": {"nap": {"sleep": "1s"}}}`, n)
}

// triggered stores the workflow of definition def and triggers n runs of
// it, returning their ids.
func triggered(t *testing.T, r *Runtime, s store.Store, def string, n int) []string {
	t.Helper()
	wf, err := spec.Parse([]byte(def), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateWorkflow(t.Context(), &store.Workflow{Name: wf.Name, Definition: wf.Source, Fingerprint: wf.Fingerprint(), Enabled: true}); err != nil {
		t.Fatal(err)
	}
	reqs := make([]TriggerRequest, n)
	for i := range reqs {
		reqs[i] = TriggerRequest{Input: json.RawMessage(fmt.Sprintf(`{"i": %d}`, i))}
	}
	res, err := r.TriggerBatch(t.Context(), wf.Name, reqs)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i, x := range res {
		ids[i] = x.Run.ID
	}
	return ids
}

func newSpied(t *testing.T) (*Runtime, *fireSpy, *clock.Fake) {
	t.Helper()
	spy := &fireSpy{Store: openSQLite(t)}
	r, clk := newOn(t, spy)
	return r, spy, clk
}

func runLoop(t *testing.T, r *Runtime) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, 20*time.Second, what, cond)
}

func allAwake(t *testing.T, s store.Store, ids []string) bool {
	t.Helper()
	for _, id := range ids {
		run, _, err := s.GetRun(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status != status.RunCompleted {
			return false
		}
	}
	return true
}

// TestTimerLoopFiresInParallelLanes: a burst of due wake-ups is shared out
// to the free lanes as fire transactions in flight at once, with disjoint
// runs, and every run is fired.
func TestTimerLoopFiresInParallelLanes(t *testing.T) {
	r, spy, clk := newSpied(t)
	ids := sleepers(t, r, spy, 100)
	var inFlight sync.WaitGroup
	inFlight.Add(concurrentTimers.lanes)
	all := make(chan struct{})
	go func() { inFlight.Wait(); close(all) }()
	var calls atomic.Int32
	spy.before = func(runs []string) error {
		// The first call of each lane waits until every lane has one.
		if calls.Add(1) <= int32(concurrentTimers.lanes) {
			inFlight.Done()
		}
		select {
		case <-all:
		case <-time.After(20 * time.Second):
			return errors.New("the lanes never were all in flight")
		}
		return nil
	}
	runLoop(t, r)
	clk.Advance(time.Second)
	r.Nudge()
	select {
	case <-all:
	case <-time.After(20 * time.Second):
		t.Fatalf("never %d fire transactions in flight at once (calls: %d)", concurrentTimers.lanes, len(spy.calls))
	}
	waitUntil(t, "every run awake", func() bool { return allAwake(t, spy, ids) })
	spy.mu.Lock()
	defer spy.mu.Unlock()
	seen := map[string]int{}
	for _, c := range spy.calls[:concurrentTimers.lanes] {
		if len(c) == 0 || len(c) > concurrentTimers.chunk {
			t.Errorf("a fire transaction took %d runs, want 1 to %d", len(c), concurrentTimers.chunk)
		}
		for _, id := range c {
			seen[id]++
		}
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("run %s was in %d fire transactions in flight at once", id, n)
		}
	}
}

// TestTimerFailureBacksOffAndIsolates: when a fire transaction fails as a
// whole because of one run, the other runs are fired one per transaction
// after a short hold, and the bad run is retried alone, only after its
// hold (which doubles), not in a hot loop.
func TestTimerFailureBacksOffAndIsolates(t *testing.T) {
	r, spy, clk := newSpied(t)
	ids := sleepers(t, r, spy, 12)
	bad := ids[5]
	spy.before = func(runs []string) error {
		for _, id := range runs {
			if id == bad {
				return errors.New("cannot write this run")
			}
		}
		return nil
	}
	runLoop(t, r)
	clk.Advance(time.Second)
	r.Nudge()
	waitUntil(t, "the bad run tried", func() bool { return spy.callsOf(bad) >= 1 })
	// Its chunk's runs are held for timerRetry: nothing more happens to
	// the bad run until the clock passes it.
	time.Sleep(50 * time.Millisecond) // negative check: give a hot loop the chance to show
	if n := spy.callsOf(bad); n != 1 {
		t.Fatalf("the bad run was tried %d times before its hold ended, want 1", n)
	}
	clk.Advance(timerRetry)
	r.Nudge()
	good := append(append([]string(nil), ids[:5]...), ids[6:]...)
	waitUntil(t, "the other runs awake", func() bool { return allAwake(t, spy, good) })
	waitUntil(t, "the bad run retried", func() bool { return spy.callsOf(bad) == 2 })
	spy.mu.Lock()
	first := true
	for _, c := range spy.calls {
		if !slices.Contains(c, bad) {
			continue
		}
		if !first && len(c) != 1 {
			t.Errorf("after failing, the bad run was fired with others: %v", c)
		}
		first = false
	}
	spy.mu.Unlock()
	// The second hold is twice the first.
	clk.Advance(timerRetry)
	r.Nudge()
	time.Sleep(50 * time.Millisecond) // negative check
	if n := spy.callsOf(bad); n != 2 {
		t.Fatalf("the bad run was tried %d times within its doubled hold, want 2", n)
	}
	clk.Advance(timerRetry)
	r.Nudge()
	waitUntil(t, "the bad run retried after its doubled hold", func() bool { return spy.callsOf(bad) == 3 })
}

// TestTimerCandidatesSkipRunsFiredSinceTheRead: a run being fired is not a
// candidate; nor, once its transaction ended, for a read begun before
// that (the read may predate the commit and still list its timers); a
// read begun afterwards sees the commit, and the run is a candidate again
// (its timers, if any are left, are due).
func TestTimerCandidatesSkipRunsFiredSinceTheRead(t *testing.T) {
	tl := newTimerLoop(concurrentTimers)
	now := time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC)
	items := []*store.QueueItem{{RunID: "a", DueAt: now}, {RunID: "b", DueAt: now}}
	runs := func(cs []candidate, _ time.Time) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.run)
		}
		return out
	}
	before := tl.beginRead()
	tl.mark([]string{"a"}, now)
	if got := runs(tl.candidates(items, now, before)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("while a is being fired: candidates %v, want [b]", got)
	}
	tl.mark([]string{"a"}, time.Time{})
	if got := runs(tl.candidates(items, now, before)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("a fired after the read began: candidates %v, want [b]", got)
	}
	// What comes due after a's transaction began is a's again at once.
	later := append(slices.Clone(items), &store.QueueItem{RunID: "a", DueAt: now.Add(time.Millisecond)})
	if cs, next := tl.candidates(later, now, before); !slices.Equal(runs(cs, next), []string{"b"}) || !next.Equal(now.Add(time.Millisecond)) {
		t.Fatalf("a fired after the read began, with an item due after its fire: candidates %v, next %v; want [b], next +1ms", runs(cs, next), next)
	}
	after := tl.beginRead()
	if got := runs(tl.candidates(items, now, after)); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("a read begun after a was fired: candidates %v, want [a b]", got)
	}
	if len(tl.firing) != 0 {
		t.Errorf("%d runs still remembered after a later read began", len(tl.firing))
	}
}

// TestTimerCandidatesKeepWhatIsNotDue: of a read ahead, the items not yet
// due are no candidates; the first of them is when to look next, unless
// its run is being fired, and a later item of a run due now is not it
// (its run is fired whole).
func TestTimerCandidatesKeepWhatIsNotDue(t *testing.T) {
	tl := newTimerLoop(concurrentTimers)
	now := time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return now.Add(time.Duration(n) * time.Millisecond) }
	items := []*store.QueueItem{{RunID: "a", DueAt: now}, {RunID: "a", DueAt: ms(1)}, {RunID: "b", DueAt: ms(2)}, {RunID: "c", DueAt: ms(3)}}
	read := tl.beginRead()
	cs, next := tl.candidates(items, now, read)
	if len(cs) != 1 || cs[0].run != "a" || !next.Equal(ms(2)) {
		t.Fatalf("candidates %+v, next %v; want a alone, next at +2ms (b)", cs, next)
	}
	tl.mark([]string{"a", "b"}, now)
	if cs, next := tl.candidates(items, now, read); len(cs) != 0 || !next.Equal(ms(3)) {
		t.Fatalf("with a and b being fired: candidates %+v, next %v; want none, next at +3ms (c)", cs, next)
	}
	if cs, next := tl.candidates(items, ms(3), read); len(cs) != 1 || cs[0].run != "c" || !next.IsZero() {
		t.Fatalf("at +3ms: candidates %+v, next %v; want c, nothing next", cs, next)
	}
}

// TestTimerChunksCarryTheirItems: a fire transaction's runs come with the
// items the read listed of them that are due (the store may fire those
// without reading them again), every one of a run's, and none of a run
// left out of the chunk; a failed run goes alone, with its own.
func TestTimerChunksCarryTheirItems(t *testing.T) {
	tl := newTimerLoop(concurrentTimers)
	now := time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return now.Add(time.Duration(n) * time.Millisecond) }
	a1 := &store.QueueItem{ID: 1, RunID: "a", DueAt: ms(-3)}
	b1 := &store.QueueItem{ID: 2, RunID: "b", DueAt: ms(-2)}
	a2 := &store.QueueItem{ID: 3, RunID: "a", DueAt: ms(-1)}
	c1 := &store.QueueItem{ID: 4, RunID: "c", DueAt: now}
	a3 := &store.QueueItem{ID: 5, RunID: "a", DueAt: ms(1)} // not due
	cs, _ := tl.candidates([]*store.QueueItem{a1, b1, a2, c1, a3}, now, tl.beginRead())
	runs, items, oldest := chunk(cs, 2)
	if !slices.Equal(runs, []string{"a", "b"}) || !slices.Equal(items, []*store.QueueItem{a1, a2, b1}) || !oldest.Equal(ms(-3)) {
		t.Fatalf("chunk of 2 = %v, items %v, oldest %v; want [a b], a's two due items and b's, -3ms", runs, items, oldest)
	}
	tl.failed["b"] = &timerFailure{}
	cs, _ = tl.candidates([]*store.QueueItem{b1, c1}, now, tl.beginRead())
	if runs, items, _ := chunk(cs, 2); !slices.Equal(runs, []string{"b"}) || !slices.Equal(items, []*store.QueueItem{b1}) {
		t.Fatalf("with b failed before: chunk = %v, items %v; want b alone with its item", runs, items)
	}
}

// TestHeldRunsDoNotHideLaterTimers: when a whole read's worth of runs is
// held back after failing, the timers due after them are still read and
// fired: a read leaves held runs out (a failing expiry, which has no row
// to lease, stays due at the head of every read).
func TestHeldRunsDoNotHideLaterTimers(t *testing.T) {
	r, spy, clk := newSpied(t)
	bad := sleepers(t, r, spy, concurrentTimers.read)
	spy.before = func(runs []string) error {
		for _, id := range runs {
			if slices.Contains(bad, id) {
				return errors.New("cannot write this run")
			}
		}
		return nil
	}
	runLoop(t, r)
	clk.Advance(time.Second)
	r.Nudge()
	// Every bad run fails and is held back (for timerRetry, which the
	// clock will not reach again)...
	waitUntil(t, "every bad run held back", func() bool {
		for _, id := range bad {
			if !held(r, id) {
				return false
			}
		}
		return true
	})
	// ...and a run that comes due now is read past them and fired.
	def, err := spec.Parse([]byte(`{"name": "blink", "tasks": {"nap": {"sleep": "10ms"}}}`), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spy.CreateWorkflow(t.Context(), &store.Workflow{Name: def.Name, Definition: def.Source, Fingerprint: def.Fingerprint(), Enabled: true}); err != nil {
		t.Fatal(err)
	}
	res, err := r.TriggerBatch(t.Context(), "blink", []TriggerRequest{{Input: json.RawMessage(`{}`)}})
	if err != nil {
		t.Fatal(err)
	}
	good := res[0].Run.ID
	clk.Advance(10 * time.Millisecond)
	r.Nudge()
	waitUntil(t, "the run due after the held ones awake", func() bool { return allAwake(t, spy, []string{good}) })
	for _, id := range bad {
		if !held(r, id) {
			t.Fatalf("bad run %s is no longer held back: the clock moved past its hold", id)
		}
	}
}

// held: the run's last fire transaction failed.
func held(r *Runtime, id string) bool {
	r.timers.mu.Lock()
	defer r.timers.mu.Unlock()
	return r.timers.failed[id] != nil
}

// TestTimerReadSkipsHeldAndBusyRuns: a read leaves out the runs being
// fired and those held back, but not runs whose hold has ended, nor the
// runs in flight once they are more than maxSkipBusy.
func TestTimerReadSkipsHeldAndBusyRuns(t *testing.T) {
	tl := newTimerLoop(concurrentTimers)
	now := time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC)
	tl.mark([]string{"busy"}, now)
	tl.mark([]string{"done"}, now)
	tl.mark([]string{"done"}, time.Time{})
	tl.settle([]string{"held"}, false, now, time.Minute)
	tl.settle([]string{"over"}, false, now.Add(-time.Second), time.Minute)
	got := tl.skipped(now)
	slices.Sort(got)
	if want := []string{"busy", "held"}; !slices.Equal(got, want) {
		t.Fatalf("skipped = %v, want %v", got, want)
	}
	var many []string
	for i := range maxSkipBusy + 1 {
		many = append(many, fmt.Sprintf("r%d", i))
	}
	tl.mark(many, now)
	if got := tl.skipped(now); !slices.Equal(got, []string{"held"}) {
		t.Fatalf("with %d runs in flight skipped = %d runs, want only the held one", maxSkipBusy+2, len(got))
	}
}

// TestTimerReadAheadFiresUnread: the loop reads half the look-ahead before
// a lone timer is due, keeps what it read, and fires the timer at its due
// time with no read in between, so the timer waits for no read after its
// time.
func TestTimerReadAheadFiresUnread(t *testing.T) {
	r, spy, clk := newSpied(t)
	due := clk.Now().Add(time.Second)
	run := sleepers(t, r, spy, 1)[0]
	runLoop(t, r)
	ahead := due.Add(-timerLookahead / 2)
	waitUntil(t, "the loop to plan a read ahead of the wake-up", func() bool { return clk.HasTimer(ahead) })
	clk.Advance(ahead.Sub(clk.Now()))
	waitUntil(t, "the loop to keep the wake-up and wait for its time", func() bool { return clk.HasTimer(due) })
	reads := spy.reads.Load()
	clk.Advance(due.Sub(clk.Now()))
	waitUntil(t, "the wake-up fired", func() bool { return spy.callsOf(run) == 1 })
	// A read after the fire leaves the run out (in flight) or finds its
	// wake-up gone; one before it would list it.
	spy.mu.Lock()
	before := 0
	for _, sk := range spy.listed[reads:] {
		if slices.Contains(sk, run) {
			before++
		}
	}
	spy.mu.Unlock()
	if before != 0 {
		t.Errorf("%d reads of due timers between keeping the wake-up and firing it, want none", before)
	}
	waitUntil(t, "the run completed", func() bool { return allAwake(t, spy, []string{run}) })
}

// TestTimerOfRunInFlightAtReadIsReadAgain: a run with two wake-ups 2 ms
// apart. The first is fired; the second comes due while that transaction
// is in flight, and a read then leaves the run out. When the transaction
// ends the loop reads again and fires the second wake-up: it does not
// keep the read that lacks it and sleep for the safety tick.
func TestTimerOfRunInFlightAtReadIsReadAgain(t *testing.T) {
	r, spy, clk := newSpied(t)
	run := triggered(t, r, spy, `{"name": "two", "tasks": {"a": {"sleep": 1}, "b": {"sleep": 1.002}}}`, 1)[0]
	a := clk.Now().Add(time.Second)
	b := a.Add(2 * time.Millisecond)
	release := make(chan struct{})
	var first atomic.Bool
	spy.before = func([]string) error {
		if first.CompareAndSwap(false, true) {
			<-release // the first fire transaction stays in flight
		}
		return nil
	}
	runLoop(t, r)
	ahead := a.Add(-timerLookahead / 2)
	waitUntil(t, "a read planned ahead of the first wake-up", func() bool { return clk.HasTimer(ahead) })
	clk.Advance(ahead.Sub(clk.Now()))
	waitUntil(t, "the first wake-up kept", func() bool { return clk.HasTimer(a) })
	clk.Advance(a.Sub(clk.Now()))
	waitUntil(t, "the first wake-up in flight", func() bool { return spy.callsOf(run) == 1 })
	waitUntil(t, "the loop waiting for the second wake-up", func() bool { return clk.HasTimer(b) })
	reads := spy.reads.Load()
	clk.Advance(3 * time.Millisecond) // b is due, the first still in flight
	waitUntil(t, "a read while the run is in flight", func() bool { return spy.reads.Load() > reads })
	close(release)
	// The fake clock stands still from here: only a read after the first
	// transaction ended can fire the second wake-up.
	waitUntil(t, "the second wake-up fired", func() bool { return spy.callsOf(run) == 2 })
}

// slowReads advances the fake clock by d in each read of due timers, as
// a read that takes d would.
type slowReads struct {
	store.Store
	clk   *clock.Fake
	d     time.Duration
	reads atomic.Int64
}

func (s *slowReads) DueTimers(ctx context.Context, now, until time.Time, max int, skip ...string) ([]*store.QueueItem, error) {
	s.reads.Add(1)
	s.clk.Advance(s.d)
	return s.Store.DueTimers(ctx, now, until, max, skip...)
}

// TestSlowTimerReadDoesNotSpin: with nothing queued and reads slower than
// half the look-ahead (so the read is due a refresh as soon as it
// returns), the loop still goes to sleep after a read or two instead of
// reading again at once, forever.
func TestSlowTimerReadDoesNotSpin(t *testing.T) {
	s := &slowReads{Store: openSQLite(t), d: timerLookahead/2 + time.Millisecond}
	r, clk := newOn(t, s)
	s.clk = clk
	runLoop(t, r)
	// A spinning loop moves the clock with every read, so a timer set at
	// exactly now + the safety tick is the loop's, set after its last read.
	waitUntil(t, "the timer loop asleep", func() bool { return clk.HasTimer(clk.Now().Add(r.cfg.SafetyTick)) })
	if n := s.reads.Load(); n > 3 {
		t.Errorf("%d reads of due timers before sleeping, want at most 3", n)
	}
}
