package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
)

// gatedBatches is a BatchSource whose calls wait for release, recording
// each call's completions; a completion whose id starts with "stale" is
// refused, and each other one is handed a next task named after it.
type gatedBatches struct {
	mu      sync.Mutex
	calls   [][]string
	release chan struct{}
	entered chan struct{}
	fail    error
	// failIf, if set, is the error of a call of these completions.
	failIf func(cs []client.Completion) error
	// short answers one completion fewer than asked.
	short bool
}

func (g *gatedBatches) CompleteTasks(_ context.Context, cs []client.Completion, next *client.ClaimRequest) ([]client.CompletionResult, error) {
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	g.mu.Lock()
	g.calls = append(g.calls, ids)
	g.mu.Unlock()
	g.entered <- struct{}{}
	<-g.release
	if g.fail != nil {
		return nil, g.fail
	}
	if g.failIf != nil {
		if err := g.failIf(cs); err != nil {
			return nil, err
		}
	}
	out := make([]client.CompletionResult, len(cs))
	for i, c := range cs {
		out[i].ID = c.ID
		switch {
		case len(c.ID) >= 5 && c.ID[:5] == "stale":
			out[i].Err = &client.APIError{StatusCode: http.StatusConflict, Code: client.CodeStaleLease}
		case next != nil:
			out[i].Next = []client.ClaimedTask{{ID: "after-" + c.ID}}
		}
	}
	if g.short {
		out = out[1:]
	}
	return out, nil
}

// waitFor waits until cond holds (a deadline, not a sleep).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCompleterBatchesWhileBusy: completions go out at once while fewer
// than maxReportsInFlight requests are in flight; past that they queue
// and leave together, and each caller gets its own answer.
func TestCompleterBatchesWhileBusy(t *testing.T) {
	g := &gatedBatches{release: make(chan struct{}), entered: make(chan struct{}, 100)}
	next := client.ClaimRequest{Types: []string{"x"}, Max: 1}
	k := &completer{src: g, next: func() *client.ClaimRequest { return &next }, single: func(context.Context, client.Completion) ([]client.ClaimedTask, error) {
		t.Error("a completion went alone")
		return nil, nil
	}}
	type answer struct {
		next []client.ClaimedTask
		err  error
	}
	const queued = 6
	answers := make([]answer, maxReportsInFlight+queued)
	var wg sync.WaitGroup
	complete := func(i int, id string) {
		defer wg.Done()
		n, err := k.complete(context.Background(), client.Completion{ID: id, LeaseToken: "t"})
		answers[i] = answer{n, err}
	}
	// The first maxReportsInFlight go out alone, each in a request of
	// its own.
	for i := range maxReportsInFlight {
		wg.Add(1)
		go complete(i, fmt.Sprintf("a%d", i))
		<-g.entered
	}
	// The next six queue behind them.
	stale := maxReportsInFlight + 3
	for i := maxReportsInFlight; i < maxReportsInFlight+queued; i++ {
		wg.Add(1)
		id := fmt.Sprintf("b%d", i)
		if i == stale {
			id = "stale"
		}
		go complete(i, id)
	}
	waitFor(t, "six queued", func() bool { k.mu.Lock(); defer k.mu.Unlock(); return len(k.queue) == queued })
	close(g.release)
	wg.Wait()
	g.mu.Lock()
	calls := g.calls
	g.mu.Unlock()
	if len(calls) != maxReportsInFlight+1 || len(g.calls[maxReportsInFlight]) != 6 {
		t.Fatalf("calls %v: want %d alone, then the six queued in one", calls, maxReportsInFlight)
	}
	for i, a := range answers {
		id := fmt.Sprintf("b%d", i)
		if i < maxReportsInFlight {
			id = fmt.Sprintf("a%d", i)
		}
		if i == stale {
			if !errors.Is(a.err, client.ErrLeaseLost) || a.next != nil {
				t.Errorf("stale: %+v", a)
			}
			continue
		}
		if a.err != nil || len(a.next) != 1 || a.next[0].ID != "after-"+id {
			t.Errorf("%s: %+v", id, a)
		}
	}
	// The requests' goroutines end once the queue is empty.
	waitFor(t, "no request in flight", func() bool { k.mu.Lock(); defer k.mu.Unlock(); return k.inFlight == 0 && len(k.queue) == 0 })
}

// TestCompleterRequestFailure: a request that fails fails each of its
// completions with its error (the worker's report retries them).
func TestCompleterRequestFailure(t *testing.T) {
	boom := errors.New("connection reset")
	g := &gatedBatches{release: make(chan struct{}), entered: make(chan struct{}, 10), fail: boom}
	close(g.release)
	k := &completer{src: g}
	if _, err := k.complete(context.Background(), client.Completion{ID: "a", LeaseToken: "t"}); !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
}

// TestCompleterWithoutEndpoint: a server without the batch endpoint (404)
// gets each completion alone, that one and every later one.
func TestCompleterWithoutEndpoint(t *testing.T) {
	g := &gatedBatches{release: make(chan struct{}), entered: make(chan struct{}, 10), fail: &client.APIError{StatusCode: http.StatusNotFound, Code: "not_found"}}
	close(g.release)
	var mu sync.Mutex
	var alone []string
	k := &completer{src: g, single: func(_ context.Context, c client.Completion) ([]client.ClaimedTask, error) {
		mu.Lock()
		defer mu.Unlock()
		alone = append(alone, c.ID)
		return []client.ClaimedTask{{ID: "after-" + c.ID}}, nil
	}}
	for _, id := range []string{"a", "b"} {
		next, err := k.complete(context.Background(), client.Completion{ID: id, LeaseToken: "t"})
		if err != nil || len(next) != 1 || next[0].ID != "after-"+id {
			t.Fatalf("%s: %v %v", id, next, err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.calls) != 1 || len(alone) != 2 {
		t.Fatalf("batch calls %v, alone %v: want one batch call, then each alone", g.calls, alone)
	}
}

// TestCompleterBoundsBytes: queued completions leave in requests of at
// most maxBatchBytes of results (one larger than that alone).
func TestCompleterBoundsBytes(t *testing.T) {
	g := &gatedBatches{release: make(chan struct{}), entered: make(chan struct{}, 100)}
	k := &completer{src: g}
	big := json.RawMessage(`"` + strings.Repeat("x", 3<<20) + `"`)
	huge := json.RawMessage(`"` + strings.Repeat("x", 9<<20) + `"`)
	var wg sync.WaitGroup
	send := func(id string, res json.RawMessage) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := k.complete(context.Background(), client.Completion{ID: id, LeaseToken: "t", Result: res}); err != nil {
				t.Error(err)
			}
		}()
	}
	for i := range maxReportsInFlight {
		send(fmt.Sprintf("a%d", i), nil)
		<-g.entered
	}
	for i, id := range []string{"b1", "b2", "b3", "b4", "h"} {
		res := big
		if id == "h" {
			res = huge
		}
		send(id, res) // one at a time, so that the queue is in this order
		waitFor(t, id+" queued", func() bool { k.mu.Lock(); defer k.mu.Unlock(); return len(k.queue) == i+1 })
	}
	close(g.release)
	wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	var got []string
	for _, c := range g.calls[maxReportsInFlight:] {
		got = append(got, strings.Join(c, "+"))
	}
	// The queue is taken in order: two of 3 MiB fit in 8, a third does
	// not; the 9 MiB one goes alone. (The requests may be sent in any
	// order: several loops take from the queue.)
	slices.Sort(got)
	if want := "b1+b2 b3+b4 h"; strings.Join(got, " ") != want {
		t.Fatalf("requests %v, want %s", got, want)
	}
}

// holdInFlight starts maxReportsInFlight completions that the source
// holds, then queued more behind them, one at a time, and returns their
// answers once the source is released (release) and all have answered.
func holdInFlight(t *testing.T, g *gatedBatches, k *completer, queued []string) (answers map[string]error, release func()) {
	t.Helper()
	answers = map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	send := func(id string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := k.complete(context.Background(), client.Completion{ID: id, LeaseToken: "t"})
			mu.Lock()
			answers[id] = err
			mu.Unlock()
		}()
	}
	for i := range maxReportsInFlight {
		send(fmt.Sprintf("a%d", i))
		<-g.entered
	}
	for i, id := range queued {
		send(id)
		waitFor(t, id+" queued", func() bool { k.mu.Lock(); defer k.mu.Unlock(); return len(k.queue) == i+1 })
	}
	return answers, func() { close(g.release); wg.Wait() }
}

// TestCompleterFallbackWhileQueued: completions queued while the requests
// in flight learn the server has no batch endpoint go alone, not in
// another batch request.
func TestCompleterFallbackWhileQueued(t *testing.T) {
	for _, status := range []int{http.StatusNotFound, http.StatusMethodNotAllowed} {
		g := &gatedBatches{release: make(chan struct{}), entered: make(chan struct{}, 100), fail: &client.APIError{StatusCode: status}}
		var alone atomic.Int32
		k := &completer{src: g, single: func(context.Context, client.Completion) ([]client.ClaimedTask, error) {
			alone.Add(1)
			return nil, nil
		}}
		answers, release := holdInFlight(t, g, k, []string{"q1", "q2", "q3"})
		release()
		for id, err := range answers {
			if err != nil {
				t.Errorf("%d: %s: %v", status, id, err)
			}
		}
		g.mu.Lock()
		calls := len(g.calls)
		g.mu.Unlock()
		if len(answers) != maxReportsInFlight+3 || int(alone.Load()) != maxReportsInFlight+3 || calls != maxReportsInFlight {
			t.Errorf("%d: %d answers, %d alone, %d batch calls", status, len(answers), alone.Load(), calls)
		}
	}
}

// TestCompleterRefusedBatchGoesAlone: a batch of several refused as a
// whole (a 4xx) is sent again completion by completion, so that only a
// bad one is refused; a single completion refused keeps its error.
func TestCompleterRefusedBatchGoesAlone(t *testing.T) {
	bad := &client.APIError{StatusCode: http.StatusBadRequest, Code: "invalid_request"}
	g := &gatedBatches{release: make(chan struct{}), entered: make(chan struct{}, 100), fail: bad}
	k := &completer{src: g, single: func(_ context.Context, c client.Completion) ([]client.ClaimedTask, error) {
		if c.ID == "q2" {
			return nil, bad
		}
		return nil, nil
	}}
	answers, release := holdInFlight(t, g, k, []string{"q1", "q2", "q3"})
	release()
	for id, err := range answers {
		want := error(nil)
		if id == "q2" || id[0] == 'a' { // refused alone, or a batch of one refused
			want = bad
		}
		if !errors.Is(err, want) && err != want {
			t.Errorf("%s: %v, want %v", id, err, want)
		}
	}
}

// TestCompleterShortAnswer: a source that answers fewer completions than
// it was sent fails them all, without a panic.
func TestCompleterShortAnswer(t *testing.T) {
	g := &gatedBatches{release: make(chan struct{}), entered: make(chan struct{}, 10), short: true}
	close(g.release)
	k := &completer{src: g}
	if _, err := k.complete(context.Background(), client.Completion{ID: "a", LeaseToken: "t"}); err == nil || !strings.Contains(err.Error(), "0 answers for 1") {
		t.Fatalf("err %v", err)
	}
}

// TestCompleterTakesATaskOncePerRequest: a task reported twice (its
// second report queued beside the first) goes in the next request, as
// the server refuses a request naming a task twice.
func TestCompleterTakesATaskOncePerRequest(t *testing.T) {
	k := &completer{}
	for _, id := range []string{"a", "a", "b", "a"} {
		k.queue = append(k.queue, &completion{c: client.Completion{ID: id}})
	}
	var got []string
	for len(k.queue) > 0 {
		var ids []string
		for _, p := range k.take() {
			ids = append(ids, p.c.ID)
		}
		got = append(got, strings.Join(ids, "+"))
	}
	if want := "a+b a a"; strings.Join(got, " ") != want {
		t.Fatalf("requests %v, want %s", got, want)
	}
}

// The worker's tests over HTTP (worker_test.go) count on 32.
func TestMaxReportsInFlight(t *testing.T) {
	if maxReportsInFlight != 32 {
		t.Fatalf("maxReportsInFlight is %d: change maxInFlight in worker_test.go with it", maxReportsInFlight)
	}
}

// TestReportsInFlight: 32 requests in flight up to 256 handlers, fewer
// above, never under 4; a completer with a limit queues past it.
func TestReportsInFlight(t *testing.T) {
	for handlers, want := range map[int]int{1: 32, 16: 32, 256: 32, 512: 16, 1024: 8, 2000: 4, 100000: 4} {
		if got := reportsInFlight(handlers); got != want {
			t.Errorf("reportsInFlight(%d) = %d, want %d", handlers, got, want)
		}
	}
	g := &gatedBatches{release: make(chan struct{}), entered: make(chan struct{}, 100)}
	k := &completer{src: g, limit: 4}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = k.complete(context.Background(), client.Completion{ID: fmt.Sprintf("a%d", i), LeaseToken: "t"})
		}()
		<-g.entered
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = k.complete(context.Background(), client.Completion{ID: "b", LeaseToken: "t"})
	}()
	waitFor(t, "the fifth queued", func() bool { k.mu.Lock(); defer k.mu.Unlock(); return len(k.queue) == 1 })
	close(g.release)
	wg.Wait()
}
