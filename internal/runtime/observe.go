package runtime

import (
	"time"

	"github.com/ferryhq/ferry/internal/store"
)

// Observer learns what the runtime measures as it works, for metrics.
// Its methods run on the runtime's hot paths: they must be quick, safe
// for concurrent use, and must not call back into the runtime.
type Observer interface {
	// TimerFired: a timer of this kind (store.KindWake, KindWaitTimeout,
	// KindRunExpire) was applied late after its due time, in a
	// transaction that committed.
	TimerFired(kind string, late time.Duration)
	// TaskHandedOut: a claim (or a completion's eager claim) handed a
	// task to a worker wait after it became claimable.
	TaskHandedOut(wait time.Duration)
	// HTTPAttempt: an HTTP step's attempt ended with outcome ("2xx" …
	// "5xx", or "error" when no response came) after took.
	HTTPAttempt(outcome string, took time.Duration)
}

// noObserver is the Observer of a runtime given none.
type noObserver struct{}

func (noObserver) TimerFired(string, time.Duration)  {}
func (noObserver) TaskHandedOut(time.Duration)       {}
func (noObserver) HTTPAttempt(string, time.Duration) {}

// createdClaimable is when a task leased as it was created (to a waiting
// claim, or to the worker whose completion started it) became claimable:
// its run_at, or its creation if that was later.
func createdClaimable(t *store.Task) time.Time {
	if t.CreatedAt.After(t.RunAt) {
		return t.CreatedAt
	}
	return t.RunAt
}
