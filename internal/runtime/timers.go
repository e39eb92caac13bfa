package runtime

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// Timers (wake-ups of sleep steps, webhook timeouts, run expiries) have a
// loop of their own, apart from the dispatcher of HTTP attempts: a timer
// is a promise about time, and how late it fires is what users see.
//
// The loop reads what is due and what comes due within timerLookahead (no
// locks), keeps that read, takes the runs due and not already being
// fired, and fires them in a transaction of their own while it goes on:
// up to shape.lanes transactions at once, each with a share of what is
// due. Under a burst several transactions are in flight, so a timer waits
// for one transaction, not for a batch of a thousand; alone, a timer was
// read before its time and is fired the moment it is due. A timer's step
// records the moment its transaction applied it, so lateness is measured
// where it happens.
//
// With one writer (SQLite) transactions do not run side by side: two lanes
// (one being written, one waiting for its disk sync) and chunks as large as
// what is due, since a large transaction costs less per timer there.
//
// A fire transaction that fails as a whole (as opposed to one timer in it,
// which the store holds for a lease on its own) is not retried at once:
// its runs are held back for timerRetry, doubling at each further failure
// up to the lease, and fired one run per transaction from then on, so one
// run that cannot be written does not hold back the others and a failing
// database is not hammered.
const (
	// timerSlack is how late timers may run before new triggers and
	// reports give way: above the loop's own precision (it picks up a
	// timer alone 0.1–0.8 ms after its due time), so a backlog closes the
	// gate, not the loop's own delay. 10 ms was measured against 2 in the
	// eighth pass: the gate then closed after the backlog had built.
	timerSlack = 2 * time.Millisecond
	// timerRetry is the first hold of a run whose fire transaction failed.
	timerRetry = 100 * time.Millisecond
	// timerLookahead is how far ahead of now the loop reads due timers,
	// to fire them at their time without a read in between. It reads
	// again when half of it is left, so that half should be more than a
	// read takes under load (0.5–3 ms on Postgres); a slower read costs
	// the kept items nothing, and the loop reads after firing them.
	timerLookahead = 10 * time.Millisecond
)

// timerShape is how the loop cuts what is due into transactions.
type timerShape struct {
	lanes int // fire transactions in flight at once
	read  int // due timers read per look
	chunk int // most runs per fire transaction
}

var (
	concurrentTimers = timerShape{lanes: 4, read: 256, chunk: 128}
	serialTimers     = timerShape{lanes: 2, read: 1024, chunk: 1024}
)

// timerLoop is the state of the timer loop; its zero value is not usable
// (see newTimerLoop).
type timerLoop struct {
	shape timerShape
	// wake asks for a new read (a commit queued a timer the last read
	// did not see); ended says a fire transaction ended (a lane is free).
	wake, ended chan struct{}
	// planned is when the loop will next look (Unix ns; MaxInt64 while it
	// is deciding): commits that queue a timer due earlier wake it. seen
	// is the end of what the last read saw (Unix ns): commits that queue
	// a timer due before it wake it too, for it keeps that read.
	planned, seen atomic.Int64
	lanes         chan struct{}
	mu            sync.Mutex
	// firing holds runs in a fire transaction (-1) and runs whose fire
	// transaction ended, with the number of the last read of due timers
	// begun before it ended: that read may predate the commit and still
	// list the timers just fired, so it must not pick the run again (it
	// did, and a lane spent a transaction on nothing). reads counts the
	// reads begun.
	firing map[string]int64
	reads  int64
	// firedAt is when the last fire transaction of each run in firing
	// began: it took nothing due after that, so a read from before it
	// ended still lists the run's later items rightly.
	firedAt map[string]time.Time
	// leftOut are the runs in flight when the last read began; stale
	// says one of them has ended since (the kept read lacks its items).
	leftOut map[string]bool
	stale   atomic.Bool
	failed  map[string]*timerFailure
}

// timerFailure is a run whose last fire transaction failed as a whole.
type timerFailure struct {
	until time.Time     // not fired again before
	hold  time.Duration // the hold a further failure gets
}

func newTimerLoop(shape timerShape) *timerLoop {
	t := &timerLoop{shape: shape, wake: make(chan struct{}, 1), ended: make(chan struct{}, 1), lanes: make(chan struct{}, shape.lanes), firing: map[string]int64{}, leftOut: map[string]bool{}, firedAt: map[string]time.Time{}, failed: map[string]*timerFailure{}}
	t.planned.Store(math.MaxInt64)
	return t
}

func (t *timerLoop) nudge() { signal(t.wake) }

// queued wakes the loop for a timer committed due at due (Unix ns) if it
// would sleep past it or its last read would not list it.
func (t *timerLoop) queued(due int64) {
	if due < t.planned.Load() || due < t.seen.Load() {
		t.nudge()
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// candidate is a run with due timers that may be fired now.
type candidate struct {
	run    string
	due    time.Time // its earliest due timer
	failed bool      // its last fire transaction failed: it goes alone
	// items are its timers the read listed that are due (FireTimers may
	// decide on them without reading them again).
	items []*store.QueueItem
}

// beginRead numbers a read of due timers about to start. Runs whose fire
// transaction ended before it need not be remembered any more: this read
// sees their commit. (Only the loop reads, one read at a time.)
func (t *timerLoop) beginRead() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reads++
	clear(t.leftOut)
	t.stale.Store(false)
	for id, v := range t.firing {
		if v >= 0 && v < t.reads {
			delete(t.firing, id)
			delete(t.firedAt, id)
		} else if v < 0 {
			t.leftOut[id] = true
		}
	}
	return t.reads
}

// candidates are the runs of items (from read number read, earliest
// first) due at now and not being fired, fired since that read began, nor
// held back, in due order; next is when the first such item not yet due
// comes due (zero if none).
func (t *timerLoop) candidates(items []*store.QueueItem, now time.Time, read int64) (out []candidate, next time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := map[string]int{} // index in out
	for _, it := range items {
		id := it.RunID
		f := t.failed[id]
		v, busy := t.firing[id]
		// A run fired since the read began is left out for what the
		// read may list that it fired, not for what came due after
		// its transaction began (it took none of that).
		firedSince := busy && v >= read && !it.DueAt.After(t.firedAt[id])
		if (busy && v < 0) || firedSince || (f != nil && now.Before(f.until)) {
			continue
		}
		if i, ok := seen[id]; ok {
			if !it.DueAt.After(now) {
				out[i].items = append(out[i].items, it)
			}
			continue
		}
		if it.DueAt.After(now) {
			// (A later item of a run due now is not "next" while that
			// run is fired; once its transaction ends it is.)
			if next.IsZero() {
				next = it.DueAt
			}
			continue
		}
		seen[id] = len(out)
		out = append(out, candidate{run: id, due: it.DueAt, failed: f != nil, items: []*store.QueueItem{it}})
	}
	return out, next
}

// chunk is the next fire transaction's runs, at most n of cs, their due
// timers read, and the due time of its earliest timer: a run that failed
// before goes alone.
func chunk(cs []candidate, n int) ([]string, []*store.QueueItem, time.Time) {
	if len(cs) == 0 {
		return nil, nil, time.Time{}
	}
	if cs[0].failed {
		return []string{cs[0].run}, cs[0].items, cs[0].due
	}
	var runs []string
	var items []*store.QueueItem
	for _, c := range cs {
		if len(runs) == n {
			break
		}
		if !c.failed {
			runs = append(runs, c.run)
			items = append(items, c.items...)
		}
	}
	return runs, items, cs[0].due
}

// mark records runs as being fired by a transaction that takes what is
// due at at (non-zero), or as fired now (zero; see firing).
func (t *timerLoop) mark(runs []string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range runs {
		if !at.IsZero() {
			t.firing[id] = -1
			t.firedAt[id] = at
		} else {
			t.firing[id] = t.reads
			if t.leftOut[id] {
				t.stale.Store(true)
			}
		}
	}
}

// settle records how a fire transaction of runs ended.
func (t *timerLoop) settle(runs []string, ok bool, now time.Time, maxHold time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range runs {
		if ok {
			delete(t.failed, id)
			continue
		}
		f := t.failed[id]
		if f == nil {
			f = &timerFailure{hold: timerRetry}
			t.failed[id] = f
		}
		f.until = now.Add(f.hold)
		f.hold = min(2*f.hold, maxHold)
	}
	// A run whose hold ended long ago and that was not seen since is
	// gone (finished, or fired by another node): forget it.
	for id, f := range t.failed {
		if v, busy := t.firing[id]; now.Sub(f.until) > maxHold && !(busy && v < 0) {
			delete(t.failed, id)
		}
	}
}

// skipped are the runs a read of due timers leaves out: those in a fire
// transaction and those held back after a failure. A read full of them
// found nothing to fire and waited for a transaction to end; runs held
// back end no transaction, so the timers due after them were never read
// (a run's expiry has no row to lease, so a failing one stays due).
// Runs in flight are left out only while they are few: each is a
// parameter of the read on SQLite.
func (t *timerLoop) skipped(now time.Time) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for id, f := range t.failed {
		if now.Before(f.until) {
			out = append(out, id)
		}
	}
	var busy []string
	for id, v := range t.firing {
		if v < 0 {
			busy = append(busy, id)
		}
	}
	if len(busy) <= maxSkipBusy {
		out = append(out, busy...)
	}
	return out
}

// maxSkipBusy bounds the runs in flight a read leaves out (see skipped).
const maxSkipBusy = 512

// nextRetry is the earliest end of a hold after now.
func (t *timerLoop) nextRetry(now time.Time) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var next time.Time
	for _, f := range t.failed {
		if f.until.After(now) && (next.IsZero() || f.until.Before(next)) {
			next = f.until
		}
	}
	return next, !next.IsZero()
}

// runTimers fires due timers until ctx ends, then waits for the fire
// transactions in flight.
//
// Each read looks timerLookahead ahead and is kept: the loop sleeps until
// the earliest item of it not yet fired and fires that when it is due,
// without reading first, so a timer waits for no read after its time,
// only for its transaction. It reads again half the look-ahead before the
// kept read runs out, when a commit queues a timer the read did not see
// (see timerLoop.queued), when a transaction ends of a run the read left
// out (it was in flight) or while a full read has nothing left to wait
// for, on a held run's retry and on the safety tick.
func (r *Runtime) runTimers(ctx context.Context) {
	t := r.timers
	var wg sync.WaitGroup
	defer wg.Wait()
	var (
		items    []*store.QueueItem // the kept read, earliest first
		read     int64              // its number (see beginRead)
		full     bool               // it was cut at shape.read
		horizon  time.Time          // it saw everything due before this
		lastRead time.Time          // when it began
		keep     bool               // the loop woke for what it keeps
	)
	for {
		// A lane first: what is due is read when it can be fired.
		select {
		case t.lanes <- struct{}{}:
		case <-ctx.Done():
			return
		}
		t.planned.Store(math.MaxInt64)
		now := r.clk.Now()
		if !keep {
			// Commits from here on that queue a timer due within the
			// read's window wake the loop again: the read may miss them.
			until := now.Add(timerLookahead)
			t.seen.Store(until.UnixNano())
			read = t.beginRead()
			var err error
			items, err = r.st.DueTimers(ctx, now, until, t.shape.read, t.skipped(now)...)
			if err != nil {
				items = nil
				t.seen.Store(0)
				<-t.lanes
				if ctx.Err() != nil {
					return
				}
				r.log.Error("reading due timers failed", "err", err)
				r.sleepTimers(ctx, now, false, time.Time{}, false)
				continue
			}
			lastRead, horizon, full = now, until, len(items) == t.shape.read
			if full {
				// Nothing after the last item read was seen.
				horizon = items[len(items)-1].DueAt
				t.seen.Store(horizon.UnixNano())
			}
			now = r.clk.Now() // what came due while reading is fired now
		}
		// Share what is due among the free lanes (this one included), so
		// a burst goes out as several transactions at once.
		cands, next := t.candidates(items, now, read)
		free := cap(t.lanes) - len(t.lanes) + 1
		runs, due, oldest := chunk(cands, min(max((len(cands)+free-1)/free, 1), t.shape.chunk))
		if len(runs) == 0 {
			<-t.lanes
			// Nothing due now that is not being fired or held back.
			// The read is read again half the look-ahead before it runs
			// out, so that what comes due after it is kept in time.
			refresh := horizon.Add(-timerLookahead / 2)
			switch {
			case full && next.IsZero():
				// More may be due behind a full read: look again when
				// a transaction ends.
				keep = r.sleepTimers(ctx, lastRead, true, time.Time{}, false)
			case next.IsZero() && !refresh.After(now) && keep:
				keep = false // all of it fired and it is old: read again
			case next.IsZero():
				keep = r.sleepTimers(ctx, lastRead, false, time.Time{}, false)
			case next.After(refresh) && refresh.After(now):
				keep = r.sleepTimers(ctx, lastRead, false, refresh, false)
			default:
				// (Also when the read took so long that its refresh has
				// passed: the kept item is fired first, then it reads.)
				keep = r.sleepTimers(ctx, lastRead, false, next, true)
			}
			continue
		}
		keep = true // the next turn fires what else is due, unread
		t.mark(runs, now)
		late := now.Sub(oldest) > timerSlack
		if late {
			// Timers come before new runs and reports (see
			// Runtime.yield).
			r.yield.hold()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := r.fireTimers(ctx, runs, due)
			if late {
				r.yield.release()
			}
			if ctx.Err() == nil {
				t.settle(runs, ok, r.clk.Now(), r.cfg.Lease)
			}
			t.mark(runs, time.Time{})
			<-t.lanes
			signal(t.ended)
		}()
	}
}

// sleepTimers waits, and tells whether the loop may go on with the read
// it keeps: until at (when non-zero; forKept says it is when the next
// item of that read is due: yes, else a refresh: no) or, with at zero,
// the next timer not read (no); until a transaction ends (yes, unless
// busy: the read was cut and more may be due behind it; or the run ended
// was left out of the read, so it lacks that run's other timers); until
// a held run's retry, a commit that queues a timer the loop must see, or
// the safety tick (no). With busy it waits only for a wake-up (a
// transaction in flight will end).
func (r *Runtime) sleepTimers(ctx context.Context, after time.Time, busy bool, at time.Time, forKept bool) bool {
	t := r.timers
	wait := r.cfg.SafetyTick
	if busy {
		forKept = false
	} else {
		now := r.clk.Now()
		switch {
		case !at.IsZero():
			// A kept item or a refresh: the read saw everything due
			// before it that was committed before it; what was
			// committed since wakes the loop (timerLoop.queued).
			wait = min(wait, at.Sub(now))
		default:
			// Deciding: every commit that queues a timer wakes the
			// loop until the plan is set, so one committed after
			// NextDue read is seen.
			next, ok, err := r.st.NextDue(ctx, after, store.TimerKinds...)
			if err != nil && ctx.Err() == nil {
				r.log.Warn("next timer failed", "err", err)
			}
			now = r.clk.Now()
			if ok {
				var look time.Time
				switch {
				case next.After(after.Add(timerLookahead)):
					// Beyond the last read: read again half the
					// look-ahead before it is due, so that it is kept
					// and fired unread when it is.
					look = next.Add(-timerLookahead / 2)
				case next.After(now):
					// Read over but not kept: a lease that ends then.
					look = next
				default:
					// Read over, due, and not firable: in a transaction
					// (whose end makes the loop read again, its run
					// having been left out) or a lease that ended since
					// the read. Look again after a while, not at once,
					// or the loop would spin on it.
					look = now.Add(timerLookahead)
				}
				wait = min(wait, look.Sub(now))
			}
		}
		if retry, ok := t.nextRetry(now); ok && retry.Sub(now) < wait {
			wait, forKept = retry.Sub(now), false
		}
		if wait <= 0 {
			return forKept
		}
		t.planned.Store(now.Add(wait).UnixNano())
	}
	tm := r.clk.NewTimer(wait)
	defer tm.Stop()
	select {
	case <-ctx.Done():
	case <-t.wake:
	case <-t.ended:
		return !busy && !t.stale.Load()
	case <-tm.C():
		return forKept
	}
	return false
}

// firedTimer is a timer a fire transaction applied, and how late.
type firedTimer struct {
	kind string
	late time.Duration
}

// fireTimers applies the due timers of runs in one transaction and tells
// whether it committed; read is what the loop read of them.
func (r *Runtime) fireTimers(ctx context.Context, runs []string, read []*store.QueueItem) bool {
	// Once queued, the transaction runs even if ctx ends (shutdown): its
	// decisions must not fail half-way for that, or the timer would be
	// held for a lease.
	wctx := context.WithoutCancel(ctx)
	var expired []string
	var fired []firedTimer // for the observer, once committed
	of := r.newOffer()     // the steps that follow go to waiting claims
	_, errs, err := r.st.FireTimers(ctx, runs, read, r.clk.Now(), r.cfg.Lease, func(it *store.QueueItem, tx store.RunTx) error {
		if it == nil {
			// The store decides again (store.Store.FireTimers): what
			// the decision before lent and noted is not committed.
			of.restart()
			expired, fired = expired[:0], fired[:0]
			return nil
		}
		late := r.clk.Now().Sub(it.DueAt)
		var applied bool
		var err error
		switch it.Kind {
		case store.KindWake:
			applied, err = r.timerTx(wctx, tx, it, status.StepSleeping, status.StepSuccess, "step_succeeded", "", of)
		case store.KindWaitTimeout:
			applied, err = r.timerTx(wctx, tx, it, status.StepWaiting, status.StepTimeout, "step_timeout", "no callback before the timeout", of)
		case store.KindRunExpire:
			expired = append(expired, it.RunID)
			applied, err = r.expireTx(wctx, tx)
		default:
			err = fmt.Errorf("unknown queue item kind %q", it.Kind)
		}
		if err == nil && applied {
			fired = append(fired, firedTimer{it.Kind, late})
		}
		return err
	})
	if err == nil {
		// Before the steps that follow are handed out: whoever sees them
		// done sees their timers counted.
		for _, f := range fired {
			r.cfg.Observer.TimerFired(f.kind, max(f.late, 0))
		}
	}
	of.settle(err)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Error("firing due timers failed; their runs are retried later, one per transaction", "err", err, "runs", len(runs))
		}
		return false
	}
	for _, err := range errs {
		r.log.Error("timer failed; retried after the lease", "err", err)
	}
	for _, id := range expired {
		r.abortRun(id)
	}
	return true
}
