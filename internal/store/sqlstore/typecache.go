package sqlstore

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/internal/status"
)

// typeCacheTTL is how long a read of the pending tasks' types answers
// claims. Tasks made pending through this store add their types at once
// (typeCache.note), and those other nodes made pending are added from
// their notifications (Store.PendingTypesAdded), or mark the list stale
// when a notification does not name them (Store.PendingTypesChanged): the
// read again matters only where a notification goes missing.
const typeCacheTTL = time.Second

// typeCache holds the types of the tasks that may be pending, for claims
// (see Store.pendingTypes): the pending tasks' index is by type first
// (see duePending), so a claim walks each of its types, those a prefix
// ("billing.%") stands for found here, and reading which those are at
// every claim cost a statement more a claim (jobs, whose worker claims
// "bench.%": −10 % on SQLite, −15 % on Postgres, alternating pairs). A
// claim of exact types walks only those found here too.
//
// A type stays until a read finds no pending task of it that began after
// it was last noted: a task noted before a read began committed before
// it (notes follow commits), so the read sees the task if it is still
// pending.
type typeCache struct {
	// slot is held by the one read at a time; the other claims wait for
	// it, each no longer than its context (made at the first read).
	slot chan struct{}

	mu     sync.Mutex
	types  map[string]int64 // type → the read under way when it was last noted or found
	reads  int64            // reads begun
	readAt time.Time        // the time of the claim that began the last read
	fresh  bool             // read since the last PendingTypesChanged
	stales int64            // PendingTypesChanged calls
	done   int64            // the last read that succeeded
	sorted []string         // types, sorted; nil when they changed
}

// note adds the types of the tasks a commit made pending, and returns
// them, each once.
func (c *typeCache) note(cs *changeset) []string {
	var types []string
	add := func(t string) {
		if !slices.Contains(types, t) { // one type is the usual case
			types = append(types, t)
		}
	}
	for _, t := range cs.newTasks {
		if t.Status == status.TaskPending {
			add(t.Type)
		}
	}
	for _, t := range cs.tasks {
		if t.task.Status == status.TaskPending {
			add(t.task.Type)
		}
	}
	c.add(types)
	return types
}

// add notes types as having pending tasks: committed ones (notes follow
// commits; see typeCache).
func (c *typeCache) add(types []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.types == nil {
		c.types = map[string]int64{}
	}
	for _, t := range types {
		if _, ok := c.types[t]; !ok {
			c.sorted = nil
		}
		c.types[t] = c.reads
	}
}

// stale marks the types to be read again at the next claim.
func (c *typeCache) stale() {
	c.mu.Lock()
	c.fresh = false
	c.stales++
	c.mu.Unlock()
}

// current is the sorted types, read again first when stale or older than
// typeCacheTTL at now.
func (c *typeCache) current(ctx context.Context, now time.Time, read func(context.Context) ([]string, error)) ([]string, error) {
	if out, ok := c.get(now); ok {
		return out, nil
	}
	return c.refreshed(ctx, now, c.arrival(), read)
}

// arrival is the number of the last read begun, taken by a claim that
// found the list stale.
func (c *typeCache) arrival() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads
}

// refreshed is current for a claim that found the list stale when the
// last read begun was arrived: it waits for the read under way, and uses
// it, or reads.
func (c *typeCache) refreshed(ctx context.Context, now time.Time, arrived int64, read func(context.Context) ([]string, error)) ([]string, error) {
	slot, err := c.takeSlot(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { <-slot }()
	if out, ok := c.get(now); ok {
		return out, nil // read by the claim this one waited for
	}
	c.mu.Lock()
	if c.done > arrived {
		// A read that began after this claim found the list stale saw
		// every commit the claim must see, whatever was marked stale
		// since: a mark is followed by a wake-up, which claims again.
		// Without this, claims woken together while notifications kept
		// coming read one after another.
		defer c.mu.Unlock()
		return c.list(), nil
	}
	c.mu.Unlock()
	c.mu.Lock()
	c.reads++
	n, stales := c.reads, c.stales
	// Claims that come while this reads wait for it (on slot): the
	// list they would get now may lack what made it stale.
	c.fresh = false
	c.mu.Unlock()
	found, err := read(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	// Marked stale while it read: the read may have begun before what
	// the mark was for committed.
	c.fresh = c.stales == stales
	c.done = n
	seen := make(map[string]bool, len(found))
	for _, t := range found {
		seen[t] = true
	}
	if c.types == nil {
		c.types = map[string]int64{}
	}
	for t, at := range c.types {
		if !seen[t] && at < n {
			delete(c.types, t)
		}
	}
	for _, t := range found {
		c.types[t] = n
	}
	c.readAt, c.sorted = now, nil
	return c.list(), nil
}

// takeSlot waits for the read under way, if any, until ctx ends (a read
// the database holds up must not hold claims past their deadline), and
// returns the slot to release.
func (c *typeCache) takeSlot(ctx context.Context) (chan struct{}, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.slot == nil {
		c.slot = make(chan struct{}, 1)
	}
	slot := c.slot
	c.mu.Unlock()
	select {
	case slot <- struct{}{}:
		return slot, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// get is the types if they need no read at now: fresh, and read less
// than typeCacheTTL from now either way (claims at the same time take
// their times in any order; a clock set back by more reads again).
func (c *typeCache) get(now time.Time) ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fresh || now.Sub(c.readAt) >= typeCacheTTL || c.readAt.Sub(now) >= typeCacheTTL {
		return nil, false
	}
	return c.list(), true
}

// list is the types sorted, with c.mu held.
func (c *typeCache) list() []string {
	if c.sorted == nil {
		c.sorted = make([]string, 0, len(c.types))
		for t := range c.types {
			c.sorted = append(c.sorted, t)
		}
		slices.Sort(c.sorted)
	}
	return c.sorted
}

// withPrefix is the types in sorted that start with prefix.
func withPrefix(sorted []string, prefix string) []string {
	i, _ := slices.BinarySearch(sorted, prefix)
	j := i
	for j < len(sorted) && strings.HasPrefix(sorted[j], prefix) {
		j++
	}
	return sorted[i:j]
}

// PendingTypesChanged tells the store that tasks of types it may not know
// of became pending elsewhere (another node's notification that does not
// say which): the next claim reads the pending tasks' types again.
func (s *Store) PendingTypesChanged() { s.ptypes.stale() }

// PendingTypesAdded tells the store that tasks of these types became
// pending elsewhere (another node's notification, sent after its commit):
// claims walk them from now on without reading the types again.
func (s *Store) PendingTypesAdded(types []string) { s.ptypes.add(types) }
