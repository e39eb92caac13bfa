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
	mu    sync.Mutex
	calls [][]string
	// before runs at the start of each call; an error fails the call.
	before func(runs []string) error
}

func (f *fireSpy) FireTimers(ctx context.Context, runs []string, now time.Time, lease time.Duration, fn func(*store.QueueItem, store.RunTx) error) (int, []error, error) {
	f.mu.Lock()
	f.calls = append(f.calls, append([]string(nil), runs...))
	before := f.before
	f.mu.Unlock()
	if before != nil {
		if err := before(runs); err != nil {
			return 0, nil, err
		}
	}
	return f.Store.FireTimers(ctx, runs, now, lease, fn)
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
	def, err := spec.Parse([]byte(`{"name": "nap", "tasks": {"nap": {"sleep": "1s"}}}`), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateWorkflow(t.Context(), &store.Workflow{Name: def.Name, Definition: def.Source, Fingerprint: def.Fingerprint(), Enabled: true}); err != nil {
		t.Fatal(err)
	}
	reqs := make([]TriggerRequest, n)
	for i := range reqs {
		reqs[i] = TriggerRequest{Input: json.RawMessage(fmt.Sprintf(`{"i": %d}`, i))}
	}
	res, err := r.TriggerBatch(t.Context(), "nap", reqs)
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
	runs := func(cs []candidate) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.run)
		}
		return out
	}
	before := tl.beginRead()
	tl.mark([]string{"a"}, true)
	if got := runs(tl.candidates(items, now, before)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("while a is being fired: candidates %v, want [b]", got)
	}
	tl.mark([]string{"a"}, false)
	if got := runs(tl.candidates(items, now, before)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("a fired after the read began: candidates %v, want [b]", got)
	}
	after := tl.beginRead()
	if got := runs(tl.candidates(items, now, after)); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("a read begun after a was fired: candidates %v, want [a b]", got)
	}
	if len(tl.firing) != 0 {
		t.Errorf("%d runs still remembered after a later read began", len(tl.firing))
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
	tl.mark([]string{"busy"}, true)
	tl.mark([]string{"done"}, true)
	tl.mark([]string{"done"}, false)
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
	tl.mark(many, true)
	if got := tl.skipped(now); !slices.Equal(got, []string{"held"}) {
		t.Fatalf("with %d runs in flight skipped = %d runs, want only the held one", maxSkipBusy+2, len(got))
	}
}
