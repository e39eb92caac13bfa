package sqlstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// checkBounded fails unless b's byte count is the sum of what its entries
// were kept at and both bounds hold.
func checkBounded(t *testing.T, b *bounded, what string) {
	t.Helper()
	sum := 0
	for _, e := range b.m {
		sum += e.size
	}
	if sum != b.by {
		t.Fatalf("%s: byte count %d, entries sum to %d", what, b.by, sum)
	}
	if len(b.m) > b.max || b.by > b.maxBytes {
		t.Fatalf("%s: %d entries, %d bytes: over the bounds %d, %d", what, len(b.m), b.by, b.max, b.maxBytes)
	}
}

// TestBoundedCacheForgetsOldestFirst: beyond its count the cache forgets
// the entries kept longest ago, an entry kept again counting from then,
// and what it remembers of the order stays within a small multiple of its
// entries however often they are kept again.
func TestBoundedCacheForgetsOldestFirst(t *testing.T) {
	b := newBounded(4, 1<<20)
	for i := range 4 {
		b.keep(fmt.Sprint(i), &cachedRun{size: 1})
	}
	b.keep("0", &cachedRun{size: 1}) // 0 kept again: 1 is now the oldest
	b.keep("4", &cachedRun{size: 1})
	b.keep("5", &cachedRun{size: 1})
	for id, want := range map[string]bool{"0": true, "1": false, "2": false, "3": true, "4": true, "5": true} {
		if got := b.get(id) != nil; got != want {
			t.Errorf("entry %s cached = %v, want %v", id, got, want)
		}
	}
	for i := range 10000 {
		b.keep(fmt.Sprint(i%3), &cachedRun{size: 1})
		checkBounded(t, &b, fmt.Sprintf("after %d entries kept again", i+1))
	}
	if n := len(b.order) - b.head; n > 2*len(b.m)+64 {
		t.Errorf("the order holds %d items for %d entries", n, len(b.m))
	}
	if b.get("5") == nil || b.get("3") != nil {
		t.Errorf("after 0, 1 and 2 were kept again: 5 cached %v, 3 cached %v; want 5 (kept after 3), not 3", b.get("5") != nil, b.get("3") != nil)
	}
	// New entries beyond the count, each forgetting the oldest.
	for i := range 10000 {
		b.keep(fmt.Sprint("new", i), &cachedRun{size: 1})
	}
	if n := cap(b.order); n > 4*(2*len(b.m)+64) {
		t.Errorf("after 10,000 entries beyond the count the order's array holds %d items for %d entries", n, len(b.m))
	}
}

// TestBoundedCacheEdges: forgetting a run not cached changes nothing; an
// entry larger than the whole byte budget is kept alone, every other
// entry forgotten, and the next entry kept replaces it.
func TestBoundedCacheEdges(t *testing.T) {
	b := newBounded(4, 1000)
	b.keep("a", &cachedRun{size: 100})
	b.keep("missing", nil)
	checkBounded(t, &b, "after forgetting a run not cached")
	if len(b.m) != 1 || b.get("a") == nil {
		t.Fatalf("entries %v, want a alone", b.m)
	}
	b.keep("huge", &cachedRun{size: 5000})
	if len(b.m) != 1 || b.get("huge") == nil || b.by != 5000 {
		t.Fatalf("after an entry over the budget: %d entries, %d bytes, huge cached %v; want it alone", len(b.m), b.by, b.get("huge") != nil)
	}
	b.keep("b", &cachedRun{size: 100})
	checkBounded(t, &b, "after an entry within the budget")
	if b.get("huge") != nil || b.get("b") == nil {
		t.Fatalf("huge cached %v, b cached %v; want b, not huge", b.get("huge") != nil, b.get("b") != nil)
	}
}

// TestBoundedCache: the run caches stay within their count and byte
// bounds, evicting to make room, and count each entry at the size it was
// kept at even when the entry is changed afterwards (the SQLite cache lays
// a request's writes over an entry still in the map).
func TestBoundedCache(t *testing.T) {
	b := newBounded(4, 1000)
	for i := range 10 {
		b.keep(fmt.Sprint(i), &cachedRun{size: 100})
		checkBounded(t, &b, fmt.Sprintf("after %d small entries", i+1))
	}
	if len(b.m) != 4 {
		t.Fatalf("%d entries, want the count bound 4", len(b.m))
	}
	// Large entries: the byte bound evicts before the count bound.
	b.keep("big1", &cachedRun{size: 600})
	b.keep("big2", &cachedRun{size: 600})
	checkBounded(t, &b, "after two large entries")
	if b.get("big2") == nil {
		t.Fatal("the entry just kept was evicted")
	}
	// An entry changed in place, then kept again: the old size leaves.
	e := b.get("big2")
	e.size = 50
	b.keep("big2", e)
	checkBounded(t, &b, "after re-keeping a changed entry")
	b.keep("big2", nil)
	checkBounded(t, &b, "after forgetting an entry")
	if b.get("big2") != nil {
		t.Fatal("a forgotten entry is still there")
	}
	b.reset()
	checkBounded(t, &b, "after reset")
	if len(b.m) != 0 || b.by != 0 {
		t.Fatalf("reset left %d entries, %d bytes", len(b.m), b.by)
	}
}

// TestTaskCacheFollowsRequests: SQLite's writer caches what a request wrote
// of leased tasks only once the request succeeded (a failed one rolled its
// rows back), shows it to the group's later requests, keeps it when the
// group commits, forgets a task written finished or cancelled by id, and
// forgets everything on reset.
func TestTaskCacheFollowsRequests(t *testing.T) {
	c := newRunCache()
	until := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	leased := func(id string) *store.Task {
		return &store.Task{ID: id, Type: "x", Status: status.TaskLeased, LeaseToken: "tok", LeaseUntil: &until}
	}
	c.pendTasks(&changeset{newTasks: []*store.Task{leased("failed")}})
	c.endRequest(false)
	c.pendTasks(&changeset{newTasks: []*store.Task{leased("a"), leased("b"), leased("c")}})
	c.endRequest(true)
	if c.task("failed") != nil {
		t.Error("a failed request's task is cached")
	}
	if e := c.task("a"); e == nil || e.seq != 2 || e.task.LeaseToken != "tok" {
		t.Fatalf("staged task a = %+v, want it leased at seq 2 (created and claimed)", e)
	}
	c.commit()
	done := leased("a")
	done.Status, done.LeaseUntil = status.TaskSucceeded, nil
	c.pendTasks(&changeset{tasks: []*taskTx{{task: done, seq: 3}}, cancel: []cancelTasks{{ids: []string{"b"}}}})
	c.endRequest(true)
	if c.task("a") != nil || c.task("b") != nil {
		t.Error("a task written finished or cancelled is still cached")
	}
	c.commit()
	if c.task("a") != nil || c.task("b") != nil || c.task("c") == nil {
		t.Errorf("after the commit: a %v, b %v, c %v; want only c", c.task("a"), c.task("b"), c.task("c"))
	}
	c.reset()
	if c.task("c") != nil {
		t.Error("reset kept a task")
	}
}
