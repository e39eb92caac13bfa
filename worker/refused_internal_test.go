package worker

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
)

// refusingSource hands out one task and refuses its completion for what
// it carries, as a server refuses a result it cannot take.
type refusingSource struct {
	mu       sync.Mutex
	given    bool
	refusals int
	failed   chan string // the final failure's message
}

func (s *refusingSource) ClaimTasks(ctx context.Context, req client.ClaimRequest) ([]client.ClaimedTask, error) {
	s.mu.Lock()
	given := s.given
	s.given = true
	s.mu.Unlock()
	if given {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return []client.ClaimedTask{{ID: "t1", Type: "r.v1", LeaseToken: "tok", Attempt: 1, MaxAttempts: 3, LeaseUntil: time.Now().Add(time.Minute)}}, nil
}

func (s *refusingSource) Heartbeat(context.Context, string, string, time.Duration) (client.HeartbeatResult, error) {
	return client.HeartbeatResult{LeaseUntil: time.Now().Add(time.Minute)}, nil
}

func (s *refusingSource) CompleteTask(context.Context, string, string, any) error {
	s.mu.Lock()
	s.refusals++
	s.mu.Unlock()
	return &client.APIError{StatusCode: http.StatusRequestEntityTooLarge, Code: client.CodeTooLarge, Message: "body over 1048576 bytes"}
}

func (s *refusingSource) FailTask(_ context.Context, _, _, msg string, retryable bool) error {
	if retryable {
		msg = "retryable: " + msg
	}
	s.failed <- msg
	return nil
}

// TestRefusedCompletionFailsTheTask: a completion the server refuses for
// what it carries (400, 413) is not retried, nor left to the task's lease
// (the handler would run again for nothing): the attempt is failed,
// final, with the server's reason.
func TestRefusedCompletionFailsTheTask(t *testing.T) {
	src := &refusingSource{failed: make(chan string, 1)}
	w := New(src, Config{NoEager: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w.Handle("r.v1", func(context.Context, *Task) (any, error) { return map[string]int{"n": 1}, nil })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	select {
	case msg := <-src.failed:
		if strings.HasPrefix(msg, "retryable: ") || !strings.Contains(msg, "refused the handler's result") || !strings.Contains(msg, "over 1048576 bytes") {
			t.Errorf("failure %q: want final, naming the server's refusal", msg)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the refused completion was not turned into a failure")
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.refusals != 1 {
		t.Errorf("the completion was sent %d times, want once (a refusal is not retried)", src.refusals)
	}
}
