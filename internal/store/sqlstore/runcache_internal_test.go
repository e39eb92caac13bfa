package sqlstore

import (
	"fmt"
	"testing"
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
