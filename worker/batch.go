package worker

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/ferryhq/ferry/client"
)

// BatchSource is a Source that takes many completions in one call
// (*client.Client does, over one HTTP request). The worker then sends the
// completions of handlers that finish while its reports are in flight
// together: over HTTP a request cost a worker of many short tasks more
// than its completion did (docs/performance.md, "Through the HTTP API").
type BatchSource interface {
	CompleteTasks(ctx context.Context, cs []client.Completion, next *client.ClaimRequest) ([]client.CompletionResult, error)
}

// maxReportsInFlight is how many completion requests a completer sends at
// once. A completion goes out at once while fewer are in flight, so a
// worker with few handlers finishing waits for no other's request; past
// that, completions queue and leave together in the next request.
const maxReportsInFlight = 4

// completer coalesces completions into CompleteTasks calls. A handler's
// completion waits for its own answer, as it does in a call of its own;
// a failed request fails each of its completions, which the worker's
// report then retries as it would a single one.
type completer struct {
	src  BatchSource
	next *client.ClaimRequest // nil: completions ask for no next task
	// single sends one completion the way a Source without batches does;
	// used once the server has answered that it has no batch endpoint.
	single func(ctx context.Context, c client.Completion) ([]client.ClaimedTask, error)

	mu          sync.Mutex
	queue       []*completion
	inFlight    int
	unsupported bool
}

// completion is one handler's report waiting for its answer.
type completion struct {
	c    client.Completion
	done chan struct{}
	next []client.ClaimedTask
	err  error
}

// complete sends c, with the completions queued beside it, and returns
// its own answer. Once queued it is waited for to the end, whatever ctx
// does: its outcome must be known, and the request that takes it has a
// timeout of its own. ctx is for a completion sent alone (single).
func (k *completer) complete(ctx context.Context, c client.Completion) ([]client.ClaimedTask, error) {
	k.mu.Lock()
	if k.unsupported {
		k.mu.Unlock()
		return k.single(ctx, c)
	}
	p := &completion{c: c, done: make(chan struct{})}
	k.queue = append(k.queue, p)
	if k.inFlight < maxReportsInFlight {
		k.inFlight++
		go k.flush()
	}
	k.mu.Unlock()
	<-p.done
	return p.next, p.err
}

// flush sends what is queued, up to client.MaxCompleteBatch a request,
// until the queue is empty.
func (k *completer) flush() {
	for {
		k.mu.Lock()
		n := min(len(k.queue), client.MaxCompleteBatch)
		if n == 0 {
			k.inFlight--
			k.mu.Unlock()
			return
		}
		batch := append([]*completion(nil), k.queue[:n]...)
		k.queue = append(k.queue[:0], k.queue[n:]...)
		k.mu.Unlock()
		k.send(batch)
	}
}

func (k *completer) send(batch []*completion) {
	ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
	defer cancel()
	cs := make([]client.Completion, len(batch))
	for i, p := range batch {
		cs[i] = p.c
	}
	res, err := k.src.CompleteTasks(ctx, cs, k.next)
	if isNoEndpoint(err) {
		// A server from before the batch endpoint: from now on each
		// completion goes alone, as before.
		k.mu.Lock()
		k.unsupported = true
		k.mu.Unlock()
		var wg sync.WaitGroup
		for _, p := range batch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.next, p.err = k.single(ctx, p.c)
				close(p.done)
			}()
		}
		wg.Wait()
		return
	}
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.next, p.err = res[i].Next, res[i].Err
		}
		close(p.done)
	}
}

// isNoEndpoint: the server has no such endpoint (404 not_found for the
// path, or 405 where another route shares it).
func isNoEndpoint(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && (ae.StatusCode == http.StatusNotFound || ae.StatusCode == http.StatusMethodNotAllowed)
}
