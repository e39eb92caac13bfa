package worker_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/testwait"
	"github.com/ferryhq/ferry/worker"
)

// handsOverTwo is a source whose completion of a hands over b and c (more
// than the one asked for), and whose heartbeat for c says its lease was
// taken.
type handsOverTwo struct {
	scripted
	cChecked chan struct{}
}

func (s *handsOverTwo) CompleteTaskAndClaim(_ context.Context, id, _ string, _ any, _ client.ClaimRequest) ([]client.ClaimedTask, error) {
	if id == "a" {
		return []client.ClaimedTask{scriptedTask("b"), scriptedTask("c")}, nil
	}
	return nil, nil
}

func (s *handsOverTwo) Heartbeat(_ context.Context, id, _ string, lease time.Duration) (client.HeartbeatResult, error) {
	if id == "c" {
		close(s.cChecked)
		return client.HeartbeatResult{}, &client.APIError{StatusCode: 409, Code: client.CodeStaleLease, Message: "stale"}
	}
	return client.HeartbeatResult{LeaseUntil: time.Now().Add(lease)}, nil
}

// TestHandedOverTaskWaitingALeaseIsChecked: a task handed over with
// another by one completion waits in the slot while the other runs; once
// it has waited half its lease it is checked with a heartbeat before its
// handler starts, counted from its own hand-over, and not run when its
// lease was taken. (Found by an audit: its wait counted from when the
// task before it finished, and it ran a second time.)
func TestHandedOverTaskWaitingALeaseIsChecked(t *testing.T) {
	src := &handsOverTwo{scripted: scripted{claims: [][]client.ClaimedTask{{scriptedTask("a")}}}, cChecked: make(chan struct{})}
	w := newWorker(t, src, worker.Config{Types: []string{"script.%"}, Concurrency: 1, Lease: time.Second, NoBatch: true})
	var mu sync.Mutex
	var ran []string
	w.Handle("script.t.v1", func(ctx context.Context, task *worker.Task) (any, error) {
		mu.Lock()
		ran = append(ran, task.ID)
		mu.Unlock()
		if task.ID == "b" {
			time.Sleep(1500 * time.Millisecond) // a handler longer than c's lease: the scenario, not a wait
		}
		return "ok", nil
	})
	r := start(t, w)
	select {
	case <-src.cChecked:
	case <-time.After(20 * time.Second):
		t.Fatal("c was never checked before its handler")
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(ran, "c") {
		t.Fatalf("c ran although its lease was taken while it waited: ran %v", ran)
	}
}

// downFor is a source unreachable for its first outage (a server
// restarting): completions fail with a network error meanwhile.
type downFor struct {
	scripted
	until    time.Time
	attempts atomic.Int32
}

func (s *downFor) CompleteTask(ctx context.Context, id, tok string, r any) error {
	s.attempts.Add(1)
	if time.Now().Before(s.until) {
		return errors.New("dial tcp 127.0.0.1:8080: connect: connection refused")
	}
	return s.scripted.CompleteTask(ctx, id, tok, r)
}

// TestReportOutlivesAShortOutage: a completion that fails while the
// server restarts for a few seconds is retried while the lease lasts and
// arrives once the server is back. (Found by an audit: five attempts in
// about a second and a half, then the completion was dropped and the
// handler ran again after the lease.)
func TestReportOutlivesAShortOutage(t *testing.T) {
	src := &downFor{scripted: scripted{claims: [][]client.ClaimedTask{{scriptedTask("a")}}}, until: time.Now().Add(3 * time.Second)}
	w := newWorker(t, src, worker.Config{Types: []string{"script.%"}, Lease: 30 * time.Second, NoEager: true, NoBatch: true})
	w.Handle("script.t.v1", func(ctx context.Context, task *worker.Task) (any, error) { return "ok", nil })
	start(t, w)
	testwait.Until(t, 20*time.Second, "the completion after the outage", func() bool {
		_, completes := src.reported()
		return len(completes) == 1
	})
	if n := src.attempts.Load(); n < 2 {
		t.Errorf("%d attempts: the outage was not met", n)
	}
}
