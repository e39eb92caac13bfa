package runtime

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// Workers' reports (complete, fail) are applied in batches: reports that
// arrive while a batch is being written wait and go together into the next
// one, a single transaction in which each report's run advances. Each report
// is still checked, applied and answered on its own (a failing one drops
// only its own writes), and nothing is answered before its batch commits.
// Under load this turns a transaction per step into a transaction per
// batch; alone, a report is written at once.
const (
	maxReportBatch = 128
	// reportLanes is how many batches may be in flight at once: while one
	// commits the next fills. On Postgres they also use more connections.
	reportLanes = 2
)

var errClosed = errors.New("runtime closed")

type reportReq struct {
	ctx   context.Context
	id    string
	token string
	fn    func(tx store.TaskTx) error
	out   *store.Task
	err   error
	done  chan struct{}
}

func (r *Runtime) startReporters() {
	r.reportOnce.Do(func() {
		for range reportLanes {
			r.reportWG.Add(1)
			go r.reportLoop()
		}
	})
}

// Close stops the report batchers after the batches in flight; the store is
// closed by its owner afterwards.
func (r *Runtime) Close() {
	r.closeOnce.Do(func() { close(r.closed) })
	r.reportWG.Wait()
}

// reportTask runs a worker's report under the task's lock after checking
// the lease token (the fence against stale workers).
func (r *Runtime) reportTask(ctx context.Context, id, token string, fn func(tx store.TaskTx) error) (*store.Task, error) {
	r.startReporters()
	q := &reportReq{ctx: ctx, id: id, token: token, fn: fn, done: make(chan struct{})}
	select {
	case r.reports <- q:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-r.closed:
		return nil, errClosed
	}
	// Wait even if ctx ends: the report may be in a transaction already,
	// and the caller must learn whether it committed.
	<-q.done
	return q.out, q.err
}

func (r *Runtime) reportLoop() {
	defer r.reportWG.Done()
	var carry []*reportReq // deferred by ErrRetry: same run as another report
	for {
		batch := carry
		carry = nil
		if len(batch) == 0 {
			select {
			case q := <-r.reports:
				batch = append(batch, q)
			case <-r.closed:
				return
			}
		}
	fill:
		for len(batch) < maxReportBatch {
			select {
			case q := <-r.reports:
				batch = append(batch, q)
			default:
				break fill
			}
		}
		carry = r.applyReports(batch)
	}
}

// applyReports writes a batch and answers every report in it except those
// to retry, which it returns.
func (r *Runtime) applyReports(batch []*reportReq) []*reportReq {
	ids := make([]string, len(batch))
	for i, q := range batch {
		ids[i] = q.id
	}
	errs, err := r.st.InTasks(context.Background(), ids, r.clk.Now(), func(i int, tx store.TaskTx) error {
		q := batch[i]
		t := tx.Task()
		if t.LeaseToken == "" || t.LeaseToken != q.token {
			return fmt.Errorf("task %s: %w", q.id, ErrStaleLease)
		}
		if t.Status != status.TaskLeased {
			return fmt.Errorf("task %s is %s: %w", q.id, t.Status, ErrTaskFinished)
		}
		if err := q.fn(tx); err != nil {
			return err
		}
		q.out = tx.Task()
		return nil
	})
	var retry []*reportReq
	for i, q := range batch {
		switch {
		case err != nil:
			q.err, q.out = err, nil
		case errors.Is(errs[i], store.ErrRetry):
			q.out = nil
			retry = append(retry, q)
			continue
		case errs[i] != nil:
			q.err, q.out = errs[i], nil
		}
		close(q.done)
	}
	return retry
}
