package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

var queueTests = []test{
	{"ClaimDueOnlyOrderedAtMostN", testClaimDue},
	{"LeaseFencesUntilExpiry", testClaimLease},
	{"EnqueueInRun", testEnqueueInRun},
	{"NextDue", testNextDue},
	{"ConcurrentClaimsExactlyOnce", testClaimConcurrent},
	{"DropQueueOnlyThatRun", testDropQueue},
	{"SweepTerminalRuns", testSweep},
	{"FireTimers", testFireTimers},
	{"DueTimersEarliestAcrossKinds", testDueTimersOrder},
	{"ConcurrentFireTimersExactlyOnce", testFireTimersConcurrent},
	{"FireTimersOnTheirRead", testFireTimersOnRead},
	{"FireTimersOnACutRead", testFireTimersOnCutRead},
	{"FireTimersOnAReadMissingAnEarlierTimer", testFireTimersReadMissingEarlier},
	{"FireTimersOnAReadMissingAnEarlierExpiry", testFireTimersReadMissingExpiry},
	{"NextDueByKindAfter", testNextDueKinds},
	{"ClaimOnlyKinds", testClaimKinds},
}

// testClaimKinds: a claim limited to kinds leaves due items of others.
func testClaimKinds(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf,
		store.QueueItem{Kind: store.KindHTTP, Step: "a", DueAt: t0},
		store.QueueItem{Kind: store.KindWake, Step: "b", DueAt: t0},
	)
	got, err := s.Claim(t.Context(), at(time.Second), time.Minute, 10, store.KindHTTP)
	must(t, err, "Claim http")
	if len(got) != 1 || got[0].Kind != store.KindHTTP || got[0].RunID != r.ID {
		t.Fatalf("claim of http items = %+v, want the one http item", got)
	}
	rest := claimAll(t, s, at(time.Second))
	if len(rest) != 1 || rest[0].Kind != store.KindWake {
		t.Errorf("left after the http claim: %+v, want the wake item", rest)
	}
}

// wakeB is a wake-up of mkSimpleRun's step b due at d.
func wakeB(d time.Duration) store.QueueItem {
	return store.QueueItem{Kind: store.KindWake, Step: "b", DueAt: at(d)}
}

// succeedB fires a wake-up of mkSimpleRun's step b: it succeeds, with its
// event.
func succeedB(_ *store.QueueItem, tx store.RunTx) error {
	st := tx.Step("b")
	st.Status = status.StepSuccess
	if err := tx.UpdateStep(st); err != nil {
		return err
	}
	return tx.Append(store.NewEvent{Type: "step_succeeded", Step: "b"})
}

// testFireTimers: the due timers of the given runs are applied in one
// call; HTTP items and timers not yet due are left; a failing item keeps
// its row, held for the lease, and its writes are dropped; a second call
// for the same runs finds nothing left to fire.
func testFireTimers(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	r1 := mkSimpleRun(t, s, wf, wakeB(time.Second))
	r2 := mkSimpleRun(t, s, wf, wakeB(2*time.Second), store.QueueItem{Kind: store.KindHTTP, Step: "a", DueAt: t0})
	r3 := mkSimpleRun(t, s, wf, wakeB(time.Hour))
	bad := mkSimpleRun(t, s, wf, store.QueueItem{Kind: store.KindWaitTimeout, Step: "b", DueAt: at(time.Second)})
	due, err := s.DueTimers(ctx, at(5*time.Second), at(5*time.Second), 10)
	must(t, err, "DueTimers")
	var dueRuns []string
	for _, it := range due {
		dueRuns = append(dueRuns, it.RunID+":"+it.Kind)
	}
	sort.Strings(dueRuns)
	want := []string{r1.ID + ":wake", r2.ID + ":wake", bad.ID + ":wait_timeout"}
	sort.Strings(want)
	diff(t, "due timers", want, dueRuns)

	boom := errors.New("boom")
	var fired []string
	fire := func(it *store.QueueItem, tx store.RunTx) error {
		fired = append(fired, it.RunID+":"+it.Kind)
		if err := succeedB(it, tx); err != nil {
			return err
		}
		if it.RunID == bad.ID {
			return boom
		}
		return nil
	}
	all := []string{r1.ID, r2.ID, r3.ID, bad.ID}
	n, errs, err := s.FireTimers(ctx, all, nil, at(5*time.Second), time.Minute, fire)
	must(t, err, "FireTimers")
	if n != 3 || len(errs) != 1 || !errors.Is(errs[0], boom) {
		t.Fatalf("FireTimers took %d items with errors %v, want 3 and one boom", n, errs)
	}
	sort.Strings(fired)
	diff(t, "fired", want, fired)
	for id, wantStatus := range map[string]string{r1.ID: status.StepSuccess, r2.ID: status.StepSuccess, r3.ID: status.StepPending, bad.ID: status.StepPending} {
		_, steps := getRun(t, s, id)
		if st := stepNamed(t, steps, "b"); st.Status != wantStatus {
			t.Errorf("run %s step b = %s, want %s", id, st.Status, wantStatus)
		}
	}
	if evs := events(t, s, bad.ID); len(evs) != 0 {
		t.Errorf("the failed item's events were written: %v", eventTypes(evs))
	}
	// Fired items are gone, and the failed one is held for a minute: not
	// due again before then.
	fired = nil
	n, _, err = s.FireTimers(ctx, all, nil, at(30*time.Second), time.Minute, fire)
	must(t, err, "FireTimers within the lease")
	if n != 0 {
		t.Errorf("FireTimers again within the failed item's lease took %d items (%v), want 0", n, fired)
	}
	if due, err := s.DueTimers(ctx, at(30*time.Second), at(30*time.Second), 10); err != nil || len(due) != 0 {
		t.Errorf("DueTimers within the lease = %d items, err %v; want none", len(due), err)
	}
	if due, err := s.DueTimers(ctx, at(5*time.Second+time.Minute), at(5*time.Second+time.Minute), 10); err != nil || len(due) != 1 || due[0].RunID != bad.ID {
		t.Errorf("DueTimers after the lease = %+v, err %v; want the failed item again", due, err)
	}
	// Reading ahead lists what comes due by until, but not an item still
	// held at now whose lease ends before until: it is not firable until
	// then, and a reader that saw it would fire nothing until it was.
	if due, err := s.DueTimers(ctx, at(30*time.Second), at(90*time.Second), 10); err != nil || len(due) != 0 {
		t.Errorf("DueTimers at 30s until 90s = %d items, err %v; want none (the lease ends at 65s)", len(due), err)
	}
	// Left: r2's HTTP item, r3's later wake and the failed item.
	left := claimAll(t, s, far)
	kinds := map[string]string{}
	for _, it := range left {
		kinds[it.RunID] = it.Kind
	}
	diff(t, "items left", map[string]string{r2.ID: store.KindHTTP, r3.ID: store.KindWake, bad.ID: store.KindWaitTimeout}, kinds)
}

// testDueTimersOrder: DueTimers returns the earliest due timers over every
// timer kind (run expiries included), in due order, at most max, and no
// HTTP attempt.
func testDueTimersOrder(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	var runs []*store.Run
	kinds := []string{store.KindRunExpire, store.KindWake, store.KindHTTP, store.KindWaitTimeout}
	for i := range 8 {
		// Due 8s, 7s, … 1s: creation order is the reverse of due order.
		due := at(time.Duration(8-i) * time.Second)
		if kinds[i%4] == store.KindRunExpire {
			r := baseRun(wf, "")
			r.ExpiresAt = due
			runs = append(runs, mkRun(t, s, &store.NewRun{Run: r}))
			continue
		}
		runs = append(runs, mkSimpleRun(t, s, wf, store.QueueItem{Kind: kinds[i%4], Step: "b", DueAt: due}))
	}
	got, err := s.DueTimers(t.Context(), at(10*time.Second), at(10*time.Second), 4)
	must(t, err, "DueTimers")
	var gotDue []time.Time
	for _, it := range got {
		if !store.IsTimer(it.Kind) {
			t.Errorf("DueTimers returned a %s item", it.Kind)
		}
		gotDue = append(gotDue, it.DueAt)
	}
	// Runs 7…0 are due 1s…8s with kinds wait_timeout, HTTP, wake,
	// run_expire, wait_timeout, HTTP, wake, run_expire: the HTTP
	// attempts due at 2s and 6s are not timers.
	diff(t, "due times", []time.Time{at(time.Second), at(3 * time.Second), at(4 * time.Second), at(5 * time.Second)}, gotDue)
	if got[0].RunID != runs[7].ID || got[0].Kind != store.KindWaitTimeout {
		t.Errorf("earliest = %s of %s, want wait_timeout of %s", got[0].Kind, got[0].RunID, runs[7].ID)
	}
	got, err = s.DueTimers(t.Context(), at(4*time.Second), at(4*time.Second), 10)
	must(t, err, "DueTimers at 4s")
	if len(got) != 3 {
		t.Errorf("DueTimers at 4s = %d items, want 3 (due 1s, 3s, 4s)", len(got))
	}
	// Read ahead from 4s to 7s: the timeout at 5s and the wake at 7s too.
	got, err = s.DueTimers(t.Context(), at(4*time.Second), at(7*time.Second), 10)
	must(t, err, "DueTimers at 4s until 7s")
	gotDue = nil
	for _, it := range got {
		gotDue = append(gotDue, it.DueAt)
	}
	diff(t, "due times read ahead", []time.Time{at(time.Second), at(3 * time.Second), at(4 * time.Second), at(5 * time.Second), at(7 * time.Second)}, gotDue)
}

// testFireTimersConcurrent has 4 timer loops fire the same 60 due runs in
// overlapping calls: every timer is applied exactly once.
func testFireTimersConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	var ids []string
	for i := range 60 {
		r := mkSimpleRun(t, s, wf, store.QueueItem{Kind: store.KindWake, Step: "b", DueAt: at(time.Duration(i) * time.Millisecond)})
		ids = append(ids, r.ID)
	}
	count := fireConcurrently(t, s, ids, 40, at(time.Second), func(it *store.QueueItem, tx store.RunTx) error {
		st := tx.Step("b")
		st.Status = status.StepSuccess
		return tx.UpdateStep(st)
	})
	for _, id := range ids {
		if count[id] != 1 {
			t.Errorf("run %s: timer applied %d times, want 1", id, count[id])
		}
	}
	// Before the runs expire (at 1h), nothing is left due.
	if due, err := s.DueTimers(ctx, at(time.Minute), at(time.Minute), 100); err != nil || len(due) != 0 {
		t.Errorf("due timers left: %d, err %v", len(due), err)
	}
}

// fireConcurrently has 4 timer loops fire overlapping windows of n of
// ids (loop g starts 10·g runs in) at now, applying each item with apply,
// and returns how many times each run's items were applied (in the
// decisions that committed). Two of the loops give FireTimers their own
// read of what is due, as the runtime's timer loop does.
func fireConcurrently(t *testing.T, s store.Store, ids []string, n int, now time.Time, apply func(*store.QueueItem, store.RunTx) error) map[string]int {
	t.Helper()
	var mu sync.Mutex
	count := map[string]int{}
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := append(slices.Clone(ids[g*10:]), ids[:g*10]...)[:n]
			var read []*store.QueueItem
			if g%2 == 1 {
				var err error
				if read, err = s.DueTimers(t.Context(), now, now, 1000); err != nil {
					errc <- err
					return
				}
			}
			fn, decided := lastDecision(apply)
			_, errs, err := s.FireTimers(t.Context(), mine, read, now, time.Minute, fn)
			if err == nil && len(errs) > 0 {
				err = errs[0]
			}
			if err == nil {
				mu.Lock()
				for _, it := range decided() {
					count[it.RunID]++
				}
				mu.Unlock()
			}
			errc <- err
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		must(t, err, "FireTimers")
	}
	return count
}

// testNextDueKinds: NextDue looks only at the kinds asked for, only after
// the given instant, and counts a leased item at its lease end.
func testNextDueKinds(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	wake := mkSimpleRun(t, s, wf,
		store.QueueItem{Kind: store.KindHTTP, Step: "a", DueAt: at(10 * time.Second)},
		store.QueueItem{Kind: store.KindWake, Step: "b", DueAt: at(5 * time.Second)},
	)
	// Every run expires at 1h (baseRun): the next timer after 5s.
	check := func(what string, after time.Time, want time.Time, kinds ...string) {
		t.Helper()
		got, ok, err := s.NextDue(ctx, after, kinds...)
		must(t, err, "NextDue")
		if want.IsZero() {
			if ok {
				t.Errorf("NextDue %s = %v; want none", what, got)
			}
			return
		}
		if !ok || !got.Equal(want) {
			t.Errorf("NextDue %s = %v, ok=%v; want %v", what, got, ok, want)
		}
	}
	check("of HTTP attempts", time.Time{}, at(10*time.Second), store.KindHTTP)
	check("of timers", time.Time{}, at(5*time.Second), store.TimerKinds...)
	check("of timers after the wake-up", at(5*time.Second), at(time.Hour), store.TimerKinds...)
	check("of HTTP attempts after 10s", at(10*time.Second), time.Time{}, store.KindHTTP)
	check("of every kind", time.Time{}, at(5*time.Second))
	// The HTTP attempt leased at 12s for a minute: due again at its lease end.
	c, err := s.Claim(ctx, at(12*time.Second), time.Minute, 10, store.KindHTTP)
	must(t, err, "Claim")
	if len(c) != 1 {
		t.Fatalf("claimed %d, want 1", len(c))
	}
	check("of a leased HTTP attempt", time.Time{}, at(72*time.Second), store.KindHTTP)
	check("of a leased HTTP attempt after its lease end", at(72*time.Second), time.Time{}, store.KindHTTP)
	// After the wake-up, the next timer is the expiry an hour on, not the
	// leased HTTP attempt's lease end at 72s.
	check("of timers after 5s, with an HTTP attempt leased", at(5*time.Second), at(time.Hour), store.TimerKinds...)
	// A timer whose fire failed is held for the lease: it is next due at
	// the hold's end.
	_, errs, err := s.FireTimers(ctx, []string{wake.ID}, nil, at(6*time.Second), time.Minute, func(*store.QueueItem, store.RunTx) error {
		return errors.New("boom")
	})
	must(t, err, "FireTimers")
	if len(errs) != 1 {
		t.Fatalf("FireTimers errors %v, want the one failed item", errs)
	}
	check("of timers with the wake-up held", at(6*time.Second), at(66*time.Second), store.TimerKinds...)
	check("of HTTP attempts, with a timer held", at(72*time.Second), time.Time{}, store.KindHTTP)
}

func dueTimes(items []*store.QueueItem) []time.Time {
	out := make([]time.Time, len(items))
	for i, it := range items {
		out[i] = it.DueAt
	}
	return out
}

func checkLease(t *testing.T, items []*store.QueueItem, until time.Time) {
	t.Helper()
	for _, it := range items {
		if it.LeaseToken == "" || it.ID == 0 {
			t.Errorf("claimed item %+v has no id or lease token", it)
		}
		if !it.LeaseUntil.Equal(until) {
			t.Errorf("claimed item %d LeaseUntil = %v, want %v", it.ID, it.LeaseUntil, until)
		}
	}
}

func testClaimDue(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	// Inserted against due order, so neither ids nor the physical row order
	// follow due times within a claim.
	offsets := []time.Duration{30 * time.Second, 20 * time.Second, 0, -5 * time.Second, 10 * time.Second, 20*time.Second + time.Microsecond}
	var queue []store.QueueItem
	for i, d := range offsets {
		queue = append(queue, store.QueueItem{Kind: store.KindHTTP, Step: fmt.Sprintf("s%d", i), Attempt: i, DueAt: at(d)})
	}
	r := mkSimpleRun(t, s, wf, queue...)
	now := at(20 * time.Second)

	none, err := s.Claim(ctx, at(-6*time.Second), time.Minute, 10)
	must(t, err, "Claim before anything is due")
	if len(none) != 0 {
		t.Errorf("Claim before anything is due returned %v", keysOf(none))
	}

	first, err := s.Claim(ctx, now, time.Minute, 2)
	must(t, err, "Claim n=2")
	diff(t, "first claim due times (the two earliest, ordered)", []time.Time{at(-5 * time.Second), t0}, dueTimes(first))
	checkLease(t, first, now.Add(time.Minute))
	for _, it := range first {
		want := queue[0]
		for _, q := range queue {
			if q.DueAt.Equal(it.DueAt) {
				want = q
			}
		}
		if it.RunID != r.ID || it.Kind != want.Kind || it.Step != want.Step || it.Attempt != want.Attempt {
			t.Errorf("claimed %+v, want run %s step %s attempt %d", it, r.ID, want.Step, want.Attempt)
		}
	}
	if len(first) == 2 && first[0].LeaseToken != first[1].LeaseToken {
		t.Errorf("one claim handed out two lease tokens: %q, %q", first[0].LeaseToken, first[1].LeaseToken)
	}

	second, err := s.Claim(ctx, now, time.Minute, 10)
	must(t, err, "Claim n=10")
	// Due at or before now (due_at <= now), not yet claimed; 20s+1µs is not due.
	diff(t, "second claim due times (the rest that are due, ordered)", []time.Time{at(10 * time.Second), at(20 * time.Second)}, dueTimes(second))
	checkLease(t, second, now.Add(time.Minute))
	if len(first) > 0 && len(second) > 0 && first[0].LeaseToken == second[0].LeaseToken {
		t.Error("two claims handed out the same lease token")
	}

	third, err := s.Claim(ctx, now, time.Minute, 10)
	must(t, err, "Claim again")
	if len(third) != 0 {
		t.Errorf("claim with everything due already leased returned %v", keysOf(third))
	}
	// One microsecond later the next item is due.
	fourth, err := s.Claim(ctx, now.Add(time.Microsecond), time.Minute, 10)
	must(t, err, "Claim 1µs later")
	diff(t, "claim 1µs later", []time.Time{at(20*time.Second + time.Microsecond)}, dueTimes(fourth))

	// n larger than what is due is fine.
	rest, err := s.Claim(ctx, at(30*time.Second), time.Minute, 5)
	must(t, err, "Claim at 30s")
	diff(t, "claim at 30s", []time.Time{at(30 * time.Second)}, dueTimes(rest))
	// Once every lease has expired all six are claimable; n=1 takes the
	// earliest due.
	one, err := s.Claim(ctx, far, time.Minute, 1)
	must(t, err, "Claim n=1")
	diff(t, "claim n=1 after the leases expired", []time.Time{at(-5 * time.Second)}, dueTimes(one))
}

func testClaimLease(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf, store.QueueItem{Kind: store.KindHTTP, Step: "a", Attempt: 1, DueAt: t0})
	lease := 30 * time.Second

	c1, err := s.Claim(ctx, t0, lease, 10)
	must(t, err, "Claim")
	if len(c1) != 1 {
		t.Fatalf("claimed %d items, want 1", len(c1))
	}
	old := c1[0]
	checkLease(t, c1, t0.Add(lease))

	// Not claimable while leased, up to the last microsecond of the lease.
	for _, now := range []time.Time{t0, at(lease / 2), at(lease - time.Microsecond)} {
		got, err := s.Claim(ctx, now, lease, 10)
		must(t, err, "Claim while leased")
		if len(got) != 0 {
			t.Errorf("Claim at %v (lease until %v) returned the leased item", now, old.LeaseUntil)
		}
	}

	// Claimable again once the lease ends, with a new token.
	expiry := at(lease)
	c2, err := s.Claim(ctx, expiry, lease, 10)
	must(t, err, "Claim after expiry")
	if len(c2) != 1 {
		t.Fatalf("Claim after the lease expired returned %d items, want 1", len(c2))
	}
	cur := c2[0]
	if cur.ID != old.ID {
		t.Errorf("reclaimed item id %d, want %d", cur.ID, old.ID)
	}
	if cur.LeaseToken == old.LeaseToken {
		t.Errorf("reclaimed with the same lease token %q", cur.LeaseToken)
	}
	checkLease(t, c2, expiry.Add(lease))

	// The stale worker is fenced out.
	err = s.InRun(ctx, r.ID, expiry, func(tx store.RunTx) error {
		return tx.Dequeue(old.ID, old.LeaseToken)
	})
	wantErr(t, err, store.ErrLeaseLost, "Dequeue with the expired lease token")
	err = s.InRun(ctx, r.ID, expiry, func(tx store.RunTx) error {
		return tx.Dequeue(old.ID, "")
	})
	wantErr(t, err, store.ErrLeaseLost, "Dequeue with an empty token")
	// The failed dequeue left the item (still leased to the new holder).
	next, ok, err := s.NextDue(ctx, time.Time{})
	must(t, err, "NextDue")
	if !ok || !next.Equal(cur.LeaseUntil) {
		t.Errorf("NextDue = %v, %v; want the current lease end %v", next, ok, cur.LeaseUntil)
	}

	// The current holder dequeues; the item is gone.
	inRun(t, s, r.ID, expiry, func(tx store.RunTx) error {
		return tx.Dequeue(cur.ID, cur.LeaseToken)
	})
	if got := claimAll(t, s, far); len(got) != 0 {
		t.Errorf("item still claimable after Dequeue: %v", keysOf(got))
	}
	if _, ok, err := s.NextDue(ctx, time.Time{}); err != nil || ok {
		t.Errorf("NextDue after Dequeue = ok %v, err %v; want an empty queue", ok, err)
	}
	err = s.InRun(ctx, r.ID, expiry, func(tx store.RunTx) error {
		return tx.Dequeue(cur.ID, cur.LeaseToken)
	})
	wantErr(t, err, store.ErrLeaseLost, "Dequeue twice")
	err = s.InRun(ctx, r.ID, expiry, func(tx store.RunTx) error {
		return tx.Dequeue(cur.ID+1000, cur.LeaseToken)
	})
	wantErr(t, err, store.ErrLeaseLost, "Dequeue of an unknown id")
}

func testEnqueueInRun(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)
	added := []store.QueueItem{
		{Kind: store.KindWake, Step: "b", DueAt: at(time.Minute)},
		{Kind: store.KindHTTP, Step: "a", Attempt: 2, DueAt: at(2 * time.Minute)},
	}
	inRun(t, s, r.ID, t0, func(tx store.RunTx) error {
		// RunID is filled in by the transaction.
		return tx.Enqueue(added...)
	})
	next, ok, err := s.NextDue(t.Context(), time.Time{})
	must(t, err, "NextDue")
	if !ok || !next.Equal(at(time.Minute)) {
		t.Errorf("NextDue = %v, %v; want %v", next, ok, at(time.Minute))
	}
	diff(t, "enqueued items", keysFor(r.ID, added...), keysOf(claimAll(t, s, far)))
}

func testNextDue(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, ok, err := s.NextDue(ctx, time.Time{}); err != nil || ok {
		t.Fatalf("NextDue on an empty queue = ok %v, err %v; want ok=false", ok, err)
	}
	wf := mkWorkflow(t, s, "wf")
	mkSimpleRun(t, s, wf,
		store.QueueItem{Kind: store.KindHTTP, Step: "a", DueAt: at(10 * time.Second)},
		store.QueueItem{Kind: store.KindWake, Step: "b", DueAt: at(5*time.Second + time.Microsecond)},
	)
	check := func(what string, want time.Time) {
		t.Helper()
		got, ok, err := s.NextDue(ctx, time.Time{})
		must(t, err, "NextDue")
		if !ok || !got.Equal(want) {
			t.Errorf("NextDue %s = %v, ok=%v; want %v", what, got, ok, want)
		}
	}
	check("with two unleased items", at(5*time.Second+time.Microsecond))

	// Leasing the earliest item: the other is now the earliest.
	c, err := s.Claim(ctx, at(6*time.Second), time.Minute, 10)
	must(t, err, "Claim")
	if len(c) != 1 {
		t.Fatalf("claimed %d, want 1", len(c))
	}
	check("with the earliest leased", at(10*time.Second))

	// Leasing both: the earliest lease end.
	c, err = s.Claim(ctx, at(10*time.Second), time.Minute, 10)
	must(t, err, "Claim")
	if len(c) != 1 {
		t.Fatalf("claimed %d, want 1", len(c))
	}
	check("with everything leased", at(66*time.Second))
}

// testClaimConcurrent has 4 dispatchers claim 200 due items in batches of
// 10 at once: each item must be claimed exactly once.
func testClaimConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	const total, workers, batch = 200, 4, 10
	var queue []store.QueueItem
	for i := range total {
		queue = append(queue, store.QueueItem{Kind: store.KindHTTP, Step: fmt.Sprintf("s%03d", i), DueAt: at(time.Duration(i%17) * time.Millisecond)})
	}
	mkSimpleRun(t, s, wf, queue...)
	now := at(time.Second)

	claimed := make([][]*store.QueueItem, workers)
	errs := make([]error, workers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			<-start
			for range total { // bounded; stops at the first empty claim
				items, err := s.Claim(ctx, now, time.Hour, batch)
				if err != nil {
					errs[w] = err
					return
				}
				if len(items) > batch {
					errs[w] = fmt.Errorf("claim returned %d items, n was %d", len(items), batch)
					return
				}
				if len(items) == 0 {
					return
				}
				claimed[w] = append(claimed[w], items...)
			}
		})
	}
	close(start)
	wg.Wait()
	for w, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", w, err)
		}
	}

	seen := map[int64]int{}
	steps := map[string]bool{}
	var perWorker []int
	for _, items := range claimed {
		perWorker = append(perWorker, len(items))
		for _, it := range items {
			seen[it.ID]++
			steps[it.Step] = true
		}
	}
	var dups []int64
	for id, n := range seen {
		if n > 1 {
			dups = append(dups, id)
		}
	}
	sort.Slice(dups, func(i, j int) bool { return dups[i] < dups[j] })
	if len(dups) > 0 {
		t.Errorf("items claimed more than once: %v", dups)
	}
	if len(seen) != total || len(steps) != total {
		t.Errorf("claimed %d distinct items (%d distinct steps), want %d; per worker %v", len(seen), len(steps), total, perWorker)
	}
	if left := claimAll(t, s, now); len(left) != 0 {
		t.Errorf("%d items were left unclaimed", len(left))
	}
}

func testDropQueue(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r1 := mkSimpleRun(t, s, wf,
		store.QueueItem{Kind: store.KindHTTP, Step: "a", DueAt: t0},
		store.QueueItem{Kind: store.KindWaitTimeout, Step: "b", DueAt: at(time.Hour)},
	)
	keep := []store.QueueItem{
		{Kind: store.KindHTTP, Step: "a", DueAt: t0},
		{Kind: store.KindWake, Step: "b", DueAt: at(time.Minute)},
	}
	r2 := mkSimpleRun(t, s, wf, keep...)
	// A leased item of r1 is dropped too.
	if _, err := s.Claim(t.Context(), t0, time.Minute, 1); err != nil {
		t.Fatal(err)
	}
	inRun(t, s, r1.ID, t0, func(tx store.RunTx) error { return tx.DropQueue() })
	diff(t, "queue after DropQueue(r1)", keysFor(r2.ID, keep...), keysOf(claimAll(t, s, far)))
}

func testSweep(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	n, err := s.Sweep(ctx)
	must(t, err, "Sweep on an empty queue")
	if n != 0 {
		t.Errorf("Sweep on an empty queue = %d, want 0", n)
	}
	byStatus := map[string]*store.Run{}
	statuses := []string{status.RunRunning, status.RunPaused, status.RunCompleted, status.RunFailed, status.RunCancelled, status.RunTimeout}
	for _, st := range statuses {
		rr := baseRun(wf, "")
		rr.Status = st
		byStatus[st] = mkRun(t, s, &store.NewRun{Run: rr, Queue: []store.QueueItem{
			{Kind: store.KindHTTP, Step: "a", DueAt: t0},
			{Kind: store.KindWaitTimeout, Step: "b", DueAt: at(time.Hour)},
		}})
	}
	// A run that finishes through UpdateRun is swept too.
	late := mkSimpleRun(t, s, wf, store.QueueItem{Kind: store.KindWake, Step: "b", DueAt: t0})
	inRun(t, s, late.ID, t0, func(tx store.RunTx) error {
		u := *tx.Run()
		u.Status, u.FinishedAt = status.RunCompleted, ptr(t0)
		return tx.UpdateRun(&u)
	})

	n, err = s.Sweep(ctx)
	must(t, err, "Sweep")
	if n != 9 {
		t.Errorf("Sweep removed %d items, want 9 (2 each of 4 terminal runs + 1)", n)
	}
	remaining := map[string]int{}
	for _, it := range claimAll(t, s, far) {
		remaining[it.RunID]++
	}
	want := map[string]int{byStatus[status.RunRunning].ID: 2, byStatus[status.RunPaused].ID: 2}
	diff(t, "items left per run (running and paused only)", want, remaining)

	n, err = s.Sweep(ctx)
	must(t, err, "Sweep again")
	if n != 0 {
		t.Errorf("second Sweep removed %d items, want 0", n)
	}
}

// fireOnRead calls FireTimers for runs on read at now, applying each item
// with apply, fails the test on any error, and returns how many items
// were taken and the items of the decision that committed.
func fireOnRead(t *testing.T, s store.Store, runs []string, read []*store.QueueItem, now time.Time, apply func(*store.QueueItem, store.RunTx) error) (int, []*store.QueueItem) {
	t.Helper()
	fn, decided := lastDecision(apply)
	n, errs, err := s.FireTimers(t.Context(), runs, read, now, time.Minute, fn)
	must(t, err, "FireTimers")
	if len(errs) > 0 {
		t.Fatalf("FireTimers errors: %v", errs)
	}
	return n, decided()
}

// kindsOf lists the items' kinds.
func kindsOf(items []*store.QueueItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.Kind
	}
	return out
}

// lastDecision wraps fn as FireTimers asks of its caller: fn(nil, nil)
// drops the decision so far. decided lists the items of the last one.
func lastDecision(fn func(*store.QueueItem, store.RunTx) error) (wrapped func(*store.QueueItem, store.RunTx) error, decided func() []*store.QueueItem) {
	var items []*store.QueueItem
	return func(it *store.QueueItem, tx store.RunTx) error {
			if it == nil {
				items = nil
				return nil
			}
			items = append(items, it)
			return fn(it, tx)
		}, func() []*store.QueueItem {
			return items
		}
}

// testFireTimersOnRead: FireTimers given the caller's read of what is
// due applies what the read lists as without it, and what changed since
// the read is applied as it is now, not as the read had it: an item fired
// since is not fired again, one held for its lease since is not fired,
// and a run written since keeps that write.
func testFireTimersOnRead(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	r1 := mkSimpleRun(t, s, wf, wakeB(time.Second))
	r2 := mkSimpleRun(t, s, wf, wakeB(2*time.Second), store.QueueItem{Kind: store.KindHTTP, Step: "a", DueAt: t0})
	later := mkSimpleRun(t, s, wf, wakeB(time.Hour))
	held := mkSimpleRun(t, s, wf, wakeB(3*time.Second))
	written := mkSimpleRun(t, s, wf, wakeB(4*time.Second))
	now := at(5 * time.Second)
	read, err := s.DueTimers(ctx, now, now, 10)
	must(t, err, "DueTimers")
	if len(read) != 4 {
		t.Fatalf("read %d due items, want 4", len(read))
	}
	fire := func(runs []string, now time.Time, apply func(*store.QueueItem, store.RunTx) error) (int, []string) {
		t.Helper()
		n, decided := fireOnRead(t, s, runs, read, now, apply)
		var got []string
		for _, it := range decided {
			got = append(got, it.RunID)
		}
		sort.Strings(got)
		return n, got
	}
	wantRun := func(id, step string, evs ...string) {
		t.Helper()
		_, steps := getRun(t, s, id)
		if st := stepNamed(t, steps, "b"); st.Status != step {
			t.Errorf("run %s step b = %s, want %s", id, st.Status, step)
		}
		diff(t, "events of run "+id, append([]string{}, evs...), eventTypes(events(t, s, id)))
	}

	n, got := fire([]string{r1.ID, r2.ID}, now, succeedB)
	want := []string{r1.ID, r2.ID}
	sort.Strings(want)
	if n != 2 {
		t.Errorf("FireTimers on the read took %d items, want 2", n)
	}
	diff(t, "fired on the read", want, got)
	wantRun(r1.ID, status.StepSuccess, "step_succeeded")
	wantRun(r2.ID, status.StepSuccess, "step_succeeded")
	// A run with nothing due.
	if n, got := fire([]string{later.ID}, now, succeedB); n != 0 || len(got) != 0 {
		t.Errorf("FireTimers of a run with nothing due took %d items (%v), want none", n, got)
	}
	wantRun(later.ID, status.StepPending)

	// The same read again: what it lists was fired since.
	if n, got := fire([]string{r1.ID, r2.ID}, now, succeedB); n != 0 || len(got) != 0 {
		t.Errorf("FireTimers on a read whose items were fired since took %d items (%v), want none", n, got)
	}
	wantRun(r1.ID, status.StepSuccess, "step_succeeded")
	wantRun(r2.ID, status.StepSuccess, "step_succeeded")

	// Held for its lease since the read (its fire failed elsewhere).
	_, errs, err := s.FireTimers(ctx, []string{held.ID}, nil, now, time.Minute, func(*store.QueueItem, store.RunTx) error {
		return errors.New("boom")
	})
	must(t, err, "FireTimers that fails")
	if len(errs) != 1 {
		t.Fatalf("failing FireTimers errors %v, want one", errs)
	}
	if n, got := fire([]string{held.ID}, now, succeedB); n != 0 || len(got) != 0 {
		t.Errorf("FireTimers on a read whose item is held since took %d items (%v), want none", n, got)
	}
	wantRun(held.ID, status.StepPending)

	// Its run written since the read.
	must(t, s.InRun(ctx, written.ID, now, func(tx store.RunTx) error {
		return tx.Append(store.NewEvent{Type: "noted"})
	}), "InRun")
	if n, got := fire([]string{written.ID}, now, succeedB); n != 1 || len(got) != 1 {
		t.Errorf("FireTimers on a read whose run was written since took %d items (%v), want 1", n, got)
	}
	wantRun(written.ID, status.StepSuccess, "noted", "step_succeeded")

	if due, err := s.DueTimers(ctx, now, now, 10); err != nil || len(due) != 0 {
		t.Errorf("due after the calls: %d items, %v; want none (the held one is leased)", len(due), err)
	}
}

// timedRun is a run expiring at exp whose step nap sleeps and whose step
// hook waits for a callback, with queue items; applyTimer applies one of
// its timers as the runtime would, an expiry dropping the run's queue.
func timedRun(t *testing.T, s store.Store, wf *store.Workflow, exp time.Time, queue ...store.QueueItem) *store.Run {
	t.Helper()
	r := baseRun(wf, "")
	r.ExpiresAt = exp
	return mkRun(t, s, &store.NewRun{Run: r, Queue: queue, Steps: []*store.StepRun{
		{Name: "nap", Position: 0, Type: "sleep", Status: status.StepSleeping},
		{Name: "hook", Position: 1, Type: "webhook", Status: status.StepWaiting},
	}})
}

func applyTimer(now time.Time) func(*store.QueueItem, store.RunTx) error {
	return func(it *store.QueueItem, tx store.RunTx) error {
		switch it.Kind {
		case store.KindWake:
			st := tx.Step("nap")
			st.Status = status.StepSuccess
			if err := tx.UpdateStep(st); err != nil {
				return err
			}
		case store.KindWaitTimeout:
			st := tx.Step("hook")
			st.Status = status.StepTimeout
			if err := tx.UpdateStep(st); err != nil {
				return err
			}
		case store.KindRunExpire:
			if err := timeout(tx, now); err != nil {
				return err
			}
			if err := tx.DropQueue(); err != nil {
				return err
			}
		}
		return tx.Append(store.NewEvent{Type: it.Kind})
	}
}

// testFireTimersOnCutRead: a read cut short (at its size) lists a run's
// first timer, not the later ones nor its expiry, due after them;
// FireTimers on it applies what the read reached, and the run's other
// timers and its expiry are applied by later calls, each once, in due
// order, none dropped unapplied by the expiry.
func testFireTimersOnCutRead(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	r := timedRun(t, s, wf, at(5*time.Second),
		store.QueueItem{Kind: store.KindWake, Step: "nap", DueAt: at(3 * time.Second)},
		store.QueueItem{Kind: store.KindWaitTimeout, Step: "hook", DueAt: at(4 * time.Second)})
	now := at(6 * time.Second)
	var applied []string
	for range 5 {
		read, err := s.DueTimers(ctx, now, now, 1)
		must(t, err, "DueTimers")
		if len(read) == 0 {
			break
		}
		_, decided := fireOnRead(t, s, []string{r.ID}, read, now, applyTimer(now))
		applied = append(applied, kindsOf(decided)...)
	}
	diff(t, "timers applied", []string{store.KindWake, store.KindWaitTimeout, store.KindRunExpire}, applied)
	diff(t, "events", []string{store.KindWake, store.KindWaitTimeout, store.KindRunExpire}, eventTypes(events(t, s, r.ID)))
	_, steps := getRun(t, s, r.ID)
	if st := stepNamed(t, steps, "hook"); st.Status != status.StepTimeout {
		t.Errorf("step hook = %s, want timeout", st.Status)
	}
}

// testFireTimersReadMissingEarlier: a timer queued after the caller's
// read, due before what the read lists (this node's own write, so its
// run's cached version is current), is applied first, in the same call,
// as without a read.
func testFireTimersReadMissingEarlier(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	r := timedRun(t, s, wf, at(time.Hour), store.QueueItem{Kind: store.KindWake, Step: "nap", DueAt: at(3 * time.Second)})
	now := at(6 * time.Second)
	read, err := s.DueTimers(ctx, now, now, 10)
	must(t, err, "DueTimers")
	must(t, s.InRun(ctx, r.ID, now, func(tx store.RunTx) error {
		if err := tx.Enqueue(store.QueueItem{Kind: store.KindWaitTimeout, Step: "hook", DueAt: at(2 * time.Second)}); err != nil {
			return err
		}
		return tx.Append(store.NewEvent{Type: "queued"})
	}), "InRun")
	n, decided := fireOnRead(t, s, []string{r.ID}, read, now, applyTimer(now))
	if n != 2 {
		t.Fatalf("FireTimers took %d items, want both", n)
	}
	diff(t, "timers applied", []string{store.KindWaitTimeout, store.KindWake}, kindsOf(decided))
	diff(t, "events", []string{"queued", store.KindWaitTimeout, store.KindWake}, eventTypes(events(t, s, r.ID)))
}

// testFireTimersReadMissingExpiry: the caller's read lists a run's
// wake-up but not its expiry, due before it (the timer loop passes on
// only what a transaction of its own has not taken); the expiry is
// applied first, in the same call, as without a read.
func testFireTimersReadMissingExpiry(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	r := timedRun(t, s, wf, at(2*time.Second), store.QueueItem{Kind: store.KindWake, Step: "nap", DueAt: at(3 * time.Second)})
	now := at(6 * time.Second)
	due, err := s.DueTimers(ctx, now, now, 10)
	must(t, err, "DueTimers")
	var read []*store.QueueItem
	for _, it := range due {
		if it.Kind != store.KindRunExpire {
			read = append(read, it)
		}
	}
	if len(read) != 1 || len(due) != 2 {
		t.Fatalf("DueTimers = %+v; want the expiry and the wake-up", due)
	}
	_, decided := fireOnRead(t, s, []string{r.ID}, read, now, applyTimer(now))
	diff(t, "timers applied", []string{store.KindRunExpire, store.KindWake}, kindsOf(decided))
	if run, _ := getRun(t, s, r.ID); run.Status != status.RunTimeout {
		t.Errorf("run = %s, want timeout", run.Status)
	}
}
