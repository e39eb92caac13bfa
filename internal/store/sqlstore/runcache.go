package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
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
	max         int
	entries     map[string]*cachedRun // committed
	staged      map[string]*cachedRun // written by the open group
	dataVersion int64
	hits        atomic.Int64
}

// cachedRun is a run as committed, with its steps in position order.
type cachedRun struct {
	run       store.Run
	steps     []store.StepRun
	seq       int64
	updatedAt time.Time
}

// runCacheMax bounds the runs kept; a run in flight is written every few
// milliseconds, so a few thousand cover every run a busy server advances.
const runCacheMax = 4096

// runCacheBodyMax keeps runs whose step bodies are large out of the cache,
// so it stays a few megabytes however large the outputs are.
const runCacheBodyMax = 16 << 10

func newRunCache(max int) *runCache {
	return &runCache{max: max, entries: map[string]*cachedRun{}, staged: map[string]*cachedRun{}}
}

// begin checks, inside a new group's transaction, that nobody else wrote
// the database since the last group.
func (c *runCache) begin(ctx context.Context, tx *sql.Tx) error {
	var v int64
	if err := tx.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&v); err != nil {
		return fmt.Errorf("data version: %w", err)
	}
	if v != c.dataVersion {
		c.reset()
		c.dataVersion = v
	}
	return nil
}

// commit makes what the group staged the committed state.
func (c *runCache) commit() {
	for id, e := range c.staged {
		if e == nil {
			delete(c.entries, id)
			continue
		}
		c.entries[id] = e
	}
	clear(c.staged)
	// Evict arbitrary entries (map order): the live runs come back at
	// their next write.
	for id := range c.entries {
		if len(c.entries) <= c.max {
			break
		}
		delete(c.entries, id)
	}
}

// reset forgets everything: the database may hold something else.
func (c *runCache) reset() {
	clear(c.entries)
	clear(c.staged)
}

// take hands over the run's latest state in this group, if known: the
// entry leaves the cache (it comes back, as a fresh copy, when the request
// that took it stages its writes), so nothing the caller does to it can
// reach the cache.
func (c *runCache) take(s *Store, ctx context.Context, tx *sql.Tx, id string, now time.Time) *runTx {
	e := c.peek(id)
	if e == nil {
		return nil
	}
	c.staged[id] = nil
	c.hits.Add(1)
	rt := &runTx{s: s, ctx: ctx, tx: tx, run: &e.run, now: now, seq: e.seq, updatedAt: e.updatedAt, steps: make([]*store.StepRun, len(e.steps))}
	for i := range e.steps {
		rt.steps[i] = &e.steps[i]
	}
	return rt
}

// peek is the run's latest state in this group, if known.
func (c *runCache) peek(id string) *cachedRun {
	if e, ok := c.staged[id]; ok {
		return e
	}
	return c.entries[id]
}

// stage records the state the open group wrote for these runs. It must be
// a request's last step: what it stages is final if the group commits.
func (c *runCache) stage(runs map[string]*runTx) {
	for id, rt := range runs {
		if status.RunTerminal(rt.run.Status) {
			c.staged[id] = nil // nothing more happens to it: drop it
			continue
		}
		// Times as the database returns them (UTC, microseconds): a run
		// read from the cache is the run read from the table.
		e := &cachedRun{run: *rt.run, seq: rt.seq, updatedAt: dbTime(rt.updatedAt), steps: make([]store.StepRun, len(rt.steps))}
		e.run.UpdatedAt = e.updatedAt
		e.run.ExpiresAt, e.run.StartedAt, e.run.FinishedAt = dbTime(e.run.ExpiresAt), dbTime(e.run.StartedAt), dbTimePtr(e.run.FinishedAt)
		size := 0
		for i, st := range rt.steps {
			cp := *st
			cp.StatusCode, cp.DurationMS = clonePtr(st.StatusCode), clonePtr(st.DurationMS)
			cp.WakeAt, cp.StartedAt, cp.FinishedAt = dbTimePtr(st.WakeAt), dbTimePtr(st.StartedAt), dbTimePtr(st.FinishedAt)
			e.steps[i] = cp
			size += len(st.Body) + len(st.Request)
		}
		if size > runCacheBodyMax {
			c.staged[id] = nil
			continue
		}
		c.staged[id] = e
	}
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
	if s.cache == nil {
		return 0
	}
	return s.cache.hits.Load()
}

// VerifyRunCache compares every run the cache holds with the tables and
// describes the first difference; tests call it after their writes. It is
// nil for stores without a cache.
func (s *Store) VerifyRunCache(ctx context.Context) error {
	if s.cache == nil {
		return nil
	}
	var diff error
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		ids := map[string]bool{}
		for id := range s.cache.entries {
			ids[id] = true
		}
		for id := range s.cache.staged {
			ids[id] = true
		}
		for id := range ids {
			e := s.cache.peek(id)
			if e == nil {
				continue
			}
			got := &runTx{run: &e.run, seq: e.seq, updatedAt: e.updatedAt}
			for i := range e.steps {
				got.steps = append(got.steps, &e.steps[i])
			}
			want := map[string]*runTx{}
			if err := s.readRuns(ctx, tx, []string{id}, time.Time{}, want); err != nil {
				return err
			}
			if want[id] == nil {
				diff = fmt.Errorf("run %s is cached but not in the table", id)
				return nil
			}
			if g, w := runImage(got), runImage(want[id]); g != w {
				diff = fmt.Errorf("run %s: cached\n%s\ntable\n%s", id, g, w)
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return diff
}

// runImage is a run and its steps as the columns they are stored in.
func runImage(rt *runTx) string {
	r := rt.run
	var b strings.Builder
	fmt.Fprintf(&b, "run %v\n", []any{r.ID, r.WorkflowID, r.WorkflowName, r.Version, r.Status, string(r.Input), mustJSON(r.TriggerHeaders), r.IdempotencyKey, r.Error, ts(r.ExpiresAt), ts(r.StartedAt), tsPtr(r.FinishedAt), ts(r.UpdatedAt), ts(rt.updatedAt), rt.seq})
	for _, st := range rt.steps {
		fmt.Fprintf(&b, "step %v\n", append([]any{st.RunID, st.Name, st.Position, st.Type}, stepArgs(st)...))
	}
	return b.String()
}
