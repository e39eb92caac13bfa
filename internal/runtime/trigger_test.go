package runtime_test

import (
	"encoding/json"
	"fmt"
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

// TestTriggerBatch: one call starts many runs in request order, keys
// repeated within the batch or used before return the first run, and a
// refused batch starts nothing.
func TestTriggerBatch(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		wf := e.workflow(t, `{"name": "bulk", "tasks": {"nap": {"sleep": "1h"}}}`)
		first := e.trigger(t, "bulk", `{"i": -1}`)
		_, _, err := e.rt.Trigger(ctx, runtime.TriggerRequest{Workflow: "bulk", Input: json.RawMessage(`{"i":-2}`), IdempotencyKey: "used"})
		must(t, err, "Trigger with a key")
		var reqs []runtime.TriggerRequest
		for i := range 300 {
			req := runtime.TriggerRequest{Input: json.RawMessage(fmt.Sprintf(`{"i": %d}`, i))}
			switch i {
			case 10, 20:
				req.IdempotencyKey = "twice"
			case 30:
				req.IdempotencyKey = "used"
			}
			reqs = append(reqs, req)
		}
		res, err := e.rt.TriggerBatch(ctx, wf.ID, reqs)
		must(t, err, "TriggerBatch")
		if len(res) != len(reqs) {
			t.Fatalf("%d results for %d requests", len(res), len(reqs))
		}
		ids := map[string]bool{first.ID: true}
		for i, r := range res {
			switch i {
			case 20:
				if r.Created || r.Run.ID != res[10].Run.ID {
					t.Errorf("item 20 repeats item 10's key: created=%v run %s, want run %s", r.Created, r.Run.ID, res[10].Run.ID)
				}
				continue
			case 30:
				if r.Created || string(r.Run.Input) != `{"i":-2}` {
					t.Errorf("item 30 uses a key used before: created=%v input %s", r.Created, r.Run.Input)
				}
				continue
			}
			if !r.Created || ids[r.Run.ID] {
				t.Fatalf("item %d: created=%v run %s (duplicate: %v)", i, r.Created, r.Run.ID, ids[r.Run.ID])
			}
			ids[r.Run.ID] = true
			var in struct{ I int }
			must(t, json.Unmarshal(r.Run.Input, &in), "input")
			if in.I != i {
				t.Fatalf("item %d got the run of input %s", i, r.Run.Input)
			}
		}
		count := func() int {
			counts, err := e.st.CountRuns(ctx, wf.ID)
			must(t, err, "CountRuns")
			n := 0
			for _, c := range counts {
				n += c
			}
			return n
		}
		if n := count(); n != 2+298 {
			t.Fatalf("%d runs stored, want 300", n)
		}
		_, err = e.rt.TriggerBatch(ctx, wf.ID, make([]runtime.TriggerRequest, runtime.MaxTriggerBatch+1))
		wantIs(t, err, runtime.ErrBatchTooLarge, "a batch over the limit")
		def, err := spec.Parse([]byte(`{"name": "bulk", "enabled": false, "tasks": {"nap": {"sleep": "1h"}}}`), spec.Limits{})
		must(t, err, "spec.Parse")
		_, err = e.st.UpdateWorkflow(ctx, wf.ID, &store.Workflow{Name: "bulk", Definition: def.Source, Fingerprint: def.Fingerprint(), Enabled: false})
		must(t, err, "UpdateWorkflow")
		_, err = e.rt.TriggerBatch(ctx, "bulk", reqs[:5])
		wantIs(t, err, runtime.ErrDisabled, "a batch of a workflow disabled elsewhere")
		if n := count(); n != 300 {
			t.Errorf("%d runs stored after the refused batch, want 300", n)
		}
		if res, err := e.rt.TriggerBatch(ctx, "bulk", nil); err != nil || len(res) != 0 {
			t.Errorf("an empty batch: %v, %v; want nothing", res, err)
		}
		_, err = e.st.UpdateWorkflow(ctx, wf.ID, &store.Workflow{Name: "bulk", Definition: def.Source, Fingerprint: def.Fingerprint(), Enabled: true})
		must(t, err, "UpdateWorkflow (enable again)")
		e.rt.Close()
		if _, err := e.rt.TriggerBatch(ctx, wf.ID, reqs[:1]); err == nil || count() != 300 {
			t.Errorf("a batch after Close: %v, %d runs stored; want an error and 300", err, count())
		}
	})
}

// TestTriggerKeyHitOfChangedWorkflow: a repeated idempotency key returns
// its run only while the workflow it was started for is still the one the
// reference names: after a delete and a new workflow of the same name, the
// key starts a run of the new one; after a disable, the trigger is refused
// (as a trigger that reads the workflow afresh would do).
func TestTriggerKeyHitOfChangedWorkflow(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := t.Context()
		src := `{"name": "keyed", "tasks": {"nap": {"sleep": "1h"}}}`
		old := e.workflow(t, src)
		keyed := func(key string) (*store.Run, bool, error) {
			return e.rt.Trigger(ctx, runtime.TriggerRequest{Workflow: "keyed", IdempotencyKey: key})
		}
		first, created, err := keyed("k1")
		must(t, err, "first trigger")
		if !created {
			t.Fatal("first trigger created nothing")
		}
		if _, err := e.rt.TriggerBatch(ctx, "keyed", []runtime.TriggerRequest{{IdempotencyKey: "k2"}}); err != nil {
			t.Fatal(err)
		}
		must(t, e.st.DeleteWorkflow(ctx, old.ID), "DeleteWorkflow")
		fresh := e.workflow(t, src)
		run, created, err := keyed("k1")
		must(t, err, "trigger after the workflow was replaced")
		if !created || run.ID == first.ID || run.WorkflowID != fresh.ID {
			t.Errorf("key k1 after a replacement: created=%v run %s of workflow %s; want a new run of %s", created, run.ID, run.WorkflowID, fresh.ID)
		}
		res, err := e.rt.TriggerBatch(ctx, "keyed", []runtime.TriggerRequest{{IdempotencyKey: "k2"}})
		must(t, err, "batch after the workflow was replaced")
		if !res[0].Created || res[0].Run.WorkflowID != fresh.ID {
			t.Errorf("batch key k2 after a replacement: created=%v workflow %s; want a new run of %s", res[0].Created, res[0].Run.WorkflowID, fresh.ID)
		}
		def, err := spec.Parse([]byte(src), spec.Limits{})
		must(t, err, "spec.Parse")
		_, err = e.st.UpdateWorkflow(ctx, fresh.ID, &store.Workflow{Name: "keyed", Definition: def.Source, Fingerprint: def.Fingerprint(), Enabled: false})
		must(t, err, "UpdateWorkflow")
		_, _, err = keyed("k1")
		wantIs(t, err, runtime.ErrDisabled, "a key hit of a disabled workflow")
		_, err = e.rt.TriggerBatch(ctx, "keyed", []runtime.TriggerRequest{{IdempotencyKey: "k2"}})
		wantIs(t, err, runtime.ErrDisabled, "a batch key hit of a disabled workflow")
	})
}
