package client_test

import (
	"context"
	"testing"

	"github.com/ferryhq/ferry/client"
)

// TestIdempotencyKeyOneRuleEverywhere: a key with spaces at its ends or a
// control character is refused alike as a header (Trigger: HTTP would
// drop the spaces, and a line break cannot be sent) and in a batch, so no
// key names one run through one path and another through the other.
// (Found by an audit: " order-1 " started two runs.)
func TestIdempotencyKeyOneRuleEverywhere(t *testing.T) {
	c, _ := startServer(t)
	ctx := context.Background()
	if _, err := c.CreateWorkflow(ctx, sleepDef("ik", "1h")); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{" order-1 ", "order-1 ", "\torder-1", "line\n", "del\x7f"} {
		_, _, err := c.Trigger(ctx, "ik", nil, key)
		_, berr := c.TriggerBatch(ctx, "ik", []client.BatchRun{{IdempotencyKey: key}})
		if !client.HasCode(err, client.CodeInvalidRequest) || !client.HasCode(berr, client.CodeInvalidRequest) {
			t.Errorf("key %q: Trigger %v; TriggerBatch %v; want both refused (invalid_request)", key, err, berr)
		}
	}
	// Spaces, tabs and other characters inside a key are kept: one run
	// through either path.
	for _, key := range []string{"order 1", "order\t2", "ordre\u00a03\u3000"} {
		one, _, err := c.Trigger(ctx, "ik", nil, key)
		if err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
		batch, err := c.TriggerBatch(ctx, "ik", []client.BatchRun{{IdempotencyKey: key}})
		if err != nil || batch[0].RunID != one.RunID || batch[0].Created {
			t.Fatalf("key %q: Trigger started %s, TriggerBatch %+v %v; want the same run", key, one.RunID, batch, err)
		}
	}
}
