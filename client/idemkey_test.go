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
	for _, key := range []string{" order-1 ", "order-1 ", "line\n", "tab\tkey", "del\x7f"} {
		_, _, err := c.Trigger(ctx, "ik", nil, key)
		_, berr := c.TriggerBatch(ctx, "ik", []client.BatchRun{{IdempotencyKey: key}})
		if !client.HasCode(err, client.CodeInvalidRequest) || !client.HasCode(berr, client.CodeInvalidRequest) {
			t.Errorf("key %q: Trigger %v; TriggerBatch %v; want both refused (invalid_request)", key, err, berr)
		}
	}
	// A key inside keeps its spaces: one run through either path.
	one, _, err := c.Trigger(ctx, "ik", nil, "order 1")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.TriggerBatch(ctx, "ik", []client.BatchRun{{IdempotencyKey: "order 1"}})
	if err != nil || batch[0].RunID != one.RunID || batch[0].Created {
		t.Fatalf("key \"order 1\": Trigger started %s, TriggerBatch %+v %v; want the same run", one.RunID, batch, err)
	}
}
