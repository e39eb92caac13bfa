package runtime

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

type reportReq struct {
	ctx   context.Context
	id    string
	token string
	fn    func(tx store.TaskTx, of *offer) error
	out   *store.Task
	err   error
	done  chan struct{}
}

func (q *reportReq) context() context.Context { return q.ctx }
func (q *reportReq) fail(err error)           { q.err, q.out = err, nil }
func (q *reportReq) finish()                  { close(q.done) }

// reportTask runs a worker's report under the task's lock after checking
// the lease token (the fence against stale workers), in a batch with other
// reports.
func (r *Runtime) reportTask(ctx context.Context, id, token string, fn func(tx store.TaskTx, of *offer) error) (*store.Task, error) {
	q := &reportReq{ctx: ctx, id: id, token: token, fn: fn, done: make(chan struct{})}
	if err := r.reports.do(q, q.done); err != nil {
		return nil, err
	}
	if q.err == nil && q.out != nil && q.out.Status != status.TaskLeased {
		if _, ok := r.taskRuns.LoadAndDelete(id); ok { // finished: no more reports
			r.taskRunsN.Add(-1)
		}
	}
	return q.out, q.err
}

// reportLane keys a report by its task's run when this runtime handed the
// task out (see handedOut), else by the task: reports of one run go to
// one lane.
func (r *Runtime) reportLane(q *reportReq) uint64 {
	key := q.id
	if run, ok := r.taskRuns.Load(q.id); ok && run.(string) != "" {
		key = run.(string)
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64()
}

// handedOut tells the observer how long each task waited, and remembers
// the runs of tasks leased to workers ("" for a
// standalone task), for reportLane and for the store, which then need not
// look them up (applyReports); a task's entry goes when it finishes. Bounded: past maxTaskRuns (tasks
// released or reclaimed elsewhere are never reported here) it starts
// again, and a report of a forgotten task only loses its lane's affinity.
//
// since, when given, is when each became claimable, as the claim found
// (store.Claim.Since); without it, tasks were leased as they were created.
func (r *Runtime) handedOut(ctx context.Context, ts []*store.Task, since []time.Time) {
	var now time.Time
	if len(ts) > 0 {
		now = r.clk.Now()
	}
	for i, t := range ts {
		from := createdClaimable(t)
		if len(since) == len(ts) {
			from = since[i]
		}
		r.cfg.Observer.TaskHandedOut(max(now.Sub(from), 0))
		// Standalone tasks too (run ""): the store then need not look
		// them up either.
		if _, loaded := r.taskRuns.LoadOrStore(t.ID, t.RunID); !loaded && r.taskRunsN.Add(1) > maxTaskRuns {
			r.taskRuns.Clear()
			r.taskRunsN.Store(0)
		}
	}
	if r.waiting.n.Load() > 0 {
		r.watchLeases(ts, r.waiting.last.Load())
	}
	// After the waits are measured: the read is not the queue's.
	if r.cfg.Tracer.Enabled() {
		r.traceTasks(ctx, ts)
	}
}

// watchLeases tells the claims waiting on this node when the leases of ts
// end: a task whose worker never reports is claimable again then, and a
// claim set its wait from the leases out when it began (NextTaskDue), so
// one handed out later was taken over only when that wait ended (a
// minute, against a lease of seconds). Claims whose wait ends sooner, or
// that take other types, wait on as they were. Claims waiting on other
// nodes are not told (they learn at their next claim). A lease that ends
// after last, the latest of the waiting claims' deadlines, concerns none
// of them: with leases longer than the claims' waits (the benchmarks'),
// no claim is woken for it.
func (r *Runtime) watchLeases(ts []*store.Task, last int64) {
	var end time.Time
	var types []string
	for _, t := range ts {
		if t.LeaseUntil == nil {
			continue
		}
		if end.IsZero() || t.LeaseUntil.Before(end) {
			end = *t.LeaseUntil
		}
		if !slices.Contains(types, t.Type) {
			types = append(types, t.Type)
		}
	}
	if !end.IsZero() && end.UnixNano() < last {
		r.tasksReadyAt(end, types)
	}
}

const maxTaskRuns = 1 << 16

// maxRunTraces bounds runTraces: it needs only the runs whose steps are
// being handed out, and a run forgotten is read again.
const maxRunTraces = 1 << 14

// traceTasks gives each of ts that belongs to a run the run's trace
// context (store.Task.TraceParent), so that the worker's spans join the
// run's trace. A run's is read once (its trigger headers) and kept until
// runTraces reaches its bound and starts over; a failed read hands the
// tasks out without it: tracing never holds work back. A caller gone (ctx
// ended) gets no read (the API puts its tasks back).
func (r *Runtime) traceTasks(ctx context.Context, ts []*store.Task) {
	var missing []string
	for _, t := range ts {
		if t.RunID == "" {
			continue
		}
		if tp, ok := r.runTraces.Load(t.RunID); ok {
			t.TraceParent = tp.(string)
		} else if !slices.Contains(missing, t.RunID) {
			missing = append(missing, t.RunID)
		}
	}
	if len(missing) == 0 || ctx.Err() != nil {
		return
	}
	hs, err := r.st.TriggerHeaders(ctx, missing)
	if err != nil {
		lvl := slog.LevelWarn
		if ctx.Err() != nil {
			lvl = slog.LevelDebug
		}
		r.log.Log(ctx, lvl, "reading the runs' trace context failed", "err", err)
		return
	}
	for _, t := range ts {
		h, ok := hs[t.RunID]
		if t.TraceParent != "" || !ok {
			continue
		}
		t.TraceParent = r.cfg.Tracer.TaskParent(t.RunID, h)
		if _, loaded := r.runTraces.LoadOrStore(t.RunID, t.TraceParent); !loaded && r.runTracesN.Add(1) > maxRunTraces {
			r.runTraces.Clear()
			r.runTracesN.Store(0)
		}
	}
}

// applyReports writes a batch and answers every report in it except those
// to retry, which it returns.
func (r *Runtime) applyReports(batch []*reportReq) []*reportReq {
	// Late timers come first here too (see Runtime.yield): under a burst
	// of wake-ups the steps those wake-ups start finish at the same rate,
	// and their reports took the writer (SQLite) or the CPU (Postgres)
	// the timers needed, so the backlog of wake-ups kept growing.
	r.yield.wait(r.clk, yieldBound)
	ids := make([]string, len(batch))
	// The runs of the tasks this runtime handed out are known: the store
	// need not look them up (a round trip per batch).
	known := make(map[string]string, len(batch))
	for i, q := range batch {
		ids[i] = q.id
		if run, ok := r.taskRuns.Load(q.id); ok {
			known[q.id] = run.(string)
		}
	}
	// The tasks the reports start that their workers do not take go to
	// claims waiting on this node.
	of := r.newOffer()
	// The store calls fn in increasing i within one decision of the batch;
	// an i not above the last one begins another decision.
	last := -1
	errs, err := r.st.InTasks(context.Background(), ids, known, r.clk.Now(), func(i int, tx store.TaskTx) error {
		if i <= last {
			of.restart()
		}
		last = i
		q := batch[i]
		t := tx.Task()
		if t.LeaseToken == "" || t.LeaseToken != q.token {
			return fmt.Errorf("task %s: %w", q.id, ErrStaleLease)
		}
		if t.Status != status.TaskLeased {
			return fmt.Errorf("task %s is %s: %w", q.id, t.Status, ErrTaskFinished)
		}
		if run := tx.Run(); run != nil && pastExpiry(run.Run(), tx.Now()) {
			// Its expiry is due and not applied yet (a timer backlog, a
			// restart after downtime): the report is refused as it will
			// be once the expiry cancels the task, whenever it fires. It
			// finished the run past its max_duration, as completed.
			return fmt.Errorf("task %s: its run exceeded max_duration at %s: %w", q.id, run.Run().ExpiresAt.UTC().Format(time.RFC3339Nano), ErrTaskFinished)
		}
		if err := q.fn(tx, of); err != nil {
			return err
		}
		q.out = tx.Task()
		return nil
	})
	of.settle(err)
	if err != nil && len(batch) > 1 && r.refused(err) {
		// The database refused the batch as a whole: one report it cannot
		// store must not fail the others. Each is written alone.
		return alone(r, batch, r.applyReports)
	}
	var retry []*reportReq
	for i, q := range batch {
		switch {
		case err != nil:
			q.fail(err)
		case errors.Is(errs[i], store.ErrRetry):
			q.out = nil
			retry = append(retry, q)
			continue
		case errs[i] != nil:
			q.fail(errs[i])
		}
		q.finish()
	}
	return retry
}
