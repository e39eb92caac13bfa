package runtime

import (
	"sync"
	"testing"

	"github.com/ferryhq/ferry/internal/store"
)

// TestReportsOfOneRunShareALane: with keyed lanes, every report of a task
// this runtime handed out goes to its run's lane, whatever the task, and
// reports spread over the lanes; without a key every lane takes from one
// queue.
func TestReportsOfOneRunShareALane(t *testing.T) {
	r := &Runtime{}
	b := newBatcher(make(chan struct{}), &sync.WaitGroup{}, r.reportLane, func(b []*reportReq) []*reportReq { return nil })
	if len(b.lanes) != batchLanes {
		t.Fatalf("%d lanes, want %d", len(b.lanes), batchLanes)
	}
	var tasks []*store.Task
	for _, id := range []string{"t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8"} {
		tasks = append(tasks, &store.Task{ID: id, RunID: "run-a"})
	}
	r.handedOut(tasks)
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
	r.handedOut(solo)
	used = map[chan *reportReq]bool{}
	for _, tk := range solo {
		used[b.lane(&reportReq{id: tk.ID})] = true
	}
	if len(used) != batchLanes {
		t.Errorf("64 standalone tasks handed out used %d of %d lanes", len(used), batchLanes)
	}
	shared := newBatcher(make(chan struct{}), &sync.WaitGroup{}, nil, func(b []*triggerReq) []*triggerReq { return nil })
	if len(shared.lanes) != 1 {
		t.Errorf("an unkeyed batcher has %d queues, want 1 shared", len(shared.lanes))
	}
	// SQLite applies writes in turn: its reports share one queue.
	if sq, _, _ := newInternal(t); len(sq.reports.lanes) != 1 {
		t.Errorf("on SQLite reports have %d queues, want 1 shared", len(sq.reports.lanes))
	}
}
