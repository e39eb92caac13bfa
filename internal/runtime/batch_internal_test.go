package runtime

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/testwait"
)

// TestReportsOfOneRunShareALane: with keyed lanes, every report of a task
// this runtime handed out goes to its run's lane, whatever the task, and
// reports spread over the lanes; without a key every lane takes from one
// queue.
func TestReportsOfOneRunShareALane(t *testing.T) {
	r := &Runtime{clk: clock.Real{}, cfg: Config{Observer: noObserver{}, Tracer: noTracer{}}}
	b := newBatcher(make(chan struct{}), &sync.WaitGroup{}, batchLanes, r.reportLane, func(b []*reportReq) []*reportReq { return nil })
	if len(b.lanes) != batchLanes {
		t.Fatalf("%d lanes, want %d", len(b.lanes), batchLanes)
	}
	var tasks []*store.Task
	for _, id := range []string{"t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8"} {
		tasks = append(tasks, &store.Task{ID: id, RunID: "run-a"})
	}
	r.handedOut(t.Context(), tasks, nil)
	lane := b.lane(&reportReq{id: "t1"})
	for _, tk := range tasks {
		if b.lane(&reportReq{id: tk.ID}) != lane {
			t.Fatalf("task %s of run-a went to another lane than t1", tk.ID)
		}
	}
	used := map[chan *reportReq]bool{}
	for i := range 64 {
		used[b.lane(&reportReq{id: string(rune('A' + i))})] = true
	}
	if len(used) != batchLanes {
		t.Errorf("64 unrelated tasks used %d of %d lanes", len(used), batchLanes)
	}
	// Standalone tasks handed out (no run) are keyed by their own ids,
	// not all by the empty run.
	var solo []*store.Task
	for i := range 64 {
		solo = append(solo, &store.Task{ID: "solo" + string(rune('A'+i))})
	}
	r.handedOut(t.Context(), solo, nil)
	used = map[chan *reportReq]bool{}
	for _, tk := range solo {
		used[b.lane(&reportReq{id: tk.ID})] = true
	}
	if len(used) != batchLanes {
		t.Errorf("64 standalone tasks handed out used %d of %d lanes", len(used), batchLanes)
	}
	shared := newBatcher(make(chan struct{}), &sync.WaitGroup{}, batchLanes, nil, func(b []*triggerReq) []*triggerReq { return nil })
	if len(shared.lanes) != 1 {
		t.Errorf("an unkeyed batcher has %d queues, want 1 shared", len(shared.lanes))
	}
	// SQLite applies writes in turn: its reports share one queue.
	if sq, _, _ := newInternal(t); len(sq.reports.lanes) != 1 {
		t.Errorf("on SQLite reports have %d queues, want 1 shared", len(sq.reports.lanes))
	}
}

// TestSerialReportsHaveThreeBatchesInFlight: with one writer (SQLite),
// the reports' shared queue is taken by serialReportLoops loops, so that
// many batches are being written or synced at once and no more: a batch
// fills while others wait for the writer.
func TestSerialReportsHaveThreeBatchesInFlight(t *testing.T) {
	sq, _, _ := newInternal(t)
	if sq.reports.loops != serialReportLoops {
		t.Fatalf("on SQLite the reports have %d loops, want %d", sq.reports.loops, serialReportLoops)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	gate := make(chan struct{})
	var mu sync.Mutex
	inFlight, most := 0, 0
	b := newBatcher(stop, &wg, serialReportLoops, nil, func(batch []*triggerReq) []*triggerReq {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		<-gate
		mu.Lock()
		inFlight--
		mu.Unlock()
		for _, q := range batch {
			q.finish()
		}
		return nil
	})
	// The gate opens before the loops are stopped, also when the test
	// fails while they are held.
	open := sync.OnceFunc(func() { close(gate) })
	defer func() { open(); close(stop); wg.Wait() }()
	held := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return inFlight, len(b.lanes[0])
	}
	submit := func(i int) {
		q := &triggerReq{ctx: t.Context(), run: &store.Run{ID: fmt.Sprint(i)}, done: make(chan struct{})}
		go func() { _ = b.do(q, q.done) }()
	}
	// One at a time, each taken by a loop of its own while the others'
	// batches are held.
	for i := range serialReportLoops {
		submit(i)
		testwait.Until(t, 10*time.Second, fmt.Sprintf("%d batches in flight", i+1), func() bool {
			f, q := held()
			return f == i+1 && q == 0
		})
	}
	// With every loop busy, more requests queue: no other loop takes them.
	submit(serialReportLoops)
	submit(serialReportLoops + 1)
	testwait.Until(t, 10*time.Second, "two requests queued behind the loops", func() bool {
		f, q := held()
		return f == serialReportLoops && q == 2
	})
	open()
	testwait.Until(t, 10*time.Second, "the queue taken once the batches end", func() bool {
		_, q := held()
		return q == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if most != serialReportLoops {
		t.Errorf("%d batches in flight at most, want %d", most, serialReportLoops)
	}
}

// TestBatchUnderLoadWaitsForMore: with a flush window, a lone request is
// written at once, and a loop that can expect several waits for its next
// batch to hold them (here: the window is an hour, so only the count can
// end the wait) instead of writing its first request alone: the last
// batch's (their callers come back) and those already waiting when it
// was answered, at most the size set.
func TestBatchUnderLoadWaitsForMore(t *testing.T) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	gate := make(chan struct{})
	applied := make(chan []string, 8)
	// Keyed, every request to the first lane: one loop, one queue.
	b := newBatcher(stop, &wg, batchLanes, func(*triggerReq) uint64 { return 0 }, func(batch []*triggerReq) []*triggerReq {
		var names []string
		for _, q := range batch {
			names = append(names, q.run.ID)
			q.finish()
		}
		applied <- names
		<-gate
		return nil
	})
	b.coalesce(time.Hour, 3)
	// Each expectation as the loop counts it: a request submitted before
	// the count would be counted as waiting.
	counted := make(chan int, 8)
	b.expected = func(n int) { counted <- n }
	defer func() { close(gate); close(stop); wg.Wait() }()
	submit := func(id string) chan struct{} {
		q := &triggerReq{ctx: t.Context(), run: &store.Run{ID: id}, done: make(chan struct{})}
		go func() { _ = b.do(q, q.done) }()
		return q.done
	}
	next := func(want ...string) {
		t.Helper()
		select {
		case got := <-applied:
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("batch %v, want %v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no batch applied within 10s, want %v", want)
		}
	}
	queued := func(n int) {
		t.Helper()
		testwait.Until(t, 10*time.Second, fmt.Sprintf("%d requests queued", n), func() bool { return len(b.lanes[0]) == n })
	}
	// release lets the batch being written commit and waits until the
	// loop has counted what its next batch can expect.
	release := func(want int) {
		t.Helper()
		gate <- struct{}{}
		select {
		case n := <-counted:
			if n != want {
				t.Fatalf("the loop expects %d requests, want %d", n, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the loop did not count its next batch within 10s")
		}
	}
	// A lone request goes at once, though the window is an hour, and so
	// does the next when nothing else came meanwhile.
	submit("a")
	next("a")
	release(1)
	submit("b")
	next("b")
	// While b is written, c queues: b's caller will be back, so c waits
	// for it rather than going alone (two handlers would otherwise write
	// one report each, in turn).
	submit("c")
	queued(1)
	release(2)
	queued(0)
	submit("d")
	next("c", "d")
	// Two came and none is waiting: e waits for one more, and only one.
	release(2)
	submit("e")
	queued(0)
	submit("f")
	next("e", "f")
	// Never more than the size set: while e and f are written, g and h
	// queue; two callers back and two waiting make four, but g and h wait
	// for one more, not two.
	submit("g")
	submit("h")
	queued(2)
	release(4)
	queued(0)
	submit("i")
	next("g", "h", "i")
	gate <- struct{}{}
}
