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
	k := &completer{src: g, next: &next, single: func(context.Context, client.Completion) ([]client.ClaimedTask, error) {
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
