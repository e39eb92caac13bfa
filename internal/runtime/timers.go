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
// The loop reads what is due (no locks), takes the runs not already being
// fired, and fires them in a transaction of their own while it goes on
// reading: up to timerLanes transactions at once, each with a share of
// what is due. Under a burst many small transactions are in flight, so a
// timer waits for one transaction, not for a batch of a thousand; alone, a
// timer is fired the moment it is due. A timer's step records the moment
// its transaction applied it, so lateness is measured where it happens.
//
// With one writer (SQLite) transactions do not run side by side: two lanes
// (one being written, one waiting for its disk sync) and chunks as large as
// what is due, since a large transaction costs less per timer there.
const (
	// timerSlack is how late timers may run before new triggers give way.
	timerSlack = 10 * time.Millisecond
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
	wake  chan struct{}
	// planned is when the loop will next look (Unix ns; MaxInt64 while it
	// is deciding): commits that queue a timer due earlier wake it.
	planned atomic.Int64
	lanes   chan struct{}
	mu      sync.Mutex
	firing  map[string]bool // runs in a fire transaction now
}

func newTimerLoop(shape timerShape) *timerLoop {
	t := &timerLoop{shape: shape, wake: make(chan struct{}, 1), lanes: make(chan struct{}, shape.lanes), firing: map[string]bool{}}
	t.planned.Store(math.MaxInt64)
	return t
}

func (t *timerLoop) nudge() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// pick returns the runs of due items that are not being fired, in due
// order, and the due time of the earliest.
func (t *timerLoop) pick(items []*store.QueueItem) ([]string, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var runs []string
	var oldest time.Time
	seen := map[string]bool{}
	for _, it := range items {
		if t.firing[it.RunID] || seen[it.RunID] {
			continue
		}
		seen[it.RunID] = true
		if len(runs) == 0 {
			oldest = it.DueAt
		}
		runs = append(runs, it.RunID)
	}
	return runs, oldest
}

func (t *timerLoop) mark(runs []string, on bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range runs {
		if on {
			t.firing[id] = true
		} else {
			delete(t.firing, id)
		}
	}
}

// runTimers fires due timers until ctx ends, then waits for the fire
// transactions in flight.
func (r *Runtime) runTimers(ctx context.Context) {
	t := r.timers
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		// A lane first: what is due is read when it can be fired.
		select {
		case t.lanes <- struct{}{}:
		case <-ctx.Done():
			return
		}
		t.planned.Store(math.MaxInt64)
		now := r.clk.Now()
		items, err := r.st.DueTimers(ctx, now, t.shape.read)
		if err != nil {
			<-t.lanes
			if ctx.Err() != nil {
				return
			}
			r.log.Error("reading due timers failed", "err", err)
			r.sleepTimers(ctx, now, false)
			continue
		}
		runs, oldest := t.pick(items)
		if len(runs) == 0 {
			<-t.lanes
			// Everything read is being fired. With a full read there may
			// be more due behind it: look again when a transaction ends.
			r.sleepTimers(ctx, now, len(items) == t.shape.read)
			continue
		}
		// Share what is due among the free lanes (this one included), so
		// a burst goes out as several transactions at once.
		free := cap(t.lanes) - len(t.lanes) + 1
		n := min(max((len(runs)+free-1)/free, 1), t.shape.chunk)
		chunk := runs[:n]
		t.mark(chunk, true)
		late := now.Sub(oldest) > timerSlack
		if late {
			// Timers come before new runs (see Runtime.yield).
			r.yield.hold()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.fireTimers(ctx, chunk)
			if late {
				r.yield.release()
			}
			t.mark(chunk, false)
			<-t.lanes
			t.nudge() // more may be due behind this chunk
		}()
	}
}

// sleepTimers waits until the next timer is due after `after`, a commit
// queues an earlier one, a fire transaction ends, or the safety tick. With
// busy it waits only for a wake-up (a transaction in flight will end).
func (r *Runtime) sleepTimers(ctx context.Context, after time.Time, busy bool) {
	t := r.timers
	wait := r.cfg.SafetyTick
	if !busy {
		// Deciding: every commit that queues a timer wakes the loop until
		// the plan is set, so one committed after NextDue read is seen.
		next, ok, err := r.st.NextDue(ctx, after, store.TimerKinds...)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("next timer failed", "err", err)
		}
		if ok {
			wait = min(wait, next.Sub(r.clk.Now()))
		}
		if wait <= 0 {
			return
		}
		t.planned.Store(r.clk.Now().Add(wait).UnixNano())
	}
	tm := r.clk.NewTimer(wait)
	defer tm.Stop()
	select {
	case <-ctx.Done():
	case <-t.wake:
	case <-tm.C():
	}
}

// fireTimers applies the due timers of runs in one transaction.
func (r *Runtime) fireTimers(ctx context.Context, runs []string) {
	var expired []string
	_, errs, err := r.st.FireTimers(ctx, runs, r.clk.Now(), r.cfg.Lease, func(it *store.QueueItem, tx store.RunTx) error {
		switch it.Kind {
		case store.KindWake:
			return r.timerTx(ctx, tx, it, status.StepSleeping, status.StepSuccess, "step_succeeded", "")
		case store.KindWaitTimeout:
			return r.timerTx(ctx, tx, it, status.StepWaiting, status.StepTimeout, "step_timeout", "no callback before the timeout")
		case store.KindRunExpire:
			expired = append(expired, it.RunID)
			return r.expireTx(ctx, tx)
		}
		return fmt.Errorf("unknown queue item kind %q", it.Kind)
	})
	if err != nil {
		if ctx.Err() == nil {
			r.log.Error("firing due timers failed", "err", err, "runs", len(runs))
		}
		return
	}
	for _, err := range errs {
		r.log.Error("timer failed; retried after the lease", "err", err)
	}
	for _, id := range expired {
		r.abortRun(id)
	}
}
