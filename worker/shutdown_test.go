package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/testwait"
	"github.com/ferryhq/ferry/worker"
)

// scripted is a Source whose claims answer from a script, then long-poll
// until their context ends; it records reports and counts heartbeats.
type scripted struct {
	mu        sync.Mutex
	claims    [][]client.ClaimedTask
	fails     []string
	completes []string
	// heartbeat, if set, answers heartbeats.
	heartbeat func(ctx context.Context, id string) (client.HeartbeatResult, error)
}

func (s *scripted) ClaimTasks(ctx context.Context, _ client.ClaimRequest) ([]client.ClaimedTask, error) {
	s.mu.Lock()
	if len(s.claims) > 0 {
		out := s.claims[0]
		s.claims = s.claims[1:]
		s.mu.Unlock()
		return out, nil
	}
	s.mu.Unlock()
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *scripted) Heartbeat(ctx context.Context, id, _ string, lease time.Duration) (client.HeartbeatResult, error) {
	if s.heartbeat != nil {
		return s.heartbeat(ctx, id)
	}
	return client.HeartbeatResult{LeaseUntil: time.Now().Add(lease)}, nil
}

func (s *scripted) CompleteTask(_ context.Context, id, _ string, _ any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.completes = append(s.completes, id)
	return nil
}

func (s *scripted) FailTask(_ context.Context, id, _, msg string, retryable bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fails = append(s.fails, fmt.Sprintf("%s: %s (retryable %v)", id, msg, retryable))
	return nil
}

func (s *scripted) reported() (fails, completes []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.fails...), append([]string(nil), s.completes...)
}

func scriptedTask(id string) client.ClaimedTask {
	return client.ClaimedTask{ID: id, Type: "script.t.v1", Attempt: 1, MaxAttempts: 3, LeaseToken: "tok-" + id, LeaseUntil: time.Now().Add(time.Minute)}
}

// TestPrefetchedTaskDoesNotHoldShutdown: a prefetched task waiting for a
// slot when Run's context ends does not keep the shutdown timer from
// running: the handler in flight is cancelled at ShutdownTimeout, Run
// returns, and the prefetched task is not started with a dead context.
func TestPrefetchedTaskDoesNotHoldShutdown(t *testing.T) {
	src := &scripted{claims: [][]client.ClaimedTask{{scriptedTask("a"), scriptedTask("b")}}}
	w := newWorker(t, src, worker.Config{Types: []string{"script.%"}, Concurrency: 1, Prefetch: 1, Lease: 5 * time.Second, ShutdownTimeout: 300 * time.Millisecond, NoEager: true})
	started := make(chan string, 4)
	causes := make(chan error, 4)
	w.Handle("script.t.v1", func(ctx context.Context, task *worker.Task) (any, error) {
		started <- task.ID
		<-ctx.Done() // a long handler: runs until the shutdown timeout
		causes <- context.Cause(ctx)
		return nil, context.Cause(ctx)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	if id := recv(t, started, "the first handler"); id != "a" {
		t.Fatalf("started %s first, want a", id)
	}
	cancel()
	if err := recv(t, done, "Run to return after the shutdown timeout"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if c := recv(t, causes, "a's cancellation"); !errors.Is(c, worker.ErrShutdown) {
		t.Errorf("a's handler was cancelled with %v, want ErrShutdown", c)
	}
	select {
	case id := <-started:
		t.Errorf("task %s started after the shutdown timeout", id)
	default:
	}
}

// panicky is a result whose encoding panics.
type panicky struct{}

func (panicky) MarshalJSON() ([]byte, error) { panic("boom in MarshalJSON") }

// TestResultEncodingPanicFailsTheAttempt: a panic while the handler's
// result is encoded (its MarshalJSON is the handler's code too) fails the
// attempt, retryable, as a panic in the handler does, rather than
// crashing the worker's process.
func TestResultEncodingPanicFailsTheAttempt(t *testing.T) {
	src := &scripted{claims: [][]client.ClaimedTask{{scriptedTask("a")}}}
	w := newWorker(t, src, worker.Config{Types: []string{"script.%"}, Lease: 5 * time.Second, NoEager: true})
	w.Handle("script.t.v1", func(context.Context, *worker.Task) (any, error) { return panicky{}, nil })
	start(t, w)
	testwait.Until(t, waitFor, "the attempt reported", func() bool {
		fails, completes := src.reported()
		return len(fails)+len(completes) > 0
	})
	if fails, completes := src.reported(); len(fails) != 1 || !strings.Contains(fails[0], "panic: boom in MarshalJSON") || !strings.HasSuffix(fails[0], "(retryable true)") || len(completes) != 0 {
		t.Fatalf("reports: fails %v completes %v, want one retryable failure with the panic", fails, completes)
	}
}

// TestTaskFinishedOnTheServerIsALostLease: a heartbeat answered
// task_finished (the server failed a final attempt whose lease ran out)
// cancels the handler with a cause matching client.ErrLeaseLost, one of
// the two documented causes, and the outcome is dropped.
func TestTaskFinishedOnTheServerIsALostLease(t *testing.T) {
	src := &scripted{claims: [][]client.ClaimedTask{{scriptedTask("a")}}}
	src.heartbeat = func(_ context.Context, id string) (client.HeartbeatResult, error) {
		return client.HeartbeatResult{}, &client.APIError{StatusCode: 409, Code: client.CodeTaskFinished, Message: "task " + id + " is failed"}
	}
	w := newWorker(t, src, worker.Config{Types: []string{"script.%"}, Lease: time.Second, NoEager: true})
	causes := make(chan error, 1)
	handled := make(chan struct{})
	w.Handle("script.t.v1", func(ctx context.Context, _ *worker.Task) (any, error) {
		defer close(handled)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ctx.Err()
	})
	r := start(t, w)
	c := recv(t, causes, "the handler's cancellation")
	if !errors.Is(c, client.ErrLeaseLost) || !errors.Is(c, client.ErrTaskFinished) {
		t.Errorf("cause %v, want one matching client.ErrLeaseLost (and ErrTaskFinished)", c)
	}
	recv(t, handled, "the handler to return")
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if fails, completes := src.reported(); len(fails) != 0 || len(completes) != 0 {
		t.Errorf("reports %v %v for a task the server finished, want none", fails, completes)
	}
}

// lateEager is a Source whose eager completions answer only when told.
type lateEager struct {
	scripted
	entered chan string
	answer  chan []client.ClaimedTask
}

func (s *lateEager) CompleteTaskAndClaim(_ context.Context, id, _ string, _ any, _ client.ClaimRequest) ([]client.ClaimedTask, error) {
	s.entered <- id
	return <-s.answer, nil
}

// signal is a slog handler that sends each message at info or above on ch.
type signal struct{ ch chan string }

func (s signal) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (s signal) Handle(_ context.Context, r slog.Record) error {
	select {
	case s.ch <- r.Message:
	default:
	}
	return nil
}
func (s signal) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s signal) WithGroup(string) slog.Handler      { return s }

// TestEagerTaskAfterShutdownTimeoutIsNotStarted: a task an eager
// completion hands over after the shutdown timeout has passed is not
// started with a cancelled context (which would fail, and spend, an
// attempt whose handler never ran): it is left to its lease.
func TestEagerTaskAfterShutdownTimeoutIsNotStarted(t *testing.T) {
	src := &lateEager{scripted: scripted{claims: [][]client.ClaimedTask{{scriptedTask("a")}}}, entered: make(chan string, 1), answer: make(chan []client.ClaimedTask, 1)}
	logs := make(chan string, 64)
	w := newWorker(t, src, worker.Config{Types: []string{"script.%"}, Lease: 5 * time.Second, ShutdownTimeout: 100 * time.Millisecond, NoBatch: true, Logger: slog.New(signal{logs})})
	var mu sync.Mutex
	var ran []string
	w.Handle("script.t.v1", func(_ context.Context, task *worker.Task) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, task.ID)
		return "ok", nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	recv(t, src.entered, "a's eager completion")
	cancel()
	for msg := ""; !strings.HasPrefix(msg, "shutdown timeout passed"); {
		msg = recv(t, logs, "the shutdown timeout")
	}
	src.answer <- []client.ClaimedTask{scriptedTask("b")}
	if err := recv(t, done, "Run"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fails, _ := src.reported(); len(ran) != 1 || len(fails) != 0 {
		t.Errorf("handlers ran for %v, failures %v; want a alone and no failure", ran, fails)
	}
}

// TestFailureMessageIsStorableText: a handler's error holding NUL or bytes
// that are not UTF-8 is reported with them replaced (U+FFFD): the server
// stores the message as text and refuses NUL, so the report would
// otherwise be refused and the outcome lost.
func TestFailureMessageIsStorableText(t *testing.T) {
	src := &scripted{claims: [][]client.ClaimedTask{{scriptedTask("a")}}}
	w := newWorker(t, src, worker.Config{Types: []string{"script.%"}, Lease: 5 * time.Second, NoEager: true})
	w.Handle("script.t.v1", func(context.Context, *worker.Task) (any, error) {
		return nil, worker.NonRetryable(errors.New("bad\x00byte \xff"))
	})
	start(t, w)
	testwait.Until(t, waitFor, "the failure reported", func() bool {
		fails, _ := src.reported()
		return len(fails) > 0
	})
	if fails, _ := src.reported(); fails[0] != "a: bad\uFFFDbyte \uFFFD (retryable false)" {
		t.Errorf("reported %q", fails[0])
	}
}
