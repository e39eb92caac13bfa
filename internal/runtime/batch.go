package runtime

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ferryhq/ferry/internal/clock"
)

// Writes that arrive together are applied together: reports of workers
// (complete, fail) and triggers wait while a batch is being written and go
// into the next one, a single transaction. Each request is still checked,
// applied and answered on its own (a failing one drops only its own
// writes), and nothing is answered before its batch commits. Under load a
// transaction per request becomes a transaction per batch; alone, a request
// is written at once.
const (
	maxBatch = 128
	// batchLanes is how many batches of a kind may be in flight at once:
	// while one commits the next fills. On Postgres they also use more
	// connections.
	batchLanes = 2
	// serialReportLoops is how many report batches may be in flight at
	// once with one writer (SQLite), where they are not transactions side
	// by side but groups of the writer's, each answered once its group is
	// synced: with a third, one batch fills while another is written and
	// the third waits for its sync (thirty-third pass: chain10 +2.7 to
	// +5.3 % runs a second, the machine's CPU a run −4.8 to −9.2 %; four
	// were worse than three). On Postgres three lanes were worse (chain10
	// −10 %): there each is a transaction beside the others.
	serialReportLoops = 3
	// Where every batch is a transaction of its own (Postgres), a report
	// loop that can expect more than one request (see below) waits up to
	// flushWindow for its batch to hold as many as it expects, at most
	// flushSize, before writing it. At 16
	// handlers in chain10 the lanes wrote ≈3.6 reports a batch, each
	// batch's round trips, statements and commit shared by few steps;
	// waiting made the machine do less per step, and the hand-off came
	// down with it (2.2–2.5 → 1.6–2.0 ms p50, 550–630 → 640–800 runs/s).
	// A lone request is written at once. (SQLite's single writer already
	// makes one group of whatever is queued.)
	//
	// What is likely to come soon: the requests of the last batch (their
	// callers were answered when it committed, and a handler that reports
	// and takes its next step of the same run at once is back, on the
	// same lane, within a fraction of a millisecond) and those waiting
	// when it was answered. Reports of unrelated tasks land on either
	// lane, so a lane may expect more than come; it then waits out the
	// window, never longer than before.
	//
	// Waiting for flushSize whatever the load made every batch of fewer
	// handlers wait out the whole window: chain10 at 8 handlers ran at
	// 400–420 runs/s with a 1.9 ms hand-off, against 720–730 and 0.9 ms
	// when a batch waits for those it can expect (twentieth pass). And
	// waiting only after a batch of several (rather than whenever several
	// can be expected) left two handlers on one lane writing one report
	// each, in turn: 240–266 runs/s against 293–341 at 2 handlers,
	// 396–439 against 463–506 at 4.
	flushWindow = 500 * time.Microsecond
	flushSize   = 8
)

var errClosed = errors.New("runtime closed")

// request is one write waiting for its batch.
type request interface {
	context() context.Context
	fail(err error) // sets the caller's error
	finish()        // answers the caller
}

type batcher[R request] struct {
	// lanes are the queues; with key nil there is one, shared by every
	// loop, else one per loop and a request goes to the lane its key
	// names.
	lanes []chan R
	loops int // loops taking from lanes, at least one per lane
	key   func(R) uint64
	apply func(batch []R) (retry []R)
	once  sync.Once
	wg    *sync.WaitGroup
	stop  <-chan struct{}
	// mu orders submissions before shutting: a request sent before shut
	// is in reqs when the lanes see stop, and they drain it.
	mu     sync.RWMutex
	closed bool
	// window and size: see flushWindow (zero window: no wait).
	window time.Duration
	size   int
	// expected, if set (tests), is called by a loop once it has counted
	// the requests its next batch can expect.
	expected func(n int)
}

// coalesce makes loops under load wait up to window for a batch to hold
// the requests they can expect, at most size (see flushWindow). It is set
// before the first request.
func (b *batcher[R]) coalesce(window time.Duration, size int) {
	b.window, b.size = window, size
}

// newBatcher batches requests for apply, with loops batches in flight at
// once. With key set, requests with the same key always go to the same
// lane, one a loop: reports of one run then never wait in one lane's
// transaction for the run lock that the other lane's holds (on Postgres,
// lanes are concurrent transactions), and a run's parallel steps finish in
// one batch. Without, every loop takes from one shared lane.
func newBatcher[R request](stop <-chan struct{}, wg *sync.WaitGroup, loops int, key func(R) uint64, apply func([]R) []R) *batcher[R] {
	b := &batcher[R]{key: key, apply: apply, wg: wg, stop: stop, loops: loops}
	n := 1
	if key != nil {
		n = loops
	}
	for range n {
		b.lanes = append(b.lanes, make(chan R, 4*maxBatch))
	}
	return b
}

func (b *batcher[R]) lane(q R) chan R {
	if b.key == nil {
		return b.lanes[0]
	}
	return b.lanes[b.key(q)%uint64(len(b.lanes))]
}

// do submits q and waits for its answer. It waits even if q's context ends
// once q is submitted: q may be in a transaction already, and the caller
// must learn whether it committed.
func (b *batcher[R]) do(q R, done <-chan struct{}) error {
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return errClosed
	}
	b.once.Do(func() { // under the read lock: before any Close waits
		for i := range b.loops {
			b.wg.Add(1)
			go b.loop(b.lanes[i%len(b.lanes)])
		}
	})
	select {
	case b.lane(q) <- q:
	case <-q.context().Done():
		b.mu.RUnlock()
		return q.context().Err()
	}
	b.mu.RUnlock()
	<-done
	return nil
}

// shut refuses new requests; the lanes drain the rest once stop closes.
func (b *batcher[R]) shut() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
}

func (b *batcher[R]) loop(reqs chan R) {
	defer b.wg.Done()
	var carry []R // to retry: they shared a run or key with another request
	expect := 0   // requests the next batch can expect (see flushWindow)
	for {
		batch := carry
		carry = nil
		if len(batch) == 0 {
			select {
			case q := <-reqs:
				batch = append(batch, q)
			case <-b.stop:
				b.drain(reqs)
				return
			}
		}
		if b.window > 0 && expect > 1 {
			batch = b.await(reqs, batch, min(b.size, expect))
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case q := <-reqs:
				batch = append(batch, q)
			default:
				break fill
			}
		}
		n := len(batch)
		carry = b.apply(batch)
		// The callers it answered and the requests waiting now; those
		// carried over count once either way, so this is the batch plus
		// the queue. A caller that is back already is counted twice: the
		// batch then waits out the window, never longer than before.
		expect = n + len(reqs)
		if b.expected != nil {
			b.expected(expect)
		}
	}
}

// await adds requests to batch until it holds size or b.window has
// passed. The window is the machine's time, not the runtime's clock: it
// is a fraction of a millisecond of coalescing, not a due time, and a
// test's stopped clock must not hold writes.
func (b *batcher[R]) await(reqs chan R, batch []R, size int) []R {
	if len(batch) >= size {
		return batch
	}
	t := time.NewTimer(b.window)
	defer t.Stop()
	for len(batch) < size {
		select {
		case q := <-reqs:
			batch = append(batch, q)
		case <-t.C:
			return batch
		case <-b.stop:
			return batch
		}
	}
	return batch
}

// drain answers what is still queued when the runtime closes: nothing will
// write it.
func (b *batcher[R]) drain(reqs chan R) {
	for {
		select {
		case q := <-reqs:
			q.fail(errClosed)
			q.finish()
		default:
			return
		}
	}
}

// yieldBound bounds how long a trigger or report batch waits for late
// timers.
const yieldBound = 50 * time.Millisecond

// yieldGate lets trigger and report batches wait while late timers are
// written: it is closed while any hold is in place. (A gate that let a
// batch wait only for the holds in place when it arrived was measured and
// dropped: it let reports through between overlapping fire transactions,
// and Postgres `sleep` lateness doubled.)
type yieldGate struct {
	mu   sync.Mutex
	n    int
	open chan struct{} // nil: nothing to wait for; closed by the last release
}

func (g *yieldGate) hold() {
	g.mu.Lock()
	if g.n == 0 {
		g.open = make(chan struct{})
	}
	g.n++
	g.mu.Unlock()
}

func (g *yieldGate) release() {
	g.mu.Lock()
	g.n--
	if g.n == 0 {
		close(g.open)
		g.open = nil
	}
	g.mu.Unlock()
}

// wait returns when no late timers are being written, or after at most d.
func (g *yieldGate) wait(clk clock.Clock, d time.Duration) {
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	if ch == nil {
		return
	}
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C():
	}
}

// Close stops the batchers after the batches in flight; the store is closed
// by its owner afterwards.
func (r *Runtime) Close() {
	r.closeOnce.Do(func() {
		r.reports.shut()
		r.triggers.shut()
		r.bulkMu.Lock() // waits for batch triggers in flight
		r.bulkClosed = true
		r.bulkMu.Unlock()
		close(r.closed)
	})
	r.batchWG.Wait()
}
