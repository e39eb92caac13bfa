package storetest

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

var runTests = []test{
	{"CreateWritesRunStepsQueueEvents", testCreateRun},
	{"IdempotencyKeyReturnsFirstRun", testCreateRunIdempotent},
	{"IdempotencyKeyConcurrent", testCreateRunIdempotentConcurrent},
	{"ListNewestFirstByCursor", testListRuns},
	{"GetUnknownIsNotFound", testGetRunUnknown},
	{"ListEventsAfterSeqAndLimit", testListEventsPaging},
	{"ListEventsOfLargeTransactionsEveryPage", testListEventsLargeTx},
	{"RunEventsFirstInTheRunRow", testRunEventsInRow},
	{"LongRunEventsInTheEventsTable", testLongRunEvents},
	{"RunEventsWrittenBeforeTheRowHeldThem", testRunEventsLegacy},
	{"EventsByPositionAndAsObjects", testEventsByPosition},
	{"StepByToken", testStepByToken},
	{"CallbackTokenUnique", testCallbackTokenUnique},
	{"CountRunsByStatus", testCountRuns},
	{"CreateRunsLargeBatch", testCreateRunsLargeBatch},
	{"CreateRunsChecksWorkflowAsRead", testCreateRunsChecksWorkflow},
	{"CreateRunsReturnsRunsAsStored", testCreateRunsReturnsAsStored},
	{"TriggerHeadersOfTheRunsNamed", testTriggerHeaders},
}

// testTriggerHeaders: the trigger headers of each run named, as stored
// (also an empty set, and in batches of more runs than one statement
// reads), and nothing for a run that does not exist.
func testTriggerHeaders(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "headers")
	traced := baseRun(wf, "")
	traced.TriggerHeaders = map[string]string{"Traceparent": "00-0102030405060708090a0b0c0d0e0f10-0807060504030201-01", "X-Request-Id": "req-1"}
	bare := baseRun(wf, "")
	bare.TriggerHeaders = map[string]string{}
	var nrs []*store.NewRun
	nrs = append(nrs, &store.NewRun{Run: traced}, &store.NewRun{Run: bare})
	for range 600 {
		nrs = append(nrs, &store.NewRun{Run: baseRun(wf, "")})
	}
	res, err := s.CreateRuns(ctx, nrs, t0)
	must(t, err, "CreateRuns")
	ids := []string{"no-such-run"}
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		ids = append(ids, r.Run.ID)
	}
	got, err := s.TriggerHeaders(ctx, ids)
	must(t, err, "TriggerHeaders")
	if len(got) != len(nrs) {
		t.Fatalf("headers of %d runs, want %d", len(got), len(nrs))
	}
	if _, ok := got["no-such-run"]; ok {
		t.Error("headers for a run that does not exist")
	}
	diff(t, "traced run's headers", traced.TriggerHeaders, got[res[0].Run.ID])
	if h, ok := got[res[1].Run.ID]; !ok || len(h) != 0 {
		t.Errorf("a run without headers: %v (present %v), want none", h, ok)
	}
	diff(t, "last run's headers", map[string]string{"X-Request-Id": "req-1"}, got[res[len(res)-1].Run.ID])
	none, err := s.TriggerHeaders(ctx, nil)
	must(t, err, "TriggerHeaders of no runs")
	if len(none) != 0 {
		t.Errorf("headers of no runs: %v", none)
	}
}

func testCountRuns(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "counted")
	other := mkWorkflow(t, s, "other")
	for i, st := range []string{status.RunRunning, status.RunRunning, status.RunCompleted, status.RunFailed} {
		r := baseRun(wf, "")
		r.Status = st
		if _, _, err := s.CreateRun(ctx, &store.NewRun{Run: r}, at(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.CreateRun(ctx, &store.NewRun{Run: baseRun(other, "")}, t0); err != nil {
		t.Fatal(err)
	}
	got, err := s.CountRuns(ctx, wf.ID)
	must(t, err, "CountRuns")
	want := map[string]int{status.RunRunning: 2, status.RunCompleted: 1, status.RunFailed: 1}
	diff(t, "counts", want, got)
	none, err := s.CountRuns(ctx, "no-such-workflow")
	must(t, err, "CountRuns unknown")
	if len(none) != 0 {
		t.Errorf("counts for an unknown workflow = %v", none)
	}
}

func testCreateRun(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	now := at(2 * time.Second)
	in := baseRun(wf, "")
	// Steps out of position order: the store orders them.
	steps := []*store.StepRun{
		{Name: "notify", Position: 2, Type: "http", Status: status.StepPending},
		{Name: "fetch", Position: 0, Type: "http", Status: status.StepRunning, Attempt: 1, StartedAt: ptr(t0)},
		{Name: "wait", Position: 1, Type: "webhook", Status: status.StepWaiting, CallbackToken: "cb-create", WakeAt: ptr(at(time.Minute))},
	}
	queue := []store.QueueItem{
		{Kind: store.KindHTTP, Step: "fetch", Attempt: 1, DueAt: t0},
		{Kind: store.KindWaitTimeout, Step: "wait", DueAt: at(time.Minute)},
		{Kind: store.KindWake, Step: "notify", DueAt: at(time.Hour)},
	}
	evs := []store.NewEvent{
		{Type: "run_started", Data: map[string]any{"input": 42}},
		{Type: "step_started", Step: "fetch"},
		{Type: "step_waiting", Step: "wait", Data: []string{"x"}},
	}
	r, created, err := s.CreateRun(ctx, &store.NewRun{Run: in, Steps: steps, Queue: queue, Events: evs}, now)
	must(t, err, "CreateRun")
	if !created {
		t.Fatal("created = false for a new run")
	}
	if r.ID == "" {
		t.Fatal("run has no id")
	}
	want := in
	want.ID = r.ID
	want.WorkflowName = "wf"
	want.UpdatedAt = now
	diff(t, "created run", &want, r)

	got, gotSteps := getRun(t, s, r.ID)
	diff(t, "GetRun run", r, got)
	wantSteps := []*store.StepRun{
		{RunID: r.ID, Name: "fetch", Position: 0, Type: "http", Status: status.StepRunning, Attempt: 1, StartedAt: ptr(t0)},
		{RunID: r.ID, Name: "wait", Position: 1, Type: "webhook", Status: status.StepWaiting, CallbackToken: "cb-create", WakeAt: ptr(at(time.Minute))},
		{RunID: r.ID, Name: "notify", Position: 2, Type: "http", Status: status.StepPending},
	}
	diff(t, "GetRun steps (ordered by position)", wantSteps, gotSteps)

	wantEvents := []*store.Event{
		{RunID: r.ID, Seq: 1, Type: "run_started", Data: json.RawMessage(`{"input":42}`), At: now},
		{RunID: r.ID, Seq: 2, Type: "step_started", Step: "fetch", At: now},
		{RunID: r.ID, Seq: 3, Type: "step_waiting", Step: "wait", Data: json.RawMessage(`["x"]`), At: now},
	}
	diff(t, "events", wantEvents, events(t, s, r.ID))

	items := claimAll(t, s, far)
	diff(t, "queue items", keysFor(r.ID, queue...), keysOf(items))

	// The run is listed under its workflow.
	runs, _, err := s.ListRuns(ctx, wf.ID, store.Page{})
	must(t, err, "ListRuns")
	if len(runs) != 1 || runs[0].ID != r.ID {
		t.Errorf("ListRuns = %v, want [%s]", runIDs(runs), r.ID)
	} else if len(runs[0].Input) != 0 || len(runs[0].TriggerHeaders) != 0 || runs[0].Status != r.Status || !runs[0].StartedAt.Equal(r.StartedAt) {
		// A list shows neither input nor headers: they are not read.
		t.Errorf("listed run: input %q, headers %v, status %s; want no input or headers and the run's status", runs[0].Input, runs[0].TriggerHeaders, runs[0].Status)
	}
}

func testCreateRunIdempotent(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	other := mkWorkflow(t, s, "other")
	nr := func(wf *store.Workflow, input string) *store.NewRun {
		r := baseRun(wf, "key-1")
		r.Input = json.RawMessage(input)
		return &store.NewRun{
			Run:    r,
			Steps:  []*store.StepRun{{Name: "a", Position: 0, Type: "http", Status: status.StepPending}},
			Queue:  []store.QueueItem{{Kind: store.KindHTTP, Step: "a", DueAt: t0}},
			Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_started", Step: "a"}},
		}
	}
	first, created, err := s.CreateRun(ctx, nr(wf, `{"n":1}`), t0)
	must(t, err, "CreateRun first")
	if !created {
		t.Fatal("first CreateRun: created = false")
	}
	if first.IdempotencyKey != "key-1" {
		t.Errorf("IdempotencyKey = %q, want key-1", first.IdempotencyKey)
	}

	again, created, err := s.CreateRun(ctx, nr(wf, `{"n":2}`), at(time.Second))
	must(t, err, "CreateRun again")
	if created {
		t.Error("second CreateRun with the same key: created = true")
	}
	diff(t, "run returned for a reused key", first, again)

	// Nothing new was written.
	runs, _, err := s.ListRuns(ctx, wf.ID, store.Page{})
	must(t, err, "ListRuns")
	if len(runs) != 1 {
		t.Errorf("workflow has %d runs, want 1", len(runs))
	}
	if evs := events(t, s, first.ID); len(evs) != 2 {
		t.Errorf("run has %d events after the duplicate, want 2", len(evs))
	}
	items := claimAll(t, s, far)
	diff(t, "queue after duplicate", keysFor(first.ID, store.QueueItem{Kind: store.KindHTTP, Step: "a", DueAt: t0}), keysOf(items))

	// Another workflow may use the same key.
	third, created, err := s.CreateRun(ctx, nr(other, `{"n":3}`), t0)
	must(t, err, "CreateRun other workflow")
	if !created || third.ID == first.ID {
		t.Errorf("same key on another workflow: created=%v id=%s (first %s), want a new run", created, third.ID, first.ID)
	}
	if third.WorkflowID != other.ID {
		t.Errorf("WorkflowID = %s, want %s", third.WorkflowID, other.ID)
	}
}

// testCreateRunIdempotentConcurrent races several triggers with one key:
// exactly one run is created and every caller gets it.
func testCreateRunIdempotentConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	const n = 8
	type result struct {
		id      string
		created bool
		err     error
	}
	results := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			r, created, err := s.CreateRun(ctx, &store.NewRun{
				Run:    baseRun(wf, "race"),
				Queue:  []store.QueueItem{{Kind: store.KindHTTP, Step: "a", DueAt: t0}},
				Events: []store.NewEvent{{Type: "run_started"}},
			}, t0)
			results[i] = result{err: err, created: created}
			if r != nil {
				results[i].id = r.ID
			}
		})
	}
	close(start)
	wg.Wait()
	var winners int
	ids := map[string]bool{}
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("CreateRun %d: %v", i, r.err)
		}
		if r.created {
			winners++
		}
		ids[r.id] = true
	}
	if winners != 1 || len(ids) != 1 {
		t.Fatalf("%d callers created a run and they saw %d distinct ids, want 1 and 1", winners, len(ids))
	}
	var id string
	for k := range ids {
		id = k
	}
	if evs := events(t, s, id); len(evs) != 1 {
		t.Errorf("run has %d events, want 1", len(evs))
	}
	if items := claimAll(t, s, far); len(items) != 1 {
		t.Errorf("queue has %d items, want 1", len(items))
	}
}

func runIDs(rs []*store.Run) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func testListRuns(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	other := mkWorkflow(t, s, "other")
	var created []string
	for i := range 5 {
		r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, fmt.Sprintf("k%d", i))})
		created = append(created, r.ID)
		mkRun(t, s, &store.NewRun{Run: baseRun(other, fmt.Sprintf("k%d", i))})
	}
	var want []string
	for i := len(created) - 1; i >= 0; i-- {
		want = append(want, created[i])
	}

	var got []string
	var sizes []int
	cursor := ""
	for page := 0; ; page++ {
		if page > len(created) {
			t.Fatalf("ListRuns did not terminate after %d pages", page)
		}
		rs, next, err := s.ListRuns(ctx, wf.ID, store.Page{Cursor: cursor, Limit: 2})
		must(t, err, "ListRuns")
		sizes = append(sizes, len(rs))
		for _, r := range rs {
			if r.WorkflowID != wf.ID || r.WorkflowName != "wf" {
				t.Errorf("ListRuns(wf) returned run %s of workflow %s (%s)", r.ID, r.WorkflowID, r.WorkflowName)
			}
			got = append(got, r.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	diff(t, "page sizes", []int{2, 2, 1}, sizes)
	diff(t, "run ids, newest first", want, got)

	none, next, err := s.ListRuns(ctx, "no-such-workflow", store.Page{})
	must(t, err, "ListRuns(unknown workflow)")
	if len(none) != 0 || next != "" {
		t.Errorf("ListRuns(unknown workflow) = %v %q, want nothing", runIDs(none), next)
	}
}

func testGetRunUnknown(t *testing.T, s store.Store) {
	_, _, err := s.GetRun(t.Context(), "no-such-run")
	wantErr(t, err, store.ErrNotFound, "GetRun(unknown)")
	err = s.InRun(t.Context(), "no-such-run", t0, func(store.RunTx) error {
		t.Error("InRun called fn for an unknown run")
		return nil
	})
	wantErr(t, err, store.ErrNotFound, "InRun(unknown)")
}

func testListEventsPaging(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	var evs []store.NewEvent
	for i := range 5 {
		evs = append(evs, store.NewEvent{Type: fmt.Sprintf("e%d", i+1)})
	}
	r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Events: evs})
	got, err := s.ListEvents(t.Context(), r.ID, 2, 2)
	must(t, err, "ListEvents(after 2, limit 2)")
	diff(t, "seqs after 2 limit 2", []int64{3, 4}, seqs(got))
	if len(got) == 2 && (got[0].Type != "e3" || got[1].Type != "e4") {
		t.Errorf("types = %s, %s, want e3, e4", got[0].Type, got[1].Type)
	}
	got, err = s.ListEvents(t.Context(), r.ID, 5, 0)
	must(t, err, "ListEvents(after last)")
	if len(got) != 0 {
		t.Errorf("ListEvents after the last seq = %v, want none", seqs(got))
	}
	got, err = s.ListEvents(t.Context(), "no-such-run", 0, 0)
	must(t, err, "ListEvents(unknown run)")
	if len(got) != 0 {
		t.Errorf("ListEvents(unknown run) = %v, want none", seqs(got))
	}
}

func testStepByToken(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Steps: []*store.StepRun{
		{Name: "a", Position: 0, Type: "http", Status: status.StepPending},
		{Name: "hook", Position: 1, Type: "webhook", Status: status.StepWaiting, CallbackToken: "tok-1"},
	}})
	runID, step, err := s.StepByToken(ctx, "tok-1")
	must(t, err, "StepByToken")
	if runID != r.ID || step != "hook" {
		t.Errorf("StepByToken = (%s, %s), want (%s, hook)", runID, step, r.ID)
	}
	_, _, err = s.StepByToken(ctx, "no-such-token")
	wantErr(t, err, store.ErrNotFound, "StepByToken(unknown)")
	_, _, err = s.StepByToken(ctx, "")
	wantErr(t, err, store.ErrNotFound, "StepByToken(empty)")

	// A token set later by UpdateStep is found too.
	inRun(t, s, r.ID, t0, func(tx store.RunTx) error {
		a := *tx.Step("a")
		a.CallbackToken = "tok-2"
		return tx.UpdateStep(&a)
	})
	runID, step, err = s.StepByToken(ctx, "tok-2")
	must(t, err, "StepByToken after UpdateStep")
	if runID != r.ID || step != "a" {
		t.Errorf("StepByToken(tok-2) = (%s, %s), want (%s, a)", runID, step, r.ID)
	}
}

func testCallbackTokenUnique(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	first := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Steps: []*store.StepRun{
		{Name: "hook", Position: 0, Type: "webhook", Status: status.StepWaiting, CallbackToken: "shared"},
		{Name: "other", Position: 1, Type: "webhook", Status: status.StepWaiting, CallbackToken: "mine"},
	}})

	// A second run cannot take the token; it is not created at all.
	_, _, err := s.CreateRun(ctx, &store.NewRun{
		Run:    baseRun(wf, ""),
		Steps:  []*store.StepRun{{Name: "hook", Position: 0, Type: "webhook", Status: status.StepWaiting, CallbackToken: "shared"}},
		Queue:  []store.QueueItem{{Kind: store.KindWaitTimeout, Step: "hook", DueAt: t0}},
		Events: []store.NewEvent{{Type: "run_started"}},
	}, t0)
	if err == nil {
		t.Fatal("CreateRun with a step token another step owns succeeded")
	}
	runs, _, err := s.ListRuns(ctx, wf.ID, store.Page{})
	must(t, err, "ListRuns")
	if len(runs) != 1 {
		t.Errorf("workflow has %d runs after the failed create, want 1", len(runs))
	}
	if items := claimAll(t, s, far); len(items) != 0 {
		t.Errorf("failed create left %d queue items", len(items))
	}

	// Nor can a step of the same run take it.
	err = s.InRun(ctx, first.ID, t0, func(tx store.RunTx) error {
		o := *tx.Step("other")
		o.CallbackToken = "shared"
		return tx.UpdateStep(&o)
	})
	if err == nil {
		t.Fatal("UpdateStep to a token another step owns succeeded")
	}
	_, steps := getRun(t, s, first.ID)
	if tok := stepNamed(t, steps, "other").CallbackToken; tok != "mine" {
		t.Errorf("step other has token %q after the failed update, want mine", tok)
	}
	runID, step, err := s.StepByToken(ctx, "shared")
	must(t, err, "StepByToken")
	if runID != first.ID || step != "hook" {
		t.Errorf("StepByToken(shared) = (%s, %s), want (%s, hook)", runID, step, first.ID)
	}
}

// testCreateRunsLargeBatch: a batch of 128 runs of 30 steps each (about
// 70,000 values to write) is created whole: writes are split to stay within
// the database's limit on parameters per statement.
func testCreateRunsLargeBatch(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "large")
	var nrs []*store.NewRun
	for range 128 {
		nr := &store.NewRun{Run: baseRun(wf, ""), Events: []store.NewEvent{{Type: "run_started"}}}
		for j := range 30 {
			nr.Steps = append(nr.Steps, &store.StepRun{Name: fmt.Sprintf("s%02d", j), Position: j, Type: "task", Status: status.StepPending})
		}
		nrs = append(nrs, nr)
	}
	res, err := s.CreateRuns(ctx, nrs, t0)
	must(t, err, "CreateRuns")
	for i, r := range res {
		if r.Err != nil || !r.Created {
			t.Fatalf("run %d: created=%v err=%v", i, r.Created, r.Err)
		}
	}
	_, steps, err := s.GetRun(ctx, res[127].Run.ID)
	must(t, err, "GetRun")
	if len(steps) != 30 {
		t.Errorf("the last run has %d steps, want 30", len(steps))
	}
}

// testCreateRunsReturnsAsStored: what CreateRuns returns for a run is what
// GetRun reads back — for runs it builds from what it wrote (a workflow as
// read is named) and for runs it reads (no workflow given, a key found):
// times to the microsecond, input byte for byte, no headers as an empty
// set, the workflow's name.
func testCreateRunsReturnsAsStored(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "as-stored")
	now := at(3*time.Second + 1234*time.Nanosecond)
	finished := at(5*time.Second + 999*time.Nanosecond)
	mk := func(key string, withWF bool, edit func(r *store.Run)) *store.NewRun {
		nr := &store.NewRun{Run: baseRun(wf, key), Events: []store.NewEvent{{Type: "run_started"}}}
		nr.Run.StartedAt = at(time.Second + 7*time.Nanosecond)
		nr.Run.ExpiresAt = at(time.Hour + 11*time.Nanosecond)
		if withWF {
			nr.Workflow = wf
		}
		if edit != nil {
			edit(&nr.Run)
		}
		return nr
	}
	nrs := []*store.NewRun{
		mk("", true, nil),
		mk("", true, func(r *store.Run) { r.TriggerHeaders, r.Input = nil, json.RawMessage(` { "b" : 1 ,"a":[ ] } `) }),
		mk("key-as-stored", true, func(r *store.Run) { r.Status, r.Error, r.FinishedAt = status.RunFailed, "boom", &finished }),
		mk("", false, nil),
	}
	res, err := s.CreateRuns(ctx, nrs, now)
	must(t, err, "CreateRuns")
	again, err := s.CreateRuns(ctx, []*store.NewRun{mk("key-as-stored", true, nil)}, now)
	must(t, err, "CreateRuns with a used key")
	res = append(res, again...)
	for i, r := range res {
		if r.Err != nil || r.Run == nil || r.Created != (i < len(nrs)) {
			t.Fatalf("run %d: %+v, want created=%v", i, r, i < len(nrs))
		}
		stored, _, err := s.GetRun(ctx, r.Run.ID)
		must(t, err, "GetRun")
		diff(t, fmt.Sprintf("run %d as returned against GetRun", i), stored, r.Run)
		if stored.WorkflowName != wf.Name {
			t.Errorf("run %d: workflow name %q, want %q", i, stored.WorkflowName, wf.Name)
		}
	}
}

// testCreateRunsChecksWorkflow: a run built from a workflow as read
// (NewRun.Workflow) is written only while that workflow is still live,
// enabled, so named and at that version; otherwise its result is
// ErrWorkflowChanged, nothing of it is written, and the other runs of the
// batch are created.
func testCreateRunsChecksWorkflow(t *testing.T, s store.Store) {
	ctx := t.Context()
	update := func(w *store.Workflow, name string, version int, enabled bool) {
		t.Helper()
		fp := fmt.Sprintf("fp-%s-%d", w.Name, version)
		_, err := s.UpdateWorkflow(ctx, w.ID, &store.Workflow{Name: name, Fingerprint: fp, Definition: def(w.Name, version), Enabled: enabled})
		must(t, err, "UpdateWorkflow "+w.Name)
	}
	current := mkWorkflow(t, s, "as-read")
	disabled := mkWorkflow(t, s, "then-disabled")
	update(disabled, disabled.Name, 1, false)
	bumped := mkWorkflow(t, s, "then-bumped")
	update(bumped, bumped.Name, 2, true)
	renamed := mkWorkflow(t, s, "then-renamed")
	update(renamed, "renamed-since", 1, true)
	deleted := mkWorkflow(t, s, "then-deleted")
	must(t, s.DeleteWorkflow(ctx, deleted.ID), "DeleteWorkflow")

	as := []*store.Workflow{disabled, current, bumped, renamed, deleted}
	var nrs []*store.NewRun
	for _, w := range as {
		nrs = append(nrs, &store.NewRun{Run: baseRun(w, ""), Workflow: w, Events: []store.NewEvent{{Type: "run_started"}},
			Steps: []*store.StepRun{{Name: "a", Type: "task", Status: status.StepPending}}})
	}
	res, err := s.CreateRuns(ctx, nrs, t0)
	must(t, err, "CreateRuns")
	for i, w := range as {
		if w == current {
			if res[i].Err != nil || !res[i].Created || res[i].Run == nil || res[i].Run.WorkflowID != w.ID {
				t.Fatalf("%s (unchanged): %+v, want created", w.Name, res[i])
			}
			continue
		}
		wantErr(t, res[i].Err, store.ErrWorkflowChanged, w.Name)
		if res[i].Created || res[i].Run != nil {
			t.Errorf("%s: %+v, want no run", w.Name, res[i])
		}
		counts, err := s.CountRuns(ctx, w.ID)
		must(t, err, "CountRuns")
		if len(counts) != 0 {
			t.Errorf("%s: runs %v were written", w.Name, counts)
		}
		if _, _, err := s.GetRun(ctx, nrs[i].Run.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: GetRun of the refused run: %v, want not found", w.Name, err)
		}
	}
	// Read again, the bumped workflow takes the run at its new version.
	again, err := s.GetWorkflow(ctx, bumped.ID)
	must(t, err, "GetWorkflow")
	nr := &store.NewRun{Run: baseRun(again, ""), Workflow: again}
	res, err = s.CreateRuns(ctx, []*store.NewRun{nr}, t0)
	must(t, err, "CreateRuns again")
	if res[0].Err != nil || !res[0].Created || res[0].Run.Version != 2 {
		t.Fatalf("bumped, read again: %+v (run %+v), want created at version 2", res[0], res[0].Run)
	}
}

// testListEventsLargeTx: the events of transactions of one, many and
// large events (a store may keep those of one transaction together) read
// back as one sequence, whatever page cuts it.
func testListEventsLargeTx(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Events: []store.NewEvent{{Type: "run_started"}}})
	big := strings.Repeat("x", 3000)
	var want []*store.Event
	want = append(want, events(t, s, r.ID)...)
	for i, n := range []int{1, 40, 3, 17} {
		now := at(time.Duration(i+1) * time.Second)
		var evs []store.NewEvent
		for j := range n {
			e := store.NewEvent{Type: fmt.Sprintf("t%d.e%d", i, j), Step: fmt.Sprintf("s%d", j%3)}
			switch j % 4 {
			case 1:
				e.Data = map[string]any{"j": j, "quote": `"a\nb"`}
			case 2:
				e.Data = map[string]any{"big": big} // past a pack's bytes
			}
			evs = append(evs, e)
		}
		inRun(t, s, r.ID, now, func(tx store.RunTx) error { return tx.Append(evs...) })
		for _, e := range evs {
			ev := &store.Event{RunID: r.ID, Seq: int64(len(want) + 1), Type: e.Type, Step: e.Step, At: now}
			if e.Data != nil {
				b, err := json.Marshal(e.Data)
				must(t, err, "encode")
				ev.Data = b
			}
			want = append(want, ev)
		}
	}
	all := events(t, s, r.ID)
	diff(t, "seqs", seqRange(1, int64(len(want))), seqs(all))
	diff(t, "events", want, all)
	for after := 0; after <= len(want); after++ {
		for _, lim := range []int{1, 2, 5, 16, 17} {
			got, err := s.ListEvents(t.Context(), r.ID, int64(after), lim)
			must(t, err, "ListEvents")
			w := seqs(want[after:min(after+lim, len(want))])
			if g := seqs(got); !slices.Equal(g, w) {
				t.Fatalf("page after %d, limit %d = %v, want %v", after, lim, g, w)
			}
		}
	}
}

// testRunEventsInRow: a run's first eight events are kept in its own row
// and only the later ones in the events table (migration 14), whichever
// transaction wrote them; the log reads the same either way (the paging
// tests above).
func testRunEventsInRow(t *testing.T, s store.Store) {
	raw := rawDB(t, s)
	wf := mkWorkflow(t, s, "wf")
	r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_started", Step: "a"}}})
	for i, n := range []int{2, 5, 4} { // seqs 3–4, 5–9 (across the row's end), 10–13
		evs := make([]store.NewEvent, n)
		for j := range evs {
			evs[j] = store.NewEvent{Type: fmt.Sprintf("t%d.e%d", i, j)}
		}
		inRun(t, s, r.ID, at(time.Duration(i+1)*time.Second), func(tx store.RunTx) error { return tx.Append(evs...) })
	}
	diff(t, "seqs", seqRange(1, 13), seqs(events(t, s, r.ID)))
	ctx := t.Context()
	var inRow string
	must(t, raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT events FROM runs WHERE id = '%s'`, r.ID)).Scan(&inRow), "read the run's row")
	diff(t, "events in the run's row", 8, strings.Count(inRow, `,[`))
	var minSeq, rows int64
	must(t, raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT COALESCE(MIN(seq), 0), COUNT(*) FROM events WHERE run_id = '%s'`, r.ID)).Scan(&minSeq, &rows), "read the events table")
	if rows == 0 || minSeq <= 8 {
		t.Errorf("events table rows of the run: %d, the first numbered %d; want some, all past 8", rows, minSeq)
	}
}

// testLongRunEvents: a run of more than four steps keeps its row for its
// steps: none of its events go there, and its log reads whole and in
// order, by page.
func testLongRunEvents(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	var steps []*store.StepRun
	for i := range 5 {
		steps = append(steps, &store.StepRun{Name: fmt.Sprintf("s%d", i), Position: i, Type: "task", Status: status.StepPending})
	}
	r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Steps: steps, Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_started", Step: "s0"}}})
	appendNineEvents(t, s, r.ID)
	if raw, ok := s.(interface{ DB() *sql.DB }); ok {
		var inRow string
		must(t, raw.DB().QueryRowContext(t.Context(), fmt.Sprintf(`SELECT events FROM runs WHERE id = '%s'`, r.ID)).Scan(&inRow), "read the run's row")
		if inRow != "" {
			t.Errorf("events in a long run's row = %q, want none", inRow)
		}
	}
}

// testRunEventsLegacy: a run whose events were all written to the events
// table (before migration 14) gains new ones in its row while they are
// among its first eight, and its log reads whole and in order, by page.
func testRunEventsLegacy(t *testing.T, s store.Store) {
	raw := rawDB(t, s)
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Events: []store.NewEvent{{Type: "run_started", Data: map[string]any{"n": 1}}, {Type: "step_started", Step: "a"}}})
	before := events(t, s, r.ID)
	if len(before) != 2 {
		t.Fatalf("events of a new run = %d, want 2", len(before))
	}
	qs := []string{fmt.Sprintf(`UPDATE runs SET events = '' WHERE id = '%s'`, r.ID)}
	for _, e := range before {
		data := "NULL"
		if e.Data != nil {
			data = "'" + string(e.Data) + "'"
		}
		qs = append(qs, fmt.Sprintf(`INSERT INTO events (run_id, seq, type, step, data, at) VALUES ('%s', %d, '%s', '%s', %s, %d)`, r.ID, e.Seq, e.Type, e.Step, data, e.At.UnixMicro()))
	}
	for _, q := range qs {
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	diff(t, "the legacy log", before, events(t, s, r.ID))
	appendNineEvents(t, s, r.ID) // seqs 3–5 and 6–8 in the row, 9–11 past it
}

// appendNineEvents appends three transactions of three events to a run
// that has two, and checks that its log reads whole and in order, by
// pages of every size.
func appendNineEvents(t *testing.T, s store.Store, runID string) {
	t.Helper()
	for i := range 3 {
		evs := []store.NewEvent{{Type: "a"}, {Type: "b", Step: "s"}, {Type: "c", Data: map[string]any{"i": i}}}
		inRun(t, s, runID, at(time.Duration(i+1)*time.Second), func(tx store.RunTx) error { return tx.Append(evs...) })
	}
	all := events(t, s, runID)
	diff(t, "seqs", seqRange(1, 11), seqs(all))
	diff(t, "types", []string{"run_started", "step_started", "a", "b", "c", "a", "b", "c", "a", "b", "c"}, eventTypes(all))
	for after := 0; after <= len(all); after++ {
		for _, lim := range []int{1, 2, 3, 7} {
			got, err := s.ListEvents(t.Context(), runID, int64(after), lim)
			must(t, err, "ListEvents")
			diff(t, fmt.Sprintf("page after %d, limit %d", after, lim), seqs(all[after:min(after+lim, len(all))]), seqs(got))
		}
	}
}

// testEventsByPosition: events in rows (a run's, a task's, and the earlier
// events an events row packs) are written by position (migration 18), with
// every shape of step and data, and read back as they were given; rows
// holding objects, as they were written before, or both forms, read the
// same; and the migration's down script turns a database back into
// objects only, the log unchanged.
func testEventsByPosition(t *testing.T, s store.Store) {
	raw := rawDB(t, s)
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	given := []store.NewEvent{
		{Type: "run_started", Data: map[string]any{"version": 1}},
		{Type: "step_started", Step: "a", Data: map[string]any{"task_id": "k", "list": []any{1, []any{2}}}},
		{Type: "plain"},
		{Type: "step_only", Step: "b"},
		{Type: "string_data", Data: "a \"quoted\" [string]"},
		{Type: "string_data_step", Step: "c", Data: "s"},
		{Type: "null_data", Data: store.EventJSON(`null`)},
		{Type: "number_data", Step: "d", Data: 7},
	}
	r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Events: given[:2]})
	// Past the row's eight: the rest go to the events table, packed.
	more := append(slices.Clone(given[2:]), given...)
	inRun(t, s, r.ID, at(time.Second), func(tx store.RunTx) error { return tx.Append(more...) })
	task := mkTask(t, s, newTask("pos.x.v1", t0), t0)
	claimTasks(t, s, []string{"pos.%"}, "w", t0, time.Hour, 1)
	must(t, s.InTask(ctx, task.ID, t0, func(tx store.TaskTx) error {
		return tx.AppendTask(given[4:]...)
	}), "InTask")

	runLog, taskLog := events(t, s, r.ID), events(t, s, task.ID)
	all := append(slices.Clone(given[:2]), more...)
	diff(t, "run log length", len(all), len(runLog))
	for i, e := range runLog {
		want := all[i]
		var data string
		switch d := want.Data.(type) {
		case nil:
		case store.EventJSON:
			data = string(d)
		default:
			b, err := json.Marshal(d)
			must(t, err, "encode")
			data = string(b)
		}
		if e.Seq != int64(i+1) || e.Type != want.Type || e.Step != want.Step || string(e.Data) != data {
			t.Errorf("event %d = {%d %s %q %s}, want {%d %s %q %s}", i, e.Seq, e.Type, e.Step, e.Data, i+1, want.Type, want.Step, data)
		}
	}
	diff(t, "task log types", []string{"created", "claimed", "string_data", "string_data_step", "null_data", "number_data"}, eventTypes(taskLog))

	var runRow, taskRow, earlier string
	must(t, raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT events FROM runs WHERE id = '%s'`, r.ID)).Scan(&runRow), "read the run's row")
	must(t, raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT events FROM tasks WHERE id = '%s'`, task.ID)).Scan(&taskRow), "read the task's row")
	must(t, raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT MAX(earlier) FROM events WHERE run_id = '%s'`, r.ID)).Scan(&earlier), "read the events table")
	for name, row := range map[string]string{"run row": runRow, "task row": strings.TrimPrefix(taskRow, "~"), "packed events": earlier} {
		if !strings.HasPrefix(row, ",[") || strings.Contains(row, `{"seq":`) {
			t.Errorf("%s = %s, want events by position", name, row)
		}
	}

	// The run's first events as objects, as rows before migration 18
	// held them, the rest by position: one row, both forms.
	legacy := fmt.Sprintf(`,{"seq":1,"type":"run_started","data":{"version":1},"at":%d},{"seq":2,"type":"step_started","step":"a","data":%s,"at":%d}`,
		t0.UnixMicro(), runLog[1].Data, t0.UnixMicro())
	rest := runRow[strings.Index(runRow, ",[3,"):]
	_, err := raw.ExecContext(ctx, fmt.Sprintf(`UPDATE runs SET events = '%s' WHERE id = '%s'`, strings.ReplaceAll(legacy+rest, "'", "''"), r.ID))
	must(t, err, "write the mixed row")
	diff(t, "the log from a row of both forms", runLog, events(t, s, r.ID))

	// The down script (a Ferry from before migration 18 reads objects only).
	down, err := os.ReadFile(filepath.Join("..", "sqlstore", "migrations", s.Dialect(), "0018_positional_events.down.sql"))
	must(t, err, "read the down script")
	_, err = raw.ExecContext(ctx, string(down))
	must(t, err, "run the down script")
	must(t, raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT events FROM runs WHERE id = '%s'`, r.ID)).Scan(&runRow), "read the run's row")
	must(t, raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT events FROM tasks WHERE id = '%s'`, task.ID)).Scan(&taskRow), "read the task's row")
	must(t, raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT MAX(earlier) FROM events WHERE run_id = '%s'`, r.ID)).Scan(&earlier), "read the events table")
	if !strings.HasPrefix(taskRow, "~,{") {
		t.Errorf("task row after the down script = %s, want its created event still implied (~) and objects", taskRow)
	}
	for name, row := range map[string]string{"run row": runRow, "task row": strings.TrimPrefix(taskRow, "~"), "packed events": earlier} {
		var elems []map[string]json.RawMessage
		if err := json.Unmarshal([]byte("["+strings.TrimPrefix(row, ",")+"]"), &elems); err != nil {
			t.Errorf("%s after the down script = %s: not objects: %v", name, row, err)
		}
	}
	diff(t, "the run's log after the down script", runLog, events(t, s, r.ID))
	diff(t, "the task's log after the down script", taskLog, events(t, s, task.ID))
}
