package sqlstore

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// pendingOf is a commit that made tasks of these types pending.
func pendingOf(types ...string) *changeset {
	cs := &changeset{}
	for _, t := range types {
		cs.newTasks = append(cs.newTasks, &store.Task{Type: t, Status: status.TaskPending})
	}
	return cs
}

// reader is a read of the pending types that counts its calls.
type reader struct {
	types  []string
	err    error
	during func() // runs inside the read
	calls  int
}

func (r *reader) read(context.Context) ([]string, error) {
	r.calls++
	if r.during != nil {
		r.during()
	}
	return slices.Clone(r.types), r.err
}

func current(t *testing.T, c *typeCache, now time.Time, r *reader) []string {
	t.Helper()
	got, err := c.current(t.Context(), now, r.read)
	if err != nil {
		t.Fatalf("current: %v", err)
	}
	return slices.Clone(got)
}

func TestTypeCacheReadsOnceATTL(t *testing.T) {
	var c typeCache
	r := &reader{types: []string{"b.v1", "a.v1"}}
	t0 := time.Unix(1_700_000_000, 0)
	if got := current(t, &c, t0, r); !slices.Equal(got, []string{"a.v1", "b.v1"}) || r.calls != 1 {
		t.Fatalf("first use: %v after %d reads", got, r.calls)
	}
	c.note(pendingOf("c.v1", "c.v1", "a.v1"))
	c.note(&changeset{tasks: []*taskTx{{task: &store.Task{Type: "d.v1", Status: status.TaskPending}}, {task: &store.Task{Type: "e.v1", Status: status.TaskLeased}}}})
	c.note(pendingOf()) // nothing
	if got := current(t, &c, t0.Add(typeCacheTTL-time.Millisecond), r); !slices.Equal(got, []string{"a.v1", "b.v1", "c.v1", "d.v1"}) || r.calls != 1 {
		t.Errorf("within the TTL, after notes of new and retried tasks (not a leased one): %v after %d reads", got, r.calls)
	}
	current(t, &c, t0.Add(typeCacheTTL), r)
	if r.calls != 2 {
		t.Errorf("at the TTL: %d reads, want 2", r.calls)
	}
	current(t, &c, t0, r) // a clock that went back
	if r.calls != 3 {
		t.Errorf("before the last read: %d reads, want 3", r.calls)
	}
	c.stale()
	current(t, &c, t0, r)
	if r.calls != 4 {
		t.Errorf("after stale: %d reads, want 4", r.calls)
	}
}

// TestTypeCacheKeepsWhatAReadCannotHaveSeen: a read drops the types it
// did not find that were noted before it began (their tasks committed
// before it, so they are no longer pending) and keeps one noted while it
// ran (its commit may have come after the read's snapshot).
func TestTypeCacheKeepsWhatAReadCannotHaveSeen(t *testing.T) {
	var c typeCache
	t0 := time.Unix(1_700_000_000, 0)
	r := &reader{types: []string{"a.v1", "b.v1"}}
	current(t, &c, t0, r)
	c.note(pendingOf("n.v1"))
	r.types = []string{"b.v1"}
	r.during = func() { c.note(pendingOf("during.v1")) }
	if got := current(t, &c, t0.Add(typeCacheTTL), r); !slices.Equal(got, []string{"b.v1", "during.v1"}) {
		t.Errorf("after a read finding only b.v1, with during.v1 noted while it ran: %v", got)
	}
	r.types, r.during = nil, nil
	if got := current(t, &c, t0.Add(2*typeCacheTTL), r); len(got) != 0 {
		t.Errorf("after a read finding none: %v", got)
	}
}

func TestTypeCacheReadError(t *testing.T) {
	var c typeCache
	t0 := time.Unix(1_700_000_000, 0)
	boom := errors.New("boom")
	r := &reader{err: boom}
	if _, err := c.current(t.Context(), t0, r.read); !errors.Is(err, boom) {
		t.Fatalf("current: %v, want %v", err, boom)
	}
	r.err, r.types = nil, []string{"a.v1"}
	if got := current(t, &c, t0, r); !slices.Equal(got, []string{"a.v1"}) || r.calls != 2 {
		t.Errorf("after a failed read: %v after %d reads", got, r.calls)
	}
}

func TestWithPrefix(t *testing.T) {
	sorted := []string{"a.x.v1", "b.v1", "b.x.v1", "b.y.v1", "bc.v1"}
	for _, c := range []struct {
		prefix string
		want   []string
	}{
		{"b.", []string{"b.v1", "b.x.v1", "b.y.v1"}},
		{"b.x", []string{"b.x.v1"}},
		{"b", []string{"b.v1", "b.x.v1", "b.y.v1", "bc.v1"}},
		{"", sorted},
		{"z", nil},
		{"a.x.v1", []string{"a.x.v1"}},
	} {
		if got := withPrefix(sorted, c.prefix); !slices.Equal(got, c.want) {
			t.Errorf("withPrefix(%q) = %v, want %v", c.prefix, got, c.want)
		}
	}
}
