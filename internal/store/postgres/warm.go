package postgres

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
)

// warmWriters is how many write connections Warm opens: what a light load
// keeps busy (a trigger, a report batch, a claim and a fire transaction at
// once), with room for a second of each. A burst opens the rest as it
// needs them.
const warmWriters = 8

// warmQuery plans a read of every table the hot paths read or write.
// Planning opens each table and all its indexes, which is most of what a
// new backend does at its first statement on them; the reads find nothing.
const warmQuery = `SELECT count(*) FROM (
	SELECT 1 FROM runs WHERE id = '' UNION ALL
	SELECT 1 FROM step_runs WHERE run_id = '' UNION ALL
	SELECT 1 FROM tasks WHERE id = '' UNION ALL
	SELECT 1 FROM queue WHERE id = 0 UNION ALL
	SELECT 1 FROM events WHERE run_id = '' UNION ALL
	SELECT 1 FROM workflows WHERE id = '' UNION ALL
	SELECT 1 FROM workflow_versions WHERE workflow_id = '' UNION ALL
	SELECT 1 FROM task_types WHERE type = '' UNION ALL
	SELECT 1 FROM api_keys WHERE hash = '') w`

// Warm opens the connections a light load uses and loads each one's
// caches of the hot tables, so that the first requests after a server
// starts do not wait for that: in a slow phase of the development host a
// fresh server's first ≈300 ms of runs took up to 133 ms to start against
// ≈2 ms afterwards (docs/performance.md, Start latency). Call it once the
// schema is migrated; a failure costs only the warm-up.
func (s *Store) Warm(ctx context.Context) error {
	return errors.Join(warm(ctx, s.Store.DB(), warmWriters), warm(ctx, s.Store.ReadDB(), 1))
}

// warm holds n connections of db at once (so they are n distinct ones,
// kept idle in the pool afterwards) and runs warmQuery on each.
func warm(ctx context.Context, db *sql.DB, n int) error {
	if m := db.Stats().MaxOpenConnections; m > 0 {
		n = min(n, m)
	}
	errs := make([]error, n)
	conns := make([]*sql.Conn, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := db.Conn(ctx)
			if err != nil {
				errs[i] = err
				return
			}
			conns[i] = c
			if _, err := c.ExecContext(ctx, warmQuery); err != nil {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	for _, c := range conns {
		if c != nil {
			_ = c.Close() // back to the pool
		}
	}
	// Connections fail alike (a timeout, a missing table): the first
	// error and how many failed say it, where all of them would repeat it.
	failed := 0
	var first error
	for _, err := range errs {
		if err != nil {
			failed++
			first = cmp.Or(first, err)
		}
	}
	if first != nil {
		return fmt.Errorf("postgres: warming connections: %d of %d failed: %w", failed, n, first)
	}
	return nil
}
