package runtime

import (
	"errors"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
)

func TestAttemptOutcome(t *testing.T) {
	for _, c := range []struct {
		res  httpstep.Result
		want string
	}{
		{httpstep.Result{StatusCode: 200}, "2xx"},
		{httpstep.Result{StatusCode: 204}, "2xx"},
		{httpstep.Result{StatusCode: 302}, "3xx"},
		{httpstep.Result{StatusCode: 429}, "4xx"},
		{httpstep.Result{StatusCode: 503}, "5xx"},
		{httpstep.Result{StatusCode: 101}, "1xx"},
		{httpstep.Result{Err: errors.New("refused")}, "error"},
		{httpstep.Result{StatusCode: 200, Err: errors.New("body cut")}, "error"},
		// A response whose body broke off counts by its status, as the
		// step records it (workflow-format.md): only a 2xx's is no
		// answer. (Found by an audit: they counted as errors, "no
		// response".)
		{httpstep.Result{StatusCode: 503, Err: errors.New("body cut"), Truncated: true}, "5xx"},
		{httpstep.Result{StatusCode: 400, Err: errors.New("body cut")}, "4xx"},
		{httpstep.Result{StatusCode: 0}, "error"},
		{httpstep.Result{StatusCode: 600}, "error"},
	} {
		if got := attemptOutcome(c.res); got != c.want {
			t.Errorf("%+v: %q, want %q", c.res, got, c.want)
		}
	}
}

// A task leased as it was created is claimable from its run_at, or from
// its creation when run_at was already past.
func TestCreatedClaimable(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ahead := &store.Task{CreatedAt: t0, RunAt: t0.Add(time.Minute)}
	past := &store.Task{CreatedAt: t0, RunAt: t0.Add(-time.Minute)}
	if got := createdClaimable(ahead); !got.Equal(t0.Add(time.Minute)) {
		t.Errorf("scheduled ahead: %v", got)
	}
	if got := createdClaimable(past); !got.Equal(t0) {
		t.Errorf("run_at in the past: %v", got)
	}
}
