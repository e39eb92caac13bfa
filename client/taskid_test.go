package client_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/ferryhq/ferry/client"
)

// TestRunTaskStepHasItsTaskID: a started task step's task_id, which the
// server sends (the OpenAPI TaskResult), is in the typed result and in the
// run encoded again.
func TestRunTaskStepHasItsTaskID(t *testing.T) {
	c, _ := startServer(t)
	ctx := context.Background()
	if _, err := c.CreateWorkflow(ctx, []byte(`{"name": "tw", "tasks": {"s": {"task": {"type": "tid.t.v1"}}}}`)); err != nil {
		t.Fatal(err)
	}
	res, _, err := c.Trigger(ctx, "tw", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	run := waitRun(t, c, res.RunID, func(r *client.Run) bool { return r.Task("s") != nil && r.Task("s").Status == client.StepRunning })
	var raw struct {
		Tasks map[string]map[string]any `json:"tasks"`
	}
	if err := json.Unmarshal(run.Raw, &raw); err != nil {
		t.Fatal(err)
	}
	wire, _ := raw.Tasks["s"]["task_id"].(string)
	if wire == "" || run.Task("s").TaskID != wire {
		t.Fatalf("server sent task_id %q, typed result %q", wire, run.Task("s").TaskID)
	}
	again, _ := json.Marshal(run)
	if err := json.Unmarshal(again, &raw); err != nil || raw.Tasks["s"]["task_id"] != wire {
		t.Errorf("re-encoded run %s: task_id lost", again)
	}
}
