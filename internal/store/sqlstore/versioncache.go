package sqlstore

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// versionCache is the run cache of a store other nodes may write
// (Postgres). An entry is used only when the run's row still has the
// version it was cached at: the row's xmin, the transaction that last
// wrote it, read under the row lock the run's transaction takes anyway.
// Every write of a run's steps also writes its row (UpdateStep marks the
// run), so an unchanged xmin means unchanged steps, and the steps query —
// every step of every run in a batch, outputs included — is skipped.
//
// Entries are staged after the transaction that wrote them commits, and
// are never changed in place: transactions on other connections may be
// reading one.
type versionCache struct {
	mu      sync.Mutex
	entries bounded
	hits    atomic.Int64
	check   bool
}

func newVersionCache() *versionCache {
	return &versionCache{entries: newBounded(runCacheMax, runCacheBytes)}
}

func (c *versionCache) get(id, version string) *cachedRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries.get(id); e != nil && e.version == version {
		c.hits.Add(1)
		return e
	}
	return nil
}

// latest is the run's latest committed state this store knows, at the
// version it was cached at (an optimistic batch checks that version when
// it writes).
func (c *versionCache) latest(id string) *cachedRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries.get(id)
}

// put keeps committed states (nil entries: forget the run).
func (c *versionCache) put(ids []string, es []*cachedRun) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range ids {
		c.entries.keep(id, es[i])
	}
}

// vstage computes, inside the transaction, the entries that become true
// when it commits (Store.committed puts them).
func (s *Store) vstage(ctx context.Context, tx querier, runs map[string]*runTx, cs *changeset) error {
	xid := cs.xid // the xmin of every row the flush wrote
	if len(cs.runs) > 0 && xid == "" {
		return fmt.Errorf("version cache: runs written without a transaction id")
	}
	w := cs.written()
	for id, rt := range runs {
		cs.cacheIDs = append(cs.cacheIDs, id)
		if rt.base == nil || status.RunTerminal(rt.run.Status) {
			cs.cacheRuns = append(cs.cacheRuns, nil)
			continue
		}
		// Entries are shared once put: one this transaction wrote is a
		// copy laid over; an unwritten one is its base as it stands.
		e := rt.base // carries the version it was read at
		if w.runs[id] {
			e = e.clone()
			e.version = xid
		}
		if !w.persisted(e, rt) {
			e = nil
		}
		cs.cacheRuns = append(cs.cacheRuns, e)
	}
	return nil
}

func (e *cachedRun) clone() *cachedRun {
	cp := *e
	cp.steps = append([]store.StepRun(nil), e.steps...)
	return &cp
}

// lockVersioned locks and reads runs, their steps from the cache where the
// row's version matches.
func (s *Store) lockVersioned(ctx context.Context, tx querier, ids []string, now time.Time) (map[string]*runTx, error) {
	out := make(map[string]*runTx, len(ids))
	if err := s.readRunRows(ctx, tx, ids, now, out); err != nil {
		return nil, err
	}
	return out, s.versionedSteps(ctx, tx, out, now)
}

// versionedSteps gives the runs just read in out their steps: from the
// cache where the row's version matches, else read.
func (s *Store) versionedSteps(ctx context.Context, tx querier, out map[string]*runTx, now time.Time) error {
	return s.versionedStepsChecked(ctx, tx, out, now, s.vcache.check)
}

// versionedStepsChecked is versionedSteps, its hits compared with the
// tables (FERRY_RUNCACHE_CHECK) if check.
func (s *Store) versionedStepsChecked(ctx context.Context, tx querier, out map[string]*runTx, now time.Time, check bool) error {
	var miss []string
	hits := map[string]*runTx{}
	for id, rt := range out {
		e := s.vcache.get(id, rt.version)
		if e == nil {
			miss = append(miss, id)
			continue
		}
		// Only the steps come from the cache: the run as just read carries
		// what a run row's version does not cover (its workflow's name).
		b := &cachedRun{version: rt.version, run: *rt.run, seq: rt.seq, updatedAt: rt.updatedAt, steps: e.steps, inRow: e.inRow, packed: e.packed}
		cached := b.runTx(s, ctx, tx, now)
		cached.version = rt.version
		out[id], hits[id] = cached, cached
	}
	if len(hits) > 0 && check {
		if err := s.checkHits(ctx, tx, hits); err != nil {
			return err
		}
	}
	sort.Strings(miss)
	if err := s.readSteps(ctx, tx, miss, out); err != nil {
		return err
	}
	for _, id := range miss {
		out[id].base = baseOf(out[id])
	}
	return nil
}
