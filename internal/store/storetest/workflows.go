package storetest

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/store"
)

var workflowTests = []test{
	{"CreateGetByIDAndName", testWorkflowCreateGet},
	{"GetUnknownIsNotFound", testWorkflowGetUnknown},
	{"DuplicateLiveNameConflicts", testWorkflowDuplicateName},
	{"UpdateNewFingerprintAddsVersion", testWorkflowUpdateNewVersion},
	{"UpdateSameFingerprintKeepsVersion", testWorkflowUpdateSameFingerprint},
	{"UpdateUnknownIsNotFound", testWorkflowUpdateUnknown},
	{"RenameToLiveNameConflicts", testWorkflowRenameConflict},
	{"DeleteFreesNameKeepsVersions", testWorkflowDelete},
	{"ListPaginatesByCursor", testWorkflowList},
}

func testWorkflowCreateGet(t *testing.T, s store.Store) {
	ctx := t.Context()
	before := time.Now().Add(-time.Minute)
	in := &store.Workflow{Name: "orders", Fingerprint: "fp1", Definition: json.RawMessage(`{"name":"orders","steps":[]}`), Enabled: true}
	w, err := s.CreateWorkflow(ctx, in)
	must(t, err, "CreateWorkflow")
	if w.ID == "" {
		t.Fatal("created workflow has no id")
	}
	want := &store.Workflow{ID: w.ID, Name: "orders", Version: 1, Fingerprint: "fp1", Definition: in.Definition, Enabled: true, CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt}
	diff(t, "created workflow", want, w)
	if w.CreatedAt.Before(before) || w.UpdatedAt.Before(w.CreatedAt) {
		t.Errorf("timestamps CreatedAt=%v UpdatedAt=%v, want set to about now", w.CreatedAt, w.UpdatedAt)
	}
	for _, ref := range []string{w.ID, w.Name} {
		got, err := s.GetWorkflow(ctx, ref)
		must(t, err, "GetWorkflow "+ref)
		diff(t, "GetWorkflow("+ref+")", w, got)
	}
	got, err := s.GetWorkflowVersion(ctx, w.ID, 1)
	must(t, err, "GetWorkflowVersion")
	diff(t, "GetWorkflowVersion(id, 1)", w, got)

	// A disabled workflow keeps Enabled=false.
	off, err := s.CreateWorkflow(ctx, &store.Workflow{Name: "off", Fingerprint: "fp", Definition: json.RawMessage(`{}`), Enabled: false})
	must(t, err, "CreateWorkflow disabled")
	if off.Enabled {
		t.Error("disabled workflow came back enabled")
	}
}

func testWorkflowGetUnknown(t *testing.T, s store.Store) {
	ctx := t.Context()
	_, err := s.GetWorkflow(ctx, "nope")
	wantErr(t, err, store.ErrNotFound, "GetWorkflow(unknown)")
	_, err = s.GetWorkflowVersion(ctx, "nope", 1)
	wantErr(t, err, store.ErrNotFound, "GetWorkflowVersion(unknown)")
	w := mkWorkflow(t, s, "one")
	_, err = s.GetWorkflowVersion(ctx, w.ID, 2)
	wantErr(t, err, store.ErrNotFound, "GetWorkflowVersion(id, missing version)")
	err = s.DeleteWorkflow(ctx, "nope")
	wantErr(t, err, store.ErrNotFound, "DeleteWorkflow(unknown)")
}

func testWorkflowDuplicateName(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := mkWorkflow(t, s, "dup")
	_, err := s.CreateWorkflow(ctx, &store.Workflow{Name: "dup", Fingerprint: "other", Definition: json.RawMessage(`{}`), Enabled: true})
	wantErr(t, err, store.ErrConflict, "CreateWorkflow(duplicate name)")
	// The failed create left the first one alone.
	got, err := s.GetWorkflow(ctx, "dup")
	must(t, err, "GetWorkflow")
	diff(t, "workflow after conflict", first, got)
	// Another name is fine.
	mkWorkflow(t, s, "dup2")
}

func testWorkflowUpdateNewVersion(t *testing.T, s store.Store) {
	ctx := t.Context()
	v1 := mkWorkflow(t, s, "wf")
	newDef := def("wf", 2)
	v2, err := s.UpdateWorkflow(ctx, v1.ID, &store.Workflow{Name: "wf", Fingerprint: "fp-wf-2", Definition: newDef, Enabled: true})
	must(t, err, "UpdateWorkflow")
	want := &store.Workflow{ID: v1.ID, Name: "wf", Version: 2, Fingerprint: "fp-wf-2", Definition: newDef, Enabled: true, CreatedAt: v1.CreatedAt, UpdatedAt: v2.UpdatedAt}
	diff(t, "updated workflow", want, v2)
	if v2.UpdatedAt.Before(v1.UpdatedAt) {
		t.Errorf("UpdatedAt went back: %v -> %v", v1.UpdatedAt, v2.UpdatedAt)
	}
	got, err := s.GetWorkflow(ctx, "wf")
	must(t, err, "GetWorkflow")
	diff(t, "GetWorkflow after update", v2, got)

	old, err := s.GetWorkflowVersion(ctx, v1.ID, 1)
	must(t, err, "GetWorkflowVersion(1)")
	if old.Version != 1 || old.Fingerprint != v1.Fingerprint || string(old.Definition) != string(v1.Definition) {
		t.Errorf("version 1 = {Version:%d Fingerprint:%q Definition:%s}, want {1 %q %s}", old.Version, old.Fingerprint, old.Definition, v1.Fingerprint, v1.Definition)
	}
	cur, err := s.GetWorkflowVersion(ctx, v1.ID, 2)
	must(t, err, "GetWorkflowVersion(2)")
	if cur.Version != 2 || string(cur.Definition) != string(newDef) {
		t.Errorf("version 2 = {Version:%d Definition:%s}, want {2 %s}", cur.Version, cur.Definition, newDef)
	}

	// Updating by name works too and keeps counting.
	v3, err := s.UpdateWorkflow(ctx, "wf", &store.Workflow{Name: "wf", Fingerprint: "fp-wf-3", Definition: def("wf", 3), Enabled: false})
	must(t, err, "UpdateWorkflow by name")
	if v3.Version != 3 || v3.ID != v1.ID || v3.Enabled {
		t.Errorf("update by name: got {ID:%s Version:%d Enabled:%v}, want {%s 3 false}", v3.ID, v3.Version, v3.Enabled, v1.ID)
	}
}

func testWorkflowUpdateSameFingerprint(t *testing.T, s store.Store) {
	ctx := t.Context()
	v1 := mkWorkflow(t, s, "same")
	got, err := s.UpdateWorkflow(ctx, "same", &store.Workflow{Name: "same", Fingerprint: v1.Fingerprint, Definition: v1.Definition, Enabled: false})
	must(t, err, "UpdateWorkflow")
	if got.Version != 1 {
		t.Errorf("Version = %d after an update with the same fingerprint, want 1", got.Version)
	}
	if got.Enabled {
		t.Error("Enabled was not updated")
	}
	if string(got.Definition) != string(v1.Definition) || got.Fingerprint != v1.Fingerprint {
		t.Errorf("definition changed: %s %q", got.Definition, got.Fingerprint)
	}
	_, err = s.GetWorkflowVersion(ctx, v1.ID, 2)
	wantErr(t, err, store.ErrNotFound, "GetWorkflowVersion(2) after no-op update")

	// Sent again as it is (what `ferry apply` does on every deploy), it
	// changes nothing, updated_at included; a rename moves it.
	for !time.Now().After(got.UpdatedAt.Add(time.Millisecond)) {
		runtime.Gosched() // the store's clock must have moved on for the check to mean anything
	}
	again, err := s.UpdateWorkflow(ctx, "same", &store.Workflow{Name: "same", Fingerprint: v1.Fingerprint, Definition: v1.Definition, Enabled: false})
	must(t, err, "UpdateWorkflow unchanged")
	if !again.UpdatedAt.Equal(got.UpdatedAt) || again.Version != 1 {
		t.Errorf("an unchanged update moved updated_at %s → %s (version %d)", got.UpdatedAt, again.UpdatedAt, again.Version)
	}
	renamed, err := s.UpdateWorkflow(ctx, "same", &store.Workflow{Name: "same-2", Fingerprint: v1.Fingerprint, Definition: v1.Definition, Enabled: false})
	must(t, err, "UpdateWorkflow rename")
	if !renamed.UpdatedAt.After(got.UpdatedAt) {
		t.Errorf("a rename left updated_at at %s", renamed.UpdatedAt)
	}
}

func testWorkflowUpdateUnknown(t *testing.T, s store.Store) {
	_, err := s.UpdateWorkflow(t.Context(), "ghost", &store.Workflow{Name: "ghost", Fingerprint: "x", Definition: json.RawMessage(`{}`)})
	wantErr(t, err, store.ErrNotFound, "UpdateWorkflow(unknown)")
}

func testWorkflowRenameConflict(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := mkWorkflow(t, s, "a")
	mkWorkflow(t, s, "b")
	_, err := s.UpdateWorkflow(ctx, a.ID, &store.Workflow{Name: "b", Fingerprint: "fp-new", Definition: def("b", 9), Enabled: true})
	wantErr(t, err, store.ErrConflict, "UpdateWorkflow(rename onto a live name)")
	// Nothing of the failed update stuck.
	got, err := s.GetWorkflow(ctx, a.ID)
	must(t, err, "GetWorkflow")
	diff(t, "workflow after failed rename", a, got)
	_, err = s.GetWorkflowVersion(ctx, a.ID, 2)
	wantErr(t, err, store.ErrNotFound, "GetWorkflowVersion(2) after failed rename")
}

func testWorkflowDelete(t *testing.T, s store.Store) {
	ctx := t.Context()
	old := mkWorkflow(t, s, "gone")
	must(t, s.DeleteWorkflow(ctx, "gone"), "DeleteWorkflow")

	_, err := s.GetWorkflow(ctx, "gone")
	wantErr(t, err, store.ErrNotFound, "GetWorkflow(name) after delete")
	_, err = s.GetWorkflow(ctx, old.ID)
	wantErr(t, err, store.ErrNotFound, "GetWorkflow(id) after delete")
	_, err = s.UpdateWorkflow(ctx, old.ID, &store.Workflow{Name: "gone", Fingerprint: "x", Definition: json.RawMessage(`{}`)})
	wantErr(t, err, store.ErrNotFound, "UpdateWorkflow after delete")
	err = s.DeleteWorkflow(ctx, old.ID)
	wantErr(t, err, store.ErrNotFound, "DeleteWorkflow twice")
	list, _, err := s.ListWorkflows(ctx, store.Page{})
	must(t, err, "ListWorkflows")
	if len(list) != 0 {
		t.Errorf("ListWorkflows after delete = %d workflows, want 0", len(list))
	}

	// The name is free again, for a different workflow.
	again := mkWorkflow(t, s, "gone")
	if again.ID == old.ID || again.Version != 1 {
		t.Errorf("recreated workflow {ID:%s Version:%d}, want a new id and version 1 (old id %s)", again.ID, again.Version, old.ID)
	}
	got, err := s.GetWorkflow(ctx, "gone")
	must(t, err, "GetWorkflow(name) after recreate")
	if got.ID != again.ID {
		t.Errorf("GetWorkflow(name) = %s, want the new workflow %s", got.ID, again.ID)
	}

	// In-flight runs still find their pinned version of the deleted one.
	pinned, err := s.GetWorkflowVersion(ctx, old.ID, 1)
	must(t, err, "GetWorkflowVersion of the deleted workflow")
	if pinned.ID != old.ID || pinned.Version != 1 || string(pinned.Definition) != string(old.Definition) || pinned.Fingerprint != old.Fingerprint {
		t.Errorf("pinned version = %+v, want the deleted workflow's version 1 %+v", pinned, old)
	}
	if pinned.DeletedAt == nil {
		t.Error("deleted workflow's version has DeletedAt == nil")
	}
}

func testWorkflowList(t *testing.T, s store.Store) {
	ctx := t.Context()
	const total, limit = 7, 3
	var want []string
	// Create out of name order so the store, not insertion, orders them.
	for _, i := range []int{4, 0, 6, 2, 5, 1, 3} {
		mkWorkflow(t, s, fmt.Sprintf("wf-%02d", i))
	}
	for i := range total {
		want = append(want, fmt.Sprintf("wf-%02d", i))
	}
	// A deleted workflow is not listed.
	mkWorkflow(t, s, "wf-99")
	must(t, s.DeleteWorkflow(ctx, "wf-99"), "DeleteWorkflow")

	var got []string
	var sizes []int
	cursor := ""
	for page := 0; ; page++ {
		if page > total {
			t.Fatalf("ListWorkflows did not terminate after %d pages", page)
		}
		ws, next, err := s.ListWorkflows(ctx, store.Page{Cursor: cursor, Limit: limit})
		must(t, err, "ListWorkflows")
		sizes = append(sizes, len(ws))
		for _, w := range ws {
			got = append(got, w.Name)
			if w.Version != 1 || len(w.Definition) == 0 {
				t.Errorf("listed workflow %s has Version %d, Definition %q", w.Name, w.Version, w.Definition)
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	diff(t, "page sizes", []int{3, 3, 1}, sizes)
	diff(t, "listed names (in order, each once)", want, got)
}
