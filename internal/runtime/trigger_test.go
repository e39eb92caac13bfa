package runtime_test

import (
	"testing"

	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/store"
)

// TestTriggerSeesWorkflowChangesFromElsewhere: Trigger resolves workflows
// from a cache, yet a change made past this runtime (another server, here
// the store directly) applies to the next trigger: a new version is used,
// a disabled workflow refuses, a renamed one is no longer found by its
// old name, a deleted one not at all.
func TestTriggerSeesWorkflowChangesFromElsewhere(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		wf := e.workflow(t, `{"name": "cached", "tasks": {"nap": {"sleep": "1h"}}}`)
		if r := e.trigger(t, "cached", `{}`); r.Version != 1 {
			t.Fatalf("first run at version %d, want 1", r.Version)
		}
		elsewhere := func(src, name string, enabled bool) {
			t.Helper()
			def, err := spec.Parse([]byte(src), spec.Limits{})
			must(t, err, "spec.Parse")
			_, err = e.st.UpdateWorkflow(ctx, wf.ID, &store.Workflow{Name: name, Definition: def.Source, Fingerprint: def.Fingerprint(), Enabled: enabled})
			must(t, err, "UpdateWorkflow")
		}
		v2 := `{"name": "cached", "tasks": {"nap": {"sleep": "2h"}}}`
		elsewhere(v2, "cached", true)
		if r := e.trigger(t, "cached", `{}`); r.Version != 2 {
			t.Fatalf("run after the update at version %d, want 2", r.Version)
		}
		elsewhere(v2, "cached", false)
		_, _, err := e.rt.Trigger(ctx, runtime.TriggerRequest{Workflow: "cached"})
		wantIs(t, err, runtime.ErrDisabled, "trigger of a workflow disabled elsewhere")
		elsewhere(v2, "renamed", true)
		_, _, err = e.rt.Trigger(ctx, runtime.TriggerRequest{Workflow: "cached"})
		wantIs(t, err, store.ErrNotFound, "trigger by the old name")
		if r := e.trigger(t, "renamed", `{}`); r.WorkflowName != "renamed" {
			t.Fatalf("run by the new name has workflow name %q", r.WorkflowName)
		}
		must(t, e.st.DeleteWorkflow(ctx, wf.ID), "DeleteWorkflow")
		_, _, err = e.rt.Trigger(ctx, runtime.TriggerRequest{Workflow: "renamed"})
		wantIs(t, err, store.ErrNotFound, "trigger of a deleted workflow")
		counts, err := e.st.CountRuns(ctx, wf.ID)
		must(t, err, "CountRuns")
		total := 0
		for _, n := range counts {
			total += n
		}
		if total != 3 {
			t.Errorf("%d runs written, want 3 (%v)", total, counts)
		}
	})
}
