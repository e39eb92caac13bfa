package worker

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
)

// blockingBeats is a Source whose heartbeats wait until their context
// ends and then say why.
type blockingBeats struct {
	Source
	entered chan struct{}
	ended   chan error
}

func (s *blockingBeats) Heartbeat(ctx context.Context, _, _ string, _ time.Duration) (client.HeartbeatResult, error) {
	s.entered <- struct{}{}
	<-ctx.Done()
	s.ended <- ctx.Err()
	return client.HeartbeatResult{}, ctx.Err()
}

// TestHeartbeatsEndWithTheirRun: a task's heartbeats are bound to the Run
// that started its handler, so a handler abandoned at shutdown stops
// extending its lease once Run returns (the task is then handed out again
// when the lease ends): the heartbeat in flight is cancelled, not left to
// its own timeout, and no reason to drop the outcome is recorded.
func TestHeartbeatsEndWithTheirRun(t *testing.T) {
	src := &blockingBeats{entered: make(chan struct{}, 1), ended: make(chan error, 1)}
	// A 3 s lease: heartbeats every second, each given a second.
	w := New(src, Config{Lease: 3 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	run, endRun := context.WithCancel(context.Background())
	_, cancelHandler := context.WithCancelCause(context.Background())
	defer cancelHandler(nil)
	b := w.heartbeat(run, taskLog{base: w.log}, client.ClaimedTask{ID: "a", LeaseToken: "tok"}, time.Now(), cancelHandler)
	select {
	case <-src.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat within 10s")
	}
	endRun()
	select {
	case err := <-src.ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the heartbeat in flight ended with %v, want it cancelled with its run", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the heartbeat in flight did not end within 10s of its run")
	}
	if reason := b.stop(); reason != nil {
		t.Errorf("stop after the run ended: %v, want no reason", reason)
	}
}
