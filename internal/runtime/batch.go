package runtime

import (
	"context"
	"errors"
	"sync"
)

// Writes that arrive together are applied together: reports of workers
// (complete, fail) and triggers wait while a batch is being written and go
// into the next one, a single transaction. Each request is still checked,
// applied and answered on its own (a failing one drops only its own
// writes), and nothing is answered before its batch commits. Under load a
// transaction per request becomes a transaction per batch; alone, a request
// is written at once.
const (
	maxBatch = 128
	// batchLanes is how many batches of a kind may be in flight at once:
	// while one commits the next fills. On Postgres they also use more
	// connections.
	batchLanes = 2
)

var errClosed = errors.New("runtime closed")

// request is one write waiting for its batch.
type request interface {
	context() context.Context
	finish() // answers the caller
}

type batcher[R request] struct {
	reqs  chan R
	apply func(batch []R) (retry []R)
	once  sync.Once
	wg    *sync.WaitGroup
	stop  <-chan struct{}
}

func newBatcher[R request](stop <-chan struct{}, wg *sync.WaitGroup, apply func([]R) []R) *batcher[R] {
	return &batcher[R]{reqs: make(chan R, 4*maxBatch), apply: apply, wg: wg, stop: stop}
}

// do submits q and waits for its answer. It waits even if q's context ends
// once q is submitted: q may be in a transaction already, and the caller
// must learn whether it committed.
func (b *batcher[R]) do(q R, done <-chan struct{}) error {
	b.once.Do(func() {
		for range batchLanes {
			b.wg.Add(1)
			go b.loop()
		}
	})
	select {
	case b.reqs <- q:
	case <-q.context().Done():
		return q.context().Err()
	case <-b.stop:
		return errClosed
	}
	<-done
	return nil
}

func (b *batcher[R]) loop() {
	defer b.wg.Done()
	var carry []R // to retry: they shared a run or key with another request
	for {
		batch := carry
		carry = nil
		if len(batch) == 0 {
			select {
			case q := <-b.reqs:
				batch = append(batch, q)
			case <-b.stop:
				return
			}
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case q := <-b.reqs:
				batch = append(batch, q)
			default:
				break fill
			}
		}
		carry = b.apply(batch)
	}
}

// Close stops the batchers after the batches in flight; the store is closed
// by its owner afterwards.
func (r *Runtime) Close() {
	r.closeOnce.Do(func() { close(r.closed) })
	r.batchWG.Wait()
}
