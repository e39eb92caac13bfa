package sqlstore

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// taskCache keeps the leased tasks this store wrote (Postgres), each as
// its commit left it, with its row version (the xmin of that commit), so
// that a report batch of them can be decided without reading them, and
// written in one round trip that checks nothing changed since (see
// InTasks and optimistic.go). It is a hint: a stale entry only makes that
// batch start over the locking way.
type taskCache struct {
	mu sync.Mutex
	m  map[string]cachedTask
	// hits and stale count the report batches decided from the caches and
	// those of them whose rows had changed (StoreStats).
	hits, stale, ineligible atomic.Int64
}

type cachedTask struct {
	task    store.Task
	seq     int64
	version string
}

// A worker holds a leased task for seconds at most between its claim and
// its report, and a node leases at most its workers' slots at once: the
// count bound is far above that, and the body bound keeps a cache full of
// large payloads to a few tens of megabytes. Bigger tasks go the locking
// way.
const (
	taskCacheMax     = 1 << 14
	taskCacheBodyMax = 1 << 10
)

func newTaskCache() *taskCache { return &taskCache{m: make(map[string]cachedTask)} }

func (c *taskCache) get(id string) (cachedTask, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[id]
	return e, ok
}

// put records what cs, committed, wrote of tasks: the leased ones as
// written, at the commit's version; any other is forgotten.
func (c *taskCache) put(cs *changeset) {
	if cs.xid == "" || (len(cs.tasks) == 0 && len(cs.newTasks) == 0) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range cs.tasks {
		c.keep(t.task, t.seq, cs.xid)
	}
	for _, t := range cs.newTasks {
		seq := int64(1) // see taskInsertArgs
		if createdLeased(t) {
			seq = 2
		}
		c.keep(t, seq, cs.xid)
	}
}

func (c *taskCache) keep(t *store.Task, seq int64, version string) {
	if t.Status != status.TaskLeased || t.LeaseUntil == nil || len(t.Payload)+len(t.Result)+len(t.LastError) > taskCacheBodyMax {
		delete(c.m, t.ID)
		return
	}
	if _, ok := c.m[t.ID]; !ok && len(c.m) >= taskCacheMax {
		for id := range c.m { // any one: the cache is only a hint
			delete(c.m, id)
			break
		}
	}
	c.m[t.ID] = cachedTask{task: storedTask(t), seq: seq, version: version}
}

func (c *taskCache) forget(ids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		delete(c.m, id)
	}
}

// storedTask is t as a read of its row returns it (scanTask): times in
// UTC and microseconds, a payload never nil, nothing that is not stored.
func storedTask(t *store.Task) store.Task {
	k := *t
	k.RunAt, k.CreatedAt, k.UpdatedAt = dbTime(k.RunAt), dbTime(k.CreatedAt), dbTime(k.UpdatedAt)
	k.LeaseUntil, k.FinishedAt = dbTimePtr(k.LeaseUntil), dbTimePtr(k.FinishedAt)
	k.RetryDelay = k.RetryDelay.Truncate(time.Millisecond) // stored in milliseconds
	if k.Payload == nil {
		k.Payload = []byte{}
	}
	k.ToWaitingClaim = false
	return k
}
