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
	m  taskEntries
	// hits, stale and ineligible count the report batches and fire
	// transactions written from the caches, found changed at their write,
	// and decided again before anything was sent (OptimisticBatches);
	// reread those decided again on their cached runs read afresh
	// (OptimisticRereads).
	hits, stale, ineligible, reread atomic.Int64
}

// taskEntries are cached tasks, bounded by count (taskCacheMax); SQLite's
// run cache keeps its committed tasks in one too.
type taskEntries map[string]cachedTask

// keep sets (e) or forgets (nil) a task's entry, evicting any other when
// a new one would pass the bound: the cache is only a hint.
func (m taskEntries) keep(id string, e *cachedTask) {
	if e == nil {
		delete(m, id)
		return
	}
	if _, ok := m[id]; !ok && len(m) >= taskCacheMax {
		for other := range m {
			delete(m, other)
			break
		}
	}
	m[id] = *e
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

func newTaskCache() *taskCache { return &taskCache{m: taskEntries{}} }

func (c *taskCache) get(id string) (cachedTask, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[id]
	return e, ok
}

// put records what cs, committed, wrote of tasks: the leased ones as
// written, at the commit's version; any other is forgotten.
func (c *taskCache) put(cs *changeset) {
	if cs.xid == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	taskWrites(cs, cs.xid, c.m.keep)
}

// taskWrites calls keep for every task cs writes, with what a task cache
// keeps of it once cs commits (the transaction's version its own): the
// task as written if it is leased and small, else nil (forget it). Tasks
// the changeset cancels by id (a stopped run's) come last, forgotten.
func taskWrites(cs *changeset, version string, keep func(id string, e *cachedTask)) {
	for _, t := range cs.tasks {
		keep(t.task.ID, cacheable(t.task, t.seq, version))
	}
	for _, t := range cs.newTasks {
		seq := int64(1) // see taskInsertArgs
		if createdLeased(t) {
			seq = 2
		}
		keep(t.ID, cacheable(t, seq, version))
	}
	for _, c := range cs.cancel {
		for _, id := range c.ids {
			keep(id, nil)
		}
	}
}

// cacheable is t as a task cache keeps it, or nil when it keeps no such
// task: only leased ones, whose report is what reads them next, and small.
func cacheable(t *store.Task, seq int64, version string) *cachedTask {
	if t.Status != status.TaskLeased || t.LeaseUntil == nil || len(t.Payload)+len(t.Result)+len(t.LastError) > taskCacheBodyMax {
		return nil
	}
	return &cachedTask{task: storedTask(t), seq: seq, version: version}
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
	k.ToWaitingClaim, k.TraceParent = false, ""
	return k
}
