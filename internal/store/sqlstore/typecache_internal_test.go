package sqlstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
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
	current(t, &c, t0.Add(typeCacheTTL-time.Millisecond), r) // a claim that took its time before the read's
	if r.calls != 2 {
		t.Errorf("a moment before the last read: %d reads, want 2", r.calls)
	}
	current(t, &c, t0, r) // a clock set back by the TTL
	if r.calls != 3 {
		t.Errorf("the TTL before the last read: %d reads, want 3", r.calls)
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

// TestTypeCacheOneReadForClaimsWaitingOnIt: claims that find the types
// stale while a read is under way wait for it and use what it read.
func TestTypeCacheOneReadForClaimsWaitingOnIt(t *testing.T) {
	var c typeCache
	t0 := time.Unix(1_700_000_000, 0)
	inRead, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	read := func(context.Context) ([]string, error) {
		if calls.Add(1) == 1 {
			close(inRead)
			<-release // the others find it under way
		}
		return []string{"a.v1"}, nil
	}
	var wg sync.WaitGroup
	got := make([][]string, 4)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i > 0 {
				<-inRead // the first is reading
			}
			out, err := c.current(t.Context(), t0, read)
			if err != nil {
				t.Error(err)
			}
			got[i] = slices.Clone(out)
		}()
	}
	<-inRead
	close(release)
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Errorf("%d reads for four claims at once, want 1", n)
	}
	for i, g := range got {
		if !slices.Equal(g, []string{"a.v1"}) {
			t.Errorf("claim %d: %v", i, g)
		}
	}
}

// TestTypeCacheStaleDuringARead: a claim that comes while a read is under
// way waits for it rather than taking the list from before; and a read
// during which the types were marked stale does not make them fresh (it
// may have begun before what the mark was for committed).
func TestTypeCacheStaleDuringARead(t *testing.T) {
	var c typeCache
	t0 := time.Unix(1_700_000_000, 0)
	current(t, &c, t0, &reader{types: []string{"a.v1"}})
	c.stale()
	inRead, release := make(chan struct{}), make(chan struct{})
	first := &reader{types: []string{"a.v1"}, during: func() {
		close(inRead)
		<-release
	}}
	done := make(chan []string)
	go func() {
		out, _ := c.current(t.Context(), t0, first.read)
		done <- slices.Clone(out)
	}()
	<-inRead
	if out, ok := c.get(t0); ok {
		t.Errorf("during a read after a stale mark, get gave %v without waiting", out)
	}
	c.stale() // another node's notification while it reads
	close(release)
	<-done
	second := &reader{types: []string{"a.v1", "b.v1"}}
	if got := current(t, &c, t0, second); !slices.Equal(got, []string{"a.v1", "b.v1"}) || second.calls != 1 {
		t.Errorf("after a read during which it was marked stale: %v after %d reads, want a read again", got, second.calls)
	}
}

// TestTypeCacheWaiterTakesAReadBegunAfterIt: a claim that found the list
// stale takes the list of a read that began after that, even if the list
// was marked stale again while it ran; a claim that found it stale after
// that read began reads again.
func TestTypeCacheWaiterTakesAReadBegunAfterIt(t *testing.T) {
	var c typeCache
	t0 := time.Unix(1_700_000_000, 0)
	current(t, &c, t0, &reader{types: []string{"a.v1"}})
	c.stale()
	first, second := c.arrival(), c.arrival() // two claims find it stale
	r := &reader{types: []string{"a.v1", "b.v1"}}
	var third int64
	r.during = func() {
		third = c.arrival() // a claim that comes while it reads
		c.stale()           // a notification while it reads
	}
	for i, arrived := range []int64{first, second} {
		got, err := c.refreshed(t.Context(), t0, arrived, r.read)
		if err != nil || !slices.Equal(got, []string{"a.v1", "b.v1"}) || r.calls != 1 {
			t.Errorf("claim %d: %v, %v after %d reads; want the one read's list", i+1, got, err, r.calls)
		}
	}
	r.during = nil
	if _, err := c.refreshed(t.Context(), t0, third, r.read); err != nil || r.calls != 2 {
		t.Errorf("a claim that came during the read: %d reads, %v; want a read of its own", r.calls, err)
	}
}

// TestTypeCacheWaiterGivesUpWithItsContext: a claim waiting for a read
// under way returns its context's error when the context ends, and the
// read goes on to answer the claims after it.
func TestTypeCacheWaiterGivesUpWithItsContext(t *testing.T) {
	var c typeCache
	t0 := time.Unix(1_700_000_000, 0)
	inRead, release := make(chan struct{}), make(chan struct{})
	first := &reader{types: []string{"a.v1"}, during: func() {
		close(inRead)
		<-release // held up, as by a database that does not answer
	}}
	done := make(chan error, 1)
	go func() {
		_, err := c.current(context.Background(), t0, first.read)
		done <- err
	}()
	<-inRead
	ctx, cancel := context.WithCancel(t.Context())
	waited := make(chan error, 1)
	go func() {
		_, err := c.current(ctx, t0, (&reader{types: []string{"b.v1"}}).read)
		waited <- err
	}()
	cancel()
	select {
	case err := <-waited:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a claim whose context ended while it waited for a read: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("a claim still waited for the read 10s after its context ended")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := current(t, &c, t0, &reader{types: []string{"c.v1"}}); !slices.Equal(got, []string{"a.v1"}) {
		t.Errorf("after the read: %v, want its list", got)
	}
}
