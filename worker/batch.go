package worker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// once, at most. A completion goes out at once while fewer are in flight,
// so a worker with up to that many handlers finishing at a time sends
// each alone, as without batches: at 4, chain10 over HTTP at 16 handlers
// lost a fifth of its runs a second on Postgres (its steps' reports
// waited for one another's round trips), while at 32 it ran as without
// batches. Past that, completions queue and leave together in the next
// request.
const maxReportsInFlight = 32

// reportsInFlight is the limit for a worker of this many handlers: 32 up
// to 256 handlers, fewer above, down to 4, so that a worker of many
// handlers, whose reports come in bursts, sends fuller requests. jobs'
// 2,000 handlers over HTTP sent ≈4,500 requests for 20,000 completions at
// 32 and ≈800 at 4, which ran faster (+72 and +81 % against +49 and +29
// % over single completions, SQLite and Postgres).
func reportsInFlight(handlers int) int {
	if handlers <= 256 {
		return maxReportsInFlight
	}
	return max(4, maxReportsInFlight*256/handlers)
}

// completer coalesces completions into CompleteTasks calls. A handler's
// completion waits for its own answer, as it does in a call of its own;
// a failed request fails each of its completions, which the worker's
// report then retries as it would a single one.
type completer struct {
	src  BatchSource
	next func() *client.ClaimRequest // nil: completions ask for no next task
	// limit is how many requests may be in flight (reportsInFlight; 0:
	// maxReportsInFlight). It is a completer's: a Run's two (with and
	// without eager dispatch) overlap only at its shutdown, when
	// completions stop asking for more.
	limit int
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
//
// A completion that finds a request free is sent from its caller's
// goroutine, not handed to another: the hop cost a step over HTTP a
// wake-up on a busy machine, and on Postgres made the report batches
// wait out their window for steps that came back later (chain10 at 16
// handlers −15 %).
func (k *completer) complete(ctx context.Context, c client.Completion) ([]client.ClaimedTask, error) {
	k.mu.Lock()
	if k.unsupported {
		k.mu.Unlock()
		return k.single(ctx, c)
	}
	p := &completion{c: c, done: make(chan struct{})}
	k.queue = append(k.queue, p)
	if k.inFlight < max(cmp.Or(k.limit, maxReportsInFlight), 1) {
		k.inFlight++
		batch := k.take()
		k.mu.Unlock()
		k.send(batch)
		// What queued meanwhile goes on in a goroutine: this caller has
		// its answer.
		k.mu.Lock()
		if len(k.queue) > 0 {
			go k.flush()
		} else {
			k.inFlight--
		}
		k.mu.Unlock()
	} else {
		k.mu.Unlock()
	}
	<-p.done
	return p.next, p.err
}

// maxBatchBytes bounds the results one request carries: half the
// server's limit on the request (16 MiB), leaving room for the rest. A
// completion larger than that goes alone.
const maxBatchBytes = 8 << 20

// flush sends what is queued until the queue is empty, holding one of
// the requests in flight.
func (k *completer) flush() {
	for {
		k.mu.Lock()
		batch := k.take()
		if len(batch) == 0 {
			k.inFlight--
			k.mu.Unlock()
			return
		}
		k.mu.Unlock()
		k.send(batch)
	}
}

// take removes the next request's completions from the queue, up to
// client.MaxCompleteBatch of them and maxBatchBytes of results (at least
// one); the caller holds k.mu.
func (k *completer) take() []*completion {
	var batch []*completion
	ids := map[string]bool{}
	size := 0
	rest := make([]*completion, 0, len(k.queue))
	for i, p := range k.queue {
		size += resultSize(p.c.Result)
		full := len(batch) == client.MaxCompleteBatch || (len(batch) > 0 && size > maxBatchBytes)
		if full {
			rest = append(rest, k.queue[i:]...)
			break
		}
		if ids[p.c.ID] {
			// The server refuses a request naming a task twice; the
			// second report of one task waits for the next request.
			size -= resultSize(p.c.Result)
			rest = append(rest, p)
			continue
		}
		ids[p.c.ID] = true
		batch = append(batch, p)
	}
	k.queue = rest
	return batch
}

func (k *completer) send(batch []*completion) {
	k.mu.Lock()
	unsupported := k.unsupported
	k.mu.Unlock()
	if unsupported {
		k.sendAlone(batch) // queued before the server said it has no batches
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
	defer cancel()
	cs := make([]client.Completion, len(batch))
	for i, p := range batch {
		cs[i] = p.c
	}
	var next *client.ClaimRequest
	if k.next != nil {
		next = k.next()
	}
	res, err := k.src.CompleteTasks(ctx, cs, next)
	switch {
	case isNoEndpoint(err):
		// A server from before the batch endpoint: from now on each
		// completion goes alone, as before. (Until the worker restarts:
		// behind a balancer in a rolling upgrade, batches come back with
		// the next Run.)
		k.mu.Lock()
		k.unsupported = true
		k.mu.Unlock()
		k.sendAlone(batch)
		return
	case len(batch) > 1 && refusedWhole(err):
		// A request refused as a whole (4xx) says nothing of each
		// completion, which alone might have gone through: each goes
		// alone, so that only a bad one is refused.
		k.sendAlone(batch)
		return
	case err == nil && len(res) != len(batch):
		err = fmt.Errorf("worker: %d answers for %d completions", len(res), len(batch))
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

// sendAlone sends each completion of batch in a request of its own, at
// once, each with its own timeout.
func (k *completer) sendAlone(batch []*completion) {
	var wg sync.WaitGroup
	for _, p := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
			defer cancel()
			p.next, p.err = k.single(ctx, p.c)
			close(p.done)
		}()
	}
	wg.Wait()
}

// refusedWhole: the server refused the request itself (4xx), not one of
// its completions; a timeout or too many requests (408, 429) is worth a
// retry as it is.
func refusedWhole(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && ae.StatusCode >= 400 && ae.StatusCode < 500 && ae.StatusCode != http.StatusRequestTimeout && ae.StatusCode != http.StatusTooManyRequests
}

// resultSize is how many bytes a completion's result takes in a request,
// where it is known (the worker sends raw JSON).
func resultSize(v any) int {
	if raw, ok := v.(json.RawMessage); ok {
		return len(raw)
	}
	return 0
}

// isNoEndpoint: the server has no such endpoint (404 not_found for the
// path, or 405 where another route shares it).
func isNoEndpoint(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && (ae.StatusCode == http.StatusNotFound || ae.StatusCode == http.StatusMethodNotAllowed)
}
