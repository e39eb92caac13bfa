package runtime

import (
	"context"
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

// Tracer makes the spans of what the runtime does on a caller's behalf or
// at a run's request (tracing.Tracer); the spans of steps and runs come
// from the store's commits instead. Its methods must be safe for
// concurrent use.
type Tracer interface {
	// Trigger starts the span of a trigger of runs runs of workflow; the
	// function returned ends it.
	Trigger(ctx context.Context, workflow string, runs int) (context.Context, func(error))
	// Headers is a run's trigger headers h with ctx's trace context
	// recorded, unless h has one; h itself is not changed.
	Headers(ctx context.Context, h map[string]string) map[string]string
	// HTTPAttempt starts the span of an HTTP step's attempt and returns
	// the request's headers with its trace context (headers itself is not
	// changed), and the function that ends it.
	HTTPAttempt(run *store.Run, step string, attempt int, method, url string, headers map[string]string) (map[string]string, func(code int, err error))
	// Enabled tells whether spans are made: only then are tasks handed
	// out with their run's trace context.
	Enabled() bool
	// TaskParent is the traceparent a run's tasks are handed out with,
	// from the run's id and trigger headers.
	TaskParent(runID string, headers map[string]string) string
}

// noTracer is the Tracer of a runtime given none.
type noTracer struct{}

func (noTracer) Trigger(ctx context.Context, _ string, _ int) (context.Context, func(error)) {
	return ctx, func(error) {}
}
func (noTracer) Headers(_ context.Context, h map[string]string) map[string]string { return h }
func (noTracer) Enabled() bool                                                    { return false }
func (noTracer) TaskParent(string, map[string]string) string                      { return "" }
func (noTracer) HTTPAttempt(_ *store.Run, _ string, _ int, _, _ string, h map[string]string) (map[string]string, func(int, error)) {
	return h, func(int, error) {}
}

// createdClaimable is when a task leased as it was created (to a waiting
// claim, or to the worker whose completion started it) became claimable:
// its run_at, or its creation if that was later.
func createdClaimable(t *store.Task) time.Time {
	if t.CreatedAt.After(t.RunAt) {
		return t.CreatedAt
	}
	return t.RunAt
}
