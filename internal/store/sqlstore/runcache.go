package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// runCache keeps, for a SQLite store, the committed state of the live runs
// its single writer wrote last, so that a run's next request (its next
// step's completion, usually milliseconds later) does not read the run and
// its steps again: those reads were a quarter of the writer's time in the
// chain10 benchmark, and the writer is what SQLite throughput is made of.
//
// It is correct only because one goroutine writes the database: every
// change to runs and step_runs goes through a changeset inside the group
// writer, which stages the runs it wrote. Staged entries are what the open
// transaction wrote; later requests of the same group read them, and they
// become the committed entries only when the group commits. A group that
// fails as a whole (a failed savepoint release, a failed commit) empties
// the cache. A request that fails alone stages nothing (staging is its
// last step), and its savepoint rollback leaves the others' rows as staged.
//
// A commit by any other connection — another process on the same file —
// changes PRAGMA data_version on the writer's connection; it is checked at
// the start of every group and empties the cache when it moved.
//
// Only the writer goroutine uses a runCache, so it has no lock. Postgres
// stores have none: other nodes write the same rows.
type runCache struct {
	entries     bounded               // committed
	staged      map[string]*cachedRun // written by the open group
	dataVersion int64
	hits        atomic.Int64
	// outside counts commits on the writer's connection that bypass the
	// group (a workflow rename changes what runs read); begin empties the
	// cache when it moved. data_version misses those: same connection.
	outside     atomic.Int64
	seenOutside int64
	// check compares every hit with the tables (tests: FERRY_RUNCACHE_CHECK).
	check bool
	// The leased tasks the writer wrote last, kept as runs are: a task's
	// report reads it under the writer, and those reads were 7 % of the
	// writer's time in chain10. tasks is committed, stagedTasks what the
	// open group wrote (nil: forget), pendingTasks what the open request
	// wrote, staged once it succeeds (a request that fails rolls its rows
	// back: its writes are dropped, and what it read stays true).
	tasks        taskEntries
	stagedTasks  map[string]*cachedTask
	pendingTasks []pendingTask
	taskHits     atomic.Int64
}

type pendingTask struct {
	id string
	e  *cachedTask
}

// cachedRun is a run as committed, with its steps in position order.
type cachedRun struct {
	version   string // Postgres: the row's xmin when cached
	run       store.Run
	steps     []store.StepRun
	inRow     map[string]bool // see runTx.inRow
	seq       int64
	updatedAt time.Time
	size      int // bytes it holds, as counted against runCacheBytes
	// packed are its steps' forms in the run's row (appendPackedStep,
	// without the count), where known: a run of packedMemoSteps or more
	// steps rewrites all of them at every step's write (packStepsMemo).
	packed []string
}

// The run caches are bounded by count and by bytes: a run in flight is
// written every few milliseconds, and a run enters the cache when it is
// created, so the first outcome or wake-up of a new run needs no read
// either. 12,288 runs kept a burst of ten thousand sleepers cached until
// they woke (SQLite sleep lateness p99 118–152 → 42–98 ms against 4,096).
// Dormant runs (cachedRun.dormant) are not kept, so 100,000 runs asleep
// for an hour no longer fill the cache (peak RSS 130 → 52 MB on SQLite,
// 119 → 35 on Postgres), and the count covers a burst of 20,000 one-step
// runs created before they are drained (the jobs benchmark: at 12,288
// the 7,712 runs created first had left the cache when their tasks
// completed and were read again; the machine's CPU a Postgres job −6 %,
// the median of seven alternating pairs). A cached one-step run costs
// ≈1.5 KB of heap, ≈7 KB of RSS with the garbage collector's headroom
// (GOGC=400); a ten-step one about four times that. The byte budget
// keeps the cache to tens of megabytes however large the outputs are.
const (
	runCacheMax   = 24576
	runCacheBytes = 32 << 20
	// runCacheBodyMax keeps a run whose step bodies are large out of the
	// cache.
	runCacheBodyMax = 16 << 10
	// cachedStepSize and cachedRunSize stand for what an entry holds
	// besides its bodies (structs, strings, map slot).
	cachedStepSize = 256
	cachedRunSize  = 512
	// dormantAfter: see cachedRun.dormant.
	dormantAfter = time.Minute
)

func newRunCache() *runCache {
	return &runCache{entries: newBounded(runCacheMax, runCacheBytes), staged: map[string]*cachedRun{},
		tasks: taskEntries{}, stagedTasks: map[string]*cachedTask{}}
}

// pendTasks records what the open request's changeset cs, just written,
// wrote of tasks (see taskWrites).
func (c *runCache) pendTasks(cs *changeset) {
	taskWrites(cs, "", func(id string, e *cachedTask) { c.pendingTasks = append(c.pendingTasks, pendingTask{id, e}) })
}

// endRequest stages what the request that just ended wrote of tasks, if
// it succeeded, and drops it if it failed (its savepoint rolled back).
func (c *runCache) endRequest(ok bool) {
	if ok {
		for _, p := range c.pendingTasks {
			c.stagedTasks[p.id] = p.e
		}
	}
	c.pendingTasks = c.pendingTasks[:0]
}

// task is the task's latest state in this group, if cached.
func (c *runCache) task(id string) *cachedTask {
	if e, ok := c.stagedTasks[id]; ok {
		return e
	}
	if e, ok := c.tasks[id]; ok {
		return &e
	}
	return nil
}

// bounded is a map of cached runs kept within a count and a byte budget.
// It counts each entry at the size it had when kept: the SQLite cache
// lays a request's writes over the entry it took (see stage) while the
// entry is still in the map.
//
// Beyond the bounds it forgets the entries kept longest ago (a run kept
// again moves to the end). Runs are claimed and woken roughly in the order
// they were created, so when more are created than it holds, the misses
// fall on the oldest, together, and the batches that follow find all
// their runs: in the jobs benchmark on Postgres, 20,000 runs created before
// any is drained, forgetting arbitrary ones left a run or two missing in
// nearly every report batch, each batch then one read more.
type bounded struct {
	m                 map[string]boundedEntry
	max, maxBytes, by int
	// order lists the ids in the order they were kept, from head; an
	// item whose n is not its id's entry's was kept again since (or
	// forgotten) and is skipped.
	order []keptAt
	head  int
	n     uint64
}

type boundedEntry struct {
	e    *cachedRun
	size int
	n    uint64 // when it was kept (bounded.n)
}

type keptAt struct {
	id string
	n  uint64
}

func newBounded(max, maxBytes int) bounded {
	return bounded{m: map[string]boundedEntry{}, max: max, maxBytes: maxBytes}
}

func (b *bounded) get(id string) *cachedRun { return b.m[id].e }

// keep sets (or, for nil, forgets) a run's entry, then forgets the
// entries kept longest ago beyond the bounds: the live runs come back at
// their next write.
func (b *bounded) keep(id string, e *cachedRun) {
	if old, ok := b.m[id]; ok {
		b.by -= old.size
		delete(b.m, id)
	}
	if e != nil {
		b.n++
		b.m[id] = boundedEntry{e, e.size, b.n}
		b.by += e.size
		b.order = append(b.order, keptAt{id, b.n})
	}
	for (len(b.m) > b.max || b.by > b.maxBytes) && b.head < len(b.order) {
		k := b.order[b.head]
		if old, ok := b.m[k.id]; ok && old.n == k.n {
			if k.id == id {
				break // the entry just kept is all there is
			}
			b.by -= old.size
			delete(b.m, k.id)
		}
		b.order[b.head] = keptAt{}
		b.head++
	}
	if live := len(b.order) - b.head; live > 2*len(b.m)+64 || b.head > 2*len(b.m)+64 {
		// Mostly entries kept again since, or the front long consumed
		// (the array behind it is not reclaimed while anything after it
		// is in use): a new array of what is current.
		kept := make([]keptAt, 0, 2*len(b.m)+64)
		for _, k := range b.order[b.head:] {
			if old, ok := b.m[k.id]; ok && old.n == k.n {
				kept = append(kept, k)
			}
		}
		b.order, b.head = kept, 0
	}
}

func (b *bounded) reset() {
	clear(b.m)
	b.by = 0
	b.order, b.head = nil, 0
}

// begin checks, inside a new group's transaction, that nobody else wrote
// the database since the last group.
func (c *runCache) begin(ctx context.Context, tx *sql.Tx) error {
	var v int64
	if err := tx.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&v); err != nil {
		return fmt.Errorf("data version: %w", err)
	}
	if o := c.outside.Load(); v != c.dataVersion || o != c.seenOutside {
		c.reset()
		c.dataVersion, c.seenOutside = v, o
	}
	return nil
}

// commit makes what the group staged the committed state.
func (c *runCache) commit() {
	for id, e := range c.staged {
		c.entries.keep(id, e)
	}
	clear(c.staged)
	for id, e := range c.stagedTasks {
		c.tasks.keep(id, e)
	}
	clear(c.stagedTasks)
}

// reset forgets everything: the database may hold something else.
func (c *runCache) reset() {
	c.entries.reset()
	clear(c.staged)
	clear(c.tasks)
	clear(c.stagedTasks)
	c.pendingTasks = c.pendingTasks[:0]
}

// take is the run's latest state in this group, if known, as a runTx of
// private copies; the entry itself becomes the runTx's base (see stage),
// and it leaves the cache until the request that took it stages.
func (c *runCache) take(s *Store, ctx context.Context, tx querier, id string, now time.Time) *runTx {
	e := c.peek(id)
	if e == nil {
		return nil
	}
	c.staged[id] = nil
	c.hits.Add(1)
	return e.runTx(s, ctx, tx, now)
}

// runTx hands out copies of e, with e as their base.
func (e *cachedRun) runTx(s *Store, ctx context.Context, tx querier, now time.Time) *runTx {
	run := e.run
	rt := &runTx{s: s, ctx: ctx, tx: tx, run: &run, now: notBefore(now, e.updatedAt), seq: e.seq, updatedAt: e.updatedAt, steps: make([]*store.StepRun, len(e.steps)), base: e, inRow: e.inRow}
	// One allocation for the copies, not one per step.
	copies := slices.Clone(e.steps)
	for i := range copies {
		rt.steps[i] = &copies[i]
	}
	return rt
}

// baseOf is the private image of a run read from the tables.
func baseOf(rt *runTx) *cachedRun {
	e := &cachedRun{version: rt.version, run: *rt.run, seq: rt.seq, updatedAt: rt.updatedAt, steps: make([]store.StepRun, len(rt.steps)), inRow: rt.inRow}
	for i, st := range rt.steps {
		e.steps[i] = *st
	}
	return e
}

// peek is the run's latest state in this group, if known.
func (c *runCache) peek(id string) *cachedRun {
	if e, ok := c.staged[id]; ok {
		return e
	}
	return c.entries.get(id)
}

// stage records, for the runs of a request, the state its changeset cs
// wrote (see persisted). It must be the request's last step: what it
// stages is final if the group commits.
func (c *runCache) stage(runs map[string]*runTx, cs *changeset) {
	w := cs.written()
	for id, rt := range runs {
		e := rt.base
		if e == nil || status.RunTerminal(rt.run.Status) {
			c.staged[id] = nil // not ours to keep, or nothing more happens to it
			continue
		}
		rt.base = nil // e becomes the cached state: no one else may change it
		if !w.persisted(e, rt) {
			c.staged[id] = nil
			continue
		}
		c.staged[id] = e
	}
}

// writes indexes what a changeset wrote, by run.
type writes struct {
	runs   map[string]bool
	steps  map[[2]string]*store.StepRun
	placed map[string]map[string]bool // see changeset.placed
	packed map[string][]string        // see changeset.packed
}

func (cs *changeset) written() writes {
	w := writes{runs: make(map[string]bool, len(cs.runs)), steps: make(map[[2]string]*store.StepRun, len(cs.steps)), placed: cs.placed, packed: cs.packed}
	for _, r := range cs.runs {
		w.runs[r.run.ID] = true
	}
	for _, st := range cs.steps {
		w.steps[[2]string{st.RunID, st.Name}] = st
	}
	return w
}

// persisted lays what was written for rt's run over e, its state as read,
// so that e is what the tables now hold — not what rt holds in memory,
// which may have changes that were never written. It reports whether e is
// worth keeping (see worthKeeping).
func (w writes) persisted(e *cachedRun, rt *runTx) bool {
	id := rt.run.ID
	if w.runs[id] {
		// The columns flush writes for a run (runSet), as the table
		// returns them: UTC, microseconds.
		r := rt.run
		e.run.Status, e.run.Error, e.run.FinishedAt = r.Status, r.Error, dbTimePtr(r.FinishedAt)
		e.updatedAt = dbTime(rt.updatedAt)
		e.run.UpdatedAt, e.seq = e.updatedAt, rt.seq
		e.inRow = w.placed[id]
		// The forms the run's row was written with, of the steps as
		// laid over below (overlayStep keeps what they hold).
		e.packed = w.packed[id]
		if len(e.packed) != len(e.steps) {
			e.packed = nil
		}
	}
	for i := range e.steps {
		b := &e.steps[i]
		if st := w.steps[[2]string{id, b.Name}]; st != nil {
			overlayStep(b, st)
		}
	}
	return e.worthKeeping(rt.now)
}

// worthKeeping sets e's size and reports whether the cache should keep e
// at now: small enough, and not dormant.
func (e *cachedRun) worthKeeping(now time.Time) bool {
	return e.measure() && !e.dormant(now)
}

// dormant reports whether the run's next write is more than dormantAfter
// away: no step runs or waits (a waiting step can be answered at any
// moment), and its earliest wake-up and its expiry are further away. Its
// entry would take one of the cache's slots for all that time to save
// one read at its wake-up, and a burst of runs that sleep for hours would
// push out the runs in flight, whose every step is a write.
func (e *cachedRun) dormant(now time.Time) bool {
	if e.run.Status != status.RunRunning {
		return false
	}
	if !e.run.ExpiresAt.IsZero() && e.run.ExpiresAt.Sub(now) <= dormantAfter {
		return false
	}
	var wake time.Time
	for i := range e.steps {
		switch st := &e.steps[i]; st.Status {
		case status.StepRunning, status.StepWaiting:
			return false
		case status.StepSleeping:
			if st.WakeAt == nil {
				return false
			}
			if wake.IsZero() || st.WakeAt.Before(wake) {
				wake = *st.WakeAt
			}
		}
	}
	return !wake.IsZero() && wake.Sub(now) > dormantAfter
}

// measure sets e's size and reports whether e is small enough to keep.
func (e *cachedRun) measure() bool {
	body := len(e.run.Input) + len(e.run.Error)
	for i := range e.steps {
		b := &e.steps[i]
		body += len(b.Body) + len(b.Request) + len(b.Error)
	}
	forms := 0
	for _, p := range e.packed {
		forms += len(p)
	}
	e.size = cachedRunSize + len(e.steps)*cachedStepSize + body + forms
	return body <= runCacheBodyMax
}

// created stages a run the request inserts, as the tables will return it,
// so that its first outcome or wake-up needs no read.
func (c *runCache) created(nr *store.NewRun, now time.Time, short bool) {
	if e := createdEntry(nr, now, short); e != nil {
		c.staged[nr.Run.ID] = e
	}
}

// createdEntry is a run being inserted as the tables will return it, or
// nil when it is not to be cached. Only a run built from a workflow
// checked inside the transaction is kept: the workflow's name is part of
// the run as read. Terminal runs are not kept.
func createdEntry(nr *store.NewRun, now time.Time, short bool) *cachedRun {
	if nr.Workflow == nil || status.RunTerminal(nr.Run.Status) {
		return nil
	}
	rp, err := createdRun(nr, now)
	if err != nil {
		return nil
	}
	// Each of the run's events took the next number (newRun).
	e := &cachedRun{run: *rp, seq: int64(len(nr.Events)), updatedAt: rp.UpdatedAt, steps: make([]store.StepRun, len(nr.Steps))}
	for i, st := range nr.Steps {
		b := &e.steps[i]
		b.RunID, b.Name, b.Position, b.Type = rp.ID, st.Name, st.Position, st.Type
		overlayStep(b, st)
		if packable(st, short) { // as changeset.newRun placed it
			if e.inRow == nil {
				e.inRow = make(map[string]bool, len(nr.Steps))
			}
			e.inRow[st.Name] = true
		}
	}
	slices.SortStableFunc(e.steps, func(a, b store.StepRun) int { return a.Position - b.Position })
	if !e.worthKeeping(now) {
		return nil
	}
	return e
}

// overlayStep lays the columns flush writes for a step (stepSet) over b,
// as the table returns them.
func overlayStep(b, st *store.StepRun) {
	b.Status, b.Attempt, b.CallbackToken = st.Status, st.Attempt, st.CallbackToken
	b.StatusCode, b.DurationMS = clonePtr(st.StatusCode), clonePtr(st.DurationMS)
	b.Request, b.Body, b.Headers = st.Request, st.Body, st.Headers
	if len(b.Request) == 0 {
		b.Request = nil // written as NULL
	}
	if len(b.Body) == 0 {
		b.Body = nil // an empty blob reads back as nil
	}
	b.Truncated, b.Blocked, b.Error = st.Truncated, st.Blocked, st.Error
	b.WakeAt, b.StartedAt, b.FinishedAt = dbTimePtr(st.WakeAt), dbTimePtr(st.StartedAt), dbTimePtr(st.FinishedAt)
}

func dbTime(t time.Time) time.Time { return fromTS(ts(t)) }

func dbTimePtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	v := dbTime(*t)
	return &v
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// RunCacheHits counts the runs read from the cache instead of the tables.
func (s *Store) RunCacheHits() int64 {
	switch {
	case s.cache != nil:
		return s.cache.hits.Load()
	case s.vcache != nil:
		return s.vcache.hits.Load()
	}
	return 0
}

// TaskCacheHits counts the tasks SQLite's writer took from its cache
// instead of the table.
func (s *Store) TaskCacheHits() int64 {
	if s.cache == nil {
		return 0
	}
	return s.cache.taskHits.Load()
}

// VerifyRunCache compares every run and task the cache holds with the
// tables and describes the first difference; tests call it after their writes. It is
// nil for stores without a cache.
func (s *Store) VerifyRunCache(ctx context.Context) error {
	if s.cache == nil {
		return nil
	}
	var diff error
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		cached := map[string]*runTx{}
		var ids []string
		for id := range s.cache.entries.m {
			ids = append(ids, id)
		}
		for id := range s.cache.staged {
			ids = append(ids, id)
		}
		for _, id := range ids {
			if e := s.cache.peek(id); e != nil {
				cached[id] = e.runTx(s, ctx, tx, time.Time{})
			}
		}
		diff = s.checkHits(ctx, tx, cached)
		if diff == nil {
			tasks := map[string]lockedTask{}
			for _, id := range slices.Concat(slices.Collect(maps.Keys(s.cache.tasks)), slices.Collect(maps.Keys(s.cache.stagedTasks))) {
				if e := s.cache.task(id); e != nil {
					tasks[id] = lockedTask{task: &e.task, seq: e.seq}
				}
			}
			diff = s.checkTaskHits(ctx, tx, tasks)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return diff
}

// checkTaskHits compares tasks taken from a cache with the tables.
func (s *Store) checkTaskHits(ctx context.Context, tx querier, hits map[string]lockedTask) error {
	if len(hits) == 0 {
		return nil
	}
	want, err := s.lockTasks(ctx, tx, slices.Collect(maps.Keys(hits)))
	if err != nil {
		return err
	}
	for id, got := range hits {
		w, ok := want[id]
		if !ok {
			return fmt.Errorf("task cache: task %s is cached but not in the table", id)
		}
		if g, wi := taskImage(got.task, got.seq), taskImage(w.task, w.seq); g != wi {
			return fmt.Errorf("task cache: task %s differs from the table:\ncache %s\ntable %s", id, g, wi)
		}
	}
	return nil
}

// checkHits compares runs taken from the cache with the tables.
func (s *Store) checkHits(ctx context.Context, tx querier, hits map[string]*runTx) error {
	for id, got := range hits {
		want := map[string]*runTx{}
		if err := s.readRuns(ctx, tx, []string{id}, got.now, want); err != nil {
			return err
		}
		if want[id] == nil {
			return fmt.Errorf("run cache: run %s is cached but not in the table", id)
		}
		if g, w := runImage(got), runImage(want[id]); g != w {
			return fmt.Errorf("run cache: run %s differs from the table:\ncache %s\ntable %s", id, g, w)
		}
		if g, w := got.inRow, want[id].inRow; !maps.Equal(g, w) {
			return fmt.Errorf("run cache: run %s: steps in the run's row %v, the table's %v", id, g, w)
		}
	}
	return nil
}

// runImage is a run and its steps, every field, nil-ness and time zones
// included.
func runImage(rt *runTx) string {
	r := rt.run
	var b strings.Builder
	fmt.Fprintf(&b, "run %#v\n", []any{r.ID, r.WorkflowID, r.WorkflowName, r.Version, r.Status, bytesImage(r.Input), r.TriggerHeaders == nil, mustJSON(r.TriggerHeaders), r.IdempotencyKey, r.Error, timeImage(&r.ExpiresAt), timeImage(&r.StartedAt), timeImage(r.FinishedAt), timeImage(&r.UpdatedAt), timeImage(&rt.updatedAt), rt.seq})
	for _, st := range rt.steps {
		fmt.Fprintf(&b, "step %#v\n", []any{st.RunID, st.Name, st.Position, st.Type, st.Status, st.Attempt, st.CallbackToken, intImage(st.StatusCode), intImage(st.DurationMS), bytesImage(st.Request), bytesImage(st.Body), st.Headers == nil, mustJSON(st.Headers), st.Truncated, st.Blocked, st.Error, timeImage(st.WakeAt), timeImage(st.StartedAt), timeImage(st.FinishedAt)})
	}
	return b.String()
}

func timeImage(t *time.Time) string {
	if t == nil {
		return "nil"
	}
	return t.Format(time.RFC3339Nano) + " " + t.Location().String()
}

func bytesImage(b []byte) string {
	if b == nil {
		return "nil"
	}
	return "[" + string(b) + "]"
}

func intImage[T int | int64](p *T) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}
