package runtime

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
)

// TestSweepFindsFinalLeasesBehindOthers: 500 expired leases with attempts
// left (a type whose workers all died) do not hide a final attempt's
// expired lease from the minute sweep. (Found by an audit: the sweep read
// the first 500 expired leases and skipped those with attempts left.)
func TestSweepFindsFinalLeasesBehindOthers(t *testing.T) {
	r, s, clk := newInternal(t)
	for range 500 {
		if _, _, err := r.CreateTask(t.Context(), NewTask{Type: "t.spare.v1", MaxAttempts: 3}); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		if got, err := r.ClaimTasks(t.Context(), ClaimRequest{Types: []string{"t.spare.v1"}, WorkerID: "w", Lease: time.Minute, Max: 100}); err != nil || len(got) != 100 {
			t.Fatalf("claim: %v %d", err, len(got))
		}
	}
	last, _, err := r.CreateTask(t.Context(), NewTask{Type: "t.last.v1", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.ClaimTasks(t.Context(), ClaimRequest{Types: []string{"t.last.v1"}, WorkerID: "w", Lease: 2 * time.Minute, Max: 1}); err != nil || len(got) != 1 {
		t.Fatalf("claim last: %v", err)
	}
	clk.Advance(3 * time.Minute)
	r.failExhaustedLeases(t.Context())
	if got, err := s.GetTask(t.Context(), last.ID); err != nil || got.Status != status.TaskFailed || got.Attempt != 1 {
		t.Errorf("the final attempt's lease ended a minute ago and the sweep ran: task %+v %v, want failed at attempt 1", got, err)
	}
	// The others, with attempts left, are the next claim's, not failed.
	if got, err := r.ClaimTasks(t.Context(), ClaimRequest{Types: []string{"t.spare.v1"}, WorkerID: "w", Lease: time.Minute, Max: 100}); err != nil || len(got) != 100 {
		t.Errorf("reclaim of leases with attempts left: %d, %v; want 100", len(got), err)
	}
}
