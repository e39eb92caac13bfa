package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

var taskTests = []test{
	{"CreateWritesCreatedEvent", testTaskCreate},
	{"CreateIdempotencyKeyReturnsFirst", testTaskCreateIdempotent},
	{"CreateIdempotencyKeyConcurrent", testTaskCreateIdempotentConcurrent},
	{"GetUnknownIsNotFound", testTaskGetUnknown},
	{"ClaimOrderPriorityRunAtCreated", testTaskClaimOrder},
	{"ClaimPastTasksScheduledAhead", testTaskClaimPastScheduledAhead},
	{"ClaimOrderTiesByID", testTaskClaimTies},
	{"ClaimPrefixRouting", testTaskClaimRouting},
	{"ClaimAcrossTypesInClaimOrder", testTaskClaimAcrossTypes},
	{"ClaimPrefixFindsTypesNewlyPending", testTaskClaimPrefixNewTypes},
	{"ClaimOfManyTypes", testTaskClaimManyTypes},
	{"ClaimNotYetDue", testTaskClaimNotDue},
	{"ClaimSetsLeaseAndEvent", testTaskClaimLease},
	{"LeaseExpiryReclaim", testTaskLeaseExpiry},
	{"DisabledTypesWait", testTaskDisabledTypes},
	{"FinishedNeverClaimed", testTaskFinishedNeverClaimed},
	{"ConcurrentClaimsExactlyOnce", testTaskClaimConcurrent},
	{"NextTaskDue", testNextTaskDue},
	{"NextTaskDueAcrossPriorities", testNextTaskDueAcrossPriorities},
	{"ClaimOrNextReadsNextDue", testClaimOrNext},
	{"InTaskStandalone", testInTaskStandalone},
	{"InTaskOfRun", testInTaskOfRun},
	{"InTaskErrorRollsBack", testInTaskRollback},
	{"InTasksBatch", testInTasksBatch},
	{"InTasksKnownRuns", testInTasksKnownRuns},
	{"ConcurrentReportsOfOneRun", testConcurrentReportsOfOneRun},
	{"UpdateTaskRoundTrip", testUpdateTaskRoundTrip},
	{"AppendTaskContinuesSeq", testAppendTaskSeq},
	{"TaskEventsPastTheRowPage", testTaskEventsPastRow},
	{"CancelTasksPastTheRow", testCancelTasksPastRow},
	{"TaskEventsWrittenBeforeTheRowHeldThem", testTaskEventsLegacy},
	{"CreatedEventImpliedByTheRow", testTaskCreatedImplied},
	{"CancelTasksOnlyThatRun", testCancelTasks},
	{"CancelTasksManyIDs", testCancelTasksManyIDs},
	{"CreatedLeasedThenCancelledNotReported", testCreatedLeasedThenCancelled},
	{"CommittedTasksAtWhenAllScheduledAhead", testCommittedTasksAt},
	{"FailedReportOnDueTaskWakesClaims", testFailedReportOnDueTask},
	{"TaskTypes", testTaskTypes},
	{"EventsCountedAsCommitted", testEventsCounted},
	{"FinishedToldOnceAsCommitted", testFinishedTold},
	{"ClaimSaysWhenClaimable", testClaimSince},
}

// newTask is a pending standalone task of typ, due at runAt.
func newTask(typ string, runAt time.Time) *store.Task {
	return &store.Task{Type: typ, Payload: json.RawMessage(`{"n":1}`), Status: status.TaskPending, Priority: 100, RunAt: runAt}
}

// mkTask creates t at now and fails unless it was created.
func mkTask(t *testing.T, s store.Store, k *store.Task, now time.Time) *store.Task {
	t.Helper()
	got, created, err := s.CreateTask(t.Context(), k, now)
	must(t, err, "CreateTask "+k.Type)
	if !created {
		t.Fatalf("CreateTask %s: created=false for a new task", k.Type)
	}
	if got == nil || got.ID == "" {
		t.Fatalf("CreateTask %s returned %+v without an id", k.Type, got)
	}
	return got
}

func getTask(t *testing.T, s store.Store, id string) *store.Task {
	t.Helper()
	k, err := s.GetTask(t.Context(), id)
	must(t, err, "GetTask "+id)
	return k
}

func claimTasks(t *testing.T, s store.Store, patterns []string, worker string, now time.Time, lease time.Duration, n int) []*store.Task {
	t.Helper()
	got, err := s.ClaimTasks(t.Context(), store.ClaimTasks{Patterns: patterns, WorkerID: worker, Lease: lease, Max: n, Now: now})
	must(t, err, "ClaimTasks")
	if len(got) > n {
		t.Fatalf("ClaimTasks with Max %d returned %d tasks", n, len(got))
	}
	return got
}

func taskIDs(ts []*store.Task) []string {
	out := make([]string, len(ts))
	for i, k := range ts {
		out[i] = k.ID
	}
	return out
}

func taskTypes(ts []*store.Task) []string {
	out := make([]string, len(ts))
	for i, k := range ts {
		out[i] = k.Type
	}
	sort.Strings(out)
	return out
}

func eventTypes(evs []*store.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// eventData decodes an event's data object.
func eventData(t *testing.T, e *store.Event) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(e.Data, &m); err != nil {
		t.Fatalf("event %d (%s) data %q: %v", e.Seq, e.Type, e.Data, err)
	}
	return m
}

// setTask writes k's mutable columns in InTask at now.
func setTask(t *testing.T, s store.Store, id string, now time.Time, fn func(k *store.Task)) {
	t.Helper()
	must(t, s.InTask(t.Context(), id, now, func(tx store.TaskTx) error {
		k := *tx.Task()
		fn(&k)
		return tx.UpdateTask(&k)
	}), "InTask "+id)
}

func testTaskCreate(t *testing.T, s store.Store) {
	now := at(3*time.Second + 5*time.Microsecond)
	in := &store.Task{
		Type:        "billing.invoice.v1",
		Payload:     json.RawMessage(`{"customer":"c-1","amount":1250,"note":"caf\u00e9 ☕"}`),
		Status:      status.TaskPending,
		Priority:    7,
		RunAt:       at(time.Minute),
		MaxAttempts: 4,
		RetryDelay:  90 * time.Second,
	}
	got := mkTask(t, s, in, now)
	want := &store.Task{
		ID: got.ID, Type: in.Type, Payload: in.Payload, Status: status.TaskPending, Priority: 7, RunAt: at(time.Minute),
		MaxAttempts: 4, RetryDelay: 90 * time.Second, CreatedAt: now, UpdatedAt: now,
	}
	diff(t, "created task", want, got)
	diff(t, "GetTask", want, getTask(t, s, got.ID))

	evs := events(t, s, got.ID)
	if len(evs) != 1 {
		t.Fatalf("events after CreateTask = %v, want one created event", eventTypes(evs))
	}
	e := evs[0]
	if e.RunID != got.ID || e.Seq != 1 || e.Type != "created" || !e.At.Equal(now) {
		t.Errorf("created event = %+v, want {RunID:%s Seq:1 Type:created At:%v}", e, got.ID, now)
	}
	diff(t, "created event data", map[string]any{"type": "billing.invoice.v1"}, eventData(t, e))

	// A second task gets its own id and its own sequence.
	other := mkTask(t, s, newTask("billing.invoice.v1", t0), now)
	if other.ID == got.ID {
		t.Fatal("two tasks got the same id")
	}
	diff(t, "second task's event seqs", []int64{1}, seqs(events(t, s, other.ID)))
}

func testTaskCreateIdempotent(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := newTask("billing.invoice.v1", t0)
	first.IdempotencyKey = "invoice-42"
	a := mkTask(t, s, first, t0)
	if a.IdempotencyKey != "invoice-42" {
		t.Errorf("IdempotencyKey = %q, want invoice-42", a.IdempotencyKey)
	}

	again := newTask("billing.refund.v1", at(time.Hour))
	again.IdempotencyKey = "invoice-42"
	again.Payload = json.RawMessage(`{"different":true}`)
	again.Priority = 1
	b, created, err := s.CreateTask(ctx, again, at(time.Second))
	must(t, err, "CreateTask with a used key")
	if created {
		t.Error("created = true for a repeated idempotency key")
	}
	diff(t, "task returned for a repeated key (the first one)", a, b)
	diff(t, "first task unchanged", a, getTask(t, s, a.ID))
	diff(t, "events of the first task", []string{"created"}, eventTypes(events(t, s, a.ID)))

	// Exactly one task exists: a claim of everything finds only it.
	got := claimTasks(t, s, []string{"%"}, "w", far, time.Minute, 100)
	diff(t, "tasks after the repeated key", []string{a.ID}, taskIDs(got))

	// Another key is another task.
	third := newTask("billing.invoice.v1", t0)
	third.IdempotencyKey = "invoice-43"
	c := mkTask(t, s, third, t0)
	if c.ID == a.ID {
		t.Error("a different idempotency key returned the first task")
	}
	// Tasks without a key never collide.
	d := mkTask(t, s, newTask("billing.invoice.v1", t0), t0)
	e := mkTask(t, s, newTask("billing.invoice.v1", t0), t0)
	if d.ID == e.ID {
		t.Error("two tasks without a key share an id")
	}
}

func testTaskCreateIdempotentConcurrent(t *testing.T, s store.Store) {
	const n = 8
	results := make([]*store.Task, n)
	createdFlags := make([]bool, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			k := newTask("billing.invoice.v1", t0)
			k.IdempotencyKey = "same-key"
			k.Payload = json.RawMessage(fmt.Sprintf(`{"creator":%d}`, i))
			results[i], createdFlags[i], errs[i] = s.CreateTask(t.Context(), k, t0)
		})
	}
	close(start)
	wg.Wait()
	winners := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("creator %d: %v", i, errs[i])
		}
		if createdFlags[i] {
			winners++
		}
	}
	if winners != 1 {
		t.Errorf("%d creators got created=true, want exactly 1", winners)
	}
	for i := range n {
		if results[i] == nil || results[i].ID != results[0].ID {
			t.Fatalf("creator %d got task %+v, want the same task as creator 0 (%s)", i, results[i], results[0].ID)
		}
	}
	got := claimTasks(t, s, []string{"%"}, "w", far, time.Minute, 100)
	diff(t, "tasks in the store (exactly one row)", []string{results[0].ID}, taskIDs(got))
	diff(t, "events of the task", []string{"created", "claimed"}, eventTypes(events(t, s, results[0].ID)))
}

func testTaskGetUnknown(t *testing.T, s store.Store) {
	_, err := s.GetTask(t.Context(), "0190c3a2-0000-7000-8000-000000000000")
	wantErr(t, err, store.ErrNotFound, "GetTask(unknown)")
	err = s.InTask(t.Context(), "0190c3a2-0000-7000-8000-000000000000", t0, func(store.TaskTx) error {
		t.Error("InTask called fn for an unknown task")
		return nil
	})
	wantErr(t, err, store.ErrNotFound, "InTask(unknown)")
}

func testTaskClaimOrder(t *testing.T, s store.Store) {
	// Inserted in an order that matches neither the claim order nor
	// created_at, so neither ids nor physical order can explain the result.
	type spec struct {
		name     string
		priority int
		runAt    time.Duration
		created  time.Duration
	}
	specs := []spec{
		{"late-low-prio", 9, 0, 0},
		{"mid-runat3", 5, 3 * time.Second, 1 * time.Second},
		{"mid-runat1-created2", 5, 1 * time.Second, 2 * time.Second},
		{"urgent", 1, 5 * time.Second, 3 * time.Second},
		{"mid-runat1-created1", 5, 1 * time.Second, 1*time.Second + time.Microsecond},
		{"mid-runat1-created0", 5, 1 * time.Second, 500 * time.Millisecond},
	}
	byID := map[string]string{}
	for _, sp := range specs {
		k := newTask("order.x.v1", at(sp.runAt))
		k.Priority = sp.priority
		k.Payload = json.RawMessage(fmt.Sprintf(`{"name":%q}`, sp.name))
		got := mkTask(t, s, k, at(sp.created))
		byID[got.ID] = sp.name
	}
	names := func(ts []*store.Task) []string {
		out := make([]string, len(ts))
		for i, k := range ts {
			out[i] = byID[k.ID]
		}
		return out
	}
	now := at(10 * time.Second)
	first := claimTasks(t, s, []string{"order.%"}, "w", now, time.Minute, 2)
	diff(t, "first claim (max 2)", []string{"urgent", "mid-runat1-created0"}, names(first))
	second := claimTasks(t, s, []string{"order.%"}, "w", now, time.Minute, 3)
	diff(t, "second claim (max 3)", []string{"mid-runat1-created1", "mid-runat1-created2", "mid-runat3"}, names(second))
	third := claimTasks(t, s, []string{"order.%"}, "w", now, time.Minute, 10)
	diff(t, "third claim", []string{"late-low-prio"}, names(third))
	if rest := claimTasks(t, s, []string{"order.%"}, "w", now, time.Minute, 10); len(rest) != 0 {
		t.Errorf("claim with everything leased returned %v", names(rest))
	}

	// After every lease expired, one at a time in the same order.
	var one []string
	for range specs {
		got := claimTasks(t, s, []string{"order.%"}, "w", far, time.Minute, 1)
		one = append(one, names(got)...)
	}
	diff(t, "claims of one after the leases expired", []string{"urgent", "mid-runat1-created0", "mid-runat1-created1", "mid-runat1-created2", "mid-runat3", "late-low-prio"}, one)
}

// testTaskClaimPastScheduledAhead: a claim takes the due tasks of every
// priority in claim order, past the tasks scheduled ahead that sort
// between them in the pending index (a priority's due tasks come first in
// it, its later ones after), past a priority holding only later tasks,
// and past due tasks of other and disabled types; and a claim finding
// nothing due says when the first later task is due.
func testTaskClaimPastScheduledAhead(t *testing.T, s store.Store) {
	ctx := t.Context()
	_, err := s.PutTaskType(ctx, &store.TaskType{Type: "sched.off.v1", Enabled: false})
	must(t, err, "PutTaskType")
	byID := map[string]string{}
	task := func(name, typ string, priority int, runAt time.Time) {
		k := newTask(typ, runAt)
		k.Priority = priority
		byID[mkTask(t, s, k, t0).ID] = name
	}
	for i := range 20 {
		task("p1-later", "sched.a.v1", 1, at(time.Hour+time.Duration(i)*time.Second))
	}
	task("p1-due-b", "sched.a.v1", 1, at(-time.Second))
	task("p1-other-type", "other.a.v1", 1, at(-time.Minute))
	task("p1-disabled", "sched.off.v1", 1, at(-time.Minute))
	task("p1-due-a", "sched.a.v1", 1, at(-2*time.Second))
	for i := range 5 {
		task("p3-later", "sched.a.v1", 3, at(30*time.Minute+time.Duration(i)*time.Second))
	}
	task("p5-due", "sched.b.v1", 5, at(-3*time.Second))
	for i := range 5 {
		task("p5-later", "sched.a.v1", 5, at(2*time.Hour+time.Duration(i)*time.Second))
	}
	task("p7-due", "sched.a.v1", 7, t0)
	names := func(ts []*store.Task) []string {
		out := make([]string, len(ts))
		for i, k := range ts {
			out[i] = byID[k.ID]
		}
		return out
	}
	diff(t, "first claim (max 3)", []string{"p1-due-a", "p1-due-b", "p5-due"}, names(claimTasks(t, s, []string{"sched.%"}, "w", t0, time.Hour, 3)))
	diff(t, "second claim (max 10)", []string{"p7-due"}, names(claimTasks(t, s, []string{"sched.%"}, "w", t0, time.Hour, 10)))
	for try := 0; try < 2; try++ {
		c, err := s.ClaimOrNext(ctx, store.ClaimTasks{Patterns: []string{"sched.%"}, WorkerID: "w", Lease: time.Hour, Max: 10, Now: t0})
		must(t, err, "ClaimOrNext")
		if len(c.Tasks) != 0 {
			t.Fatalf("claim with only later tasks left took %v", names(c.Tasks))
		}
		if c.NextRead {
			if !c.NextOK || !c.Next.Equal(at(30*time.Minute)) {
				t.Errorf("claim with only later tasks left: next %v, ok=%v; want %v", c.Next, c.NextOK, at(30*time.Minute))
			}
			return
		}
	}
	t.Error("ClaimOrNext twice in a row did not read the next due time")
}

func testTaskClaimRouting(t *testing.T, s store.Store) {
	types := []string{
		"billing.invoice.v1", "billing.refund.v2", "billingx.a.v1", "payments.x.v1", "payments.card.v1",
		"a_b.c.v1", "axb.c.v1", "exact.type.v1", "exact.type.v10", "exact.type.v1.sub.v1",
		"pct%.a.v1", "pctx.a.v1",
	}
	for _, typ := range types {
		mkTask(t, s, newTask(typ, t0), t0)
	}
	claim := func(patterns ...string) []string {
		t.Helper()
		return taskTypes(claimTasks(t, s, patterns, "w", at(time.Second), time.Hour, 100))
	}
	diff(t, "upper case (types compare byte by byte)", []string{}, claim("BILLING.%", "Exact.type.v1", "billing.INVOICE.v1"))
	diff(t, "a prefix beyond ASCII", []string{}, claim("billing.é%", "\xff%", "billing.\xff.v1"))
	diff(t, "billing.% (not billingx, not payments)", []string{"billing.invoice.v1", "billing.refund.v2"}, claim("billing.%"))
	diff(t, "a_b.% (_ is literal)", []string{"a_b.c.v1"}, claim("a_b.%"))
	diff(t, "pct%.% (% inside a prefix is literal)", []string{"pct%.a.v1"}, claim("pct%.%"))
	diff(t, "exact type", []string{"exact.type.v1"}, claim("exact.type.v1"))
	diff(t, "nothing matches", []string{}, claim("nope.%", "exact.type.v"))
	diff(t, "several patterns", []string{"exact.type.v10", "payments.card.v1", "payments.x.v1"}, claim("payments.%", "exact.type.v10"))
	diff(t, "the rest (pattern %)", []string{"axb.c.v1", "billingx.a.v1", "exact.type.v1.sub.v1", "pctx.a.v1"}, claim("%"))
}

// testTaskClaimAcrossTypes: a claim of several types (exact and
// prefixes) hands out their due tasks in one claim order (priority,
// run_at, created_at), however the types interleave, and stops at max;
// tasks of other types, the earliest of all, are left.
func testTaskClaimAcrossTypes(t *testing.T, s store.Store) {
	byID := map[string]string{}
	task := func(name, typ string, priority int, runAt time.Time) {
		k := newTask(typ, runAt)
		k.Priority = priority
		byID[mkTask(t, s, k, t0).ID] = name
	}
	task("other-first", "mix.other.v1", 0, at(-time.Hour))
	task("a-p5-late", "mix.a.v1", 5, at(-time.Second))
	task("b-p1", "mix.b.v1", 1, at(-time.Second))
	task("c-p5-early", "mixc.x.v1", 5, at(-3*time.Second))
	task("a-p1-later", "mix.a.v1", 1, at(-time.Millisecond))
	task("b-p5-mid", "mix.b.v1", 5, at(-2*time.Second))
	task("a-ahead", "mix.a.v1", 0, at(time.Hour))
	names := func(ts []*store.Task) []string {
		out := make([]string, len(ts))
		for i, k := range ts {
			out[i] = byID[k.ID]
		}
		return out
	}
	patterns := []string{"mix.a.v1", "mixc.%", "mix.b.v1"}
	diff(t, "first claim (max 3)", []string{"b-p1", "a-p1-later", "c-p5-early"}, names(claimTasks(t, s, patterns, "w", t0, time.Hour, 3)))
	diff(t, "second claim (max 10)", []string{"b-p5-mid", "a-p5-late"}, names(claimTasks(t, s, patterns, "w", t0, time.Hour, 10)))
	diff(t, "third claim", []string{}, names(claimTasks(t, s, patterns, "w", t0, time.Hour, 10)))
	next, ok, err := s.NextTaskDue(t.Context(), patterns, t0)
	must(t, err, "NextTaskDue")
	if !ok || !next.Equal(at(time.Hour)) {
		t.Errorf("next due of the claimed types: %v, %v; want %v", next, ok, at(time.Hour))
	}
}

// testTaskClaimManyTypes: a claim of more types than one statement walks
// (130, each with a due task and one scheduled ahead) hands out the due
// tasks of all of them in claim order, and when none is left says when the
// earliest of the others is due, whichever statement walked its type.
func testTaskClaimManyTypes(t *testing.T, s store.Store) {
	const n = 130
	var want []string
	for i := range n {
		typ := fmt.Sprintf("many.t%03d.v1", i)
		due := newTask(typ, t0)
		due.Priority = 1000 - i // claim order: the last type first
		mkTask(t, s, due, t0)
		mkTask(t, s, newTask(typ, at(time.Hour+time.Duration(n-i)*time.Second)), t0)
		want = append([]string{typ}, want...)
	}
	inOrder := func(ts []*store.Task) []string {
		out := make([]string, len(ts))
		for i, k := range ts {
			out[i] = k.Type
		}
		return out
	}
	diff(t, "first claim (max 100)", want[:100], inOrder(claimTasks(t, s, []string{"many.%"}, "w", t0, 3*time.Hour, 100)))
	diff(t, "second claim (max 100)", want[100:], inOrder(claimTasks(t, s, []string{"many.%"}, "w", t0, 3*time.Hour, 100)))
	for try := 0; try < 2; try++ {
		c, err := s.ClaimOrNext(t.Context(), store.ClaimTasks{Patterns: []string{"many.%"}, WorkerID: "w", Lease: 2 * time.Hour, Max: 10, Now: t0})
		must(t, err, "ClaimOrNext")
		if len(c.Tasks) != 0 {
			t.Fatalf("claim with only later tasks left took %v", taskTypes(c.Tasks))
		}
		if c.NextRead {
			if !c.NextOK || !c.Next.Equal(at(time.Hour+time.Second)) {
				t.Errorf("next due: %v, %v; want %v (the last type's)", c.Next, c.NextOK, at(time.Hour+time.Second))
			}
			break
		}
	}
	next, ok, err := s.NextTaskDue(t.Context(), []string{"many.%"}, t0)
	must(t, err, "NextTaskDue")
	if !ok || !next.Equal(at(time.Hour+time.Second)) {
		t.Errorf("NextTaskDue: %v, %v; want %v", next, ok, at(time.Hour+time.Second))
	}
}

// testTaskClaimPrefixNewTypes: a claim of a prefix takes the tasks of a
// type that became pending after an earlier claim of it found none, at
// the same moment: a new task of a new type, and a task of a type that
// had none pending going back to pending (a retry).
func testTaskClaimPrefixNewTypes(t *testing.T, s store.Store) {
	now := at(time.Minute)
	claim := func(what string, want ...string) []*store.Task {
		t.Helper()
		got := claimTasks(t, s, []string{"fresh.%"}, "w", now, time.Hour, 10)
		diff(t, what, append([]string{}, want...), taskTypes(got))
		return got
	}
	claim("nothing pending yet")
	mkTask(t, s, newTask("fresh.a.v1", t0), now)
	claim("a new type", "fresh.a.v1")
	claim("nothing pending again")
	mkTask(t, s, newTask("fresh.b.v1", t0), now)
	mkTask(t, s, newTask("freshx.c.v1", t0), now)
	got := claim("another new type, not one of another prefix", "fresh.b.v1")
	now = now.Add(2 * time.Second) // past what any store may remember
	claim("nothing pending after a while")
	must(t, s.InTask(t.Context(), got[0].ID, now, func(tx store.TaskTx) error {
		k := *tx.Task()
		k.Status, k.LeasedBy, k.LeaseToken, k.LeaseUntil, k.RunAt = status.TaskPending, "", "", nil, now
		return tx.UpdateTask(&k)
	}), "InTask retry")
	claim("a retried task of a type none was pending of", "fresh.b.v1")
}

func testTaskClaimNotDue(t *testing.T, s store.Store) {
	k := mkTask(t, s, newTask("later.x.v1", at(10*time.Second)), t0)
	for _, now := range []time.Time{t0, at(5 * time.Second), at(10*time.Second - time.Microsecond)} {
		if got := claimTasks(t, s, []string{"later.%"}, "w", now, time.Minute, 10); len(got) != 0 {
			t.Errorf("claim at %v of a task due at %v returned %v", now, k.RunAt, taskIDs(got))
		}
	}
	diff(t, "task untouched by the early claims", k, getTask(t, s, k.ID))
	diff(t, "events untouched by the early claims", []string{"created"}, eventTypes(events(t, s, k.ID)))
	got := claimTasks(t, s, []string{"later.%"}, "w", at(10*time.Second), time.Minute, 10)
	diff(t, "claim at run_at", []string{k.ID}, taskIDs(got))
}

func testTaskClaimLease(t *testing.T, s store.Store) {
	k := newTask("billing.invoice.v1", t0)
	k.MaxAttempts, k.RetryDelay, k.IdempotencyKey = 3, time.Minute, "k"
	created := mkTask(t, s, k, t0)
	other := mkTask(t, s, newTask("billing.refund.v1", t0), t0)
	now := at(2*time.Second + 3*time.Microsecond)
	lease := 30 * time.Second
	got := claimTasks(t, s, []string{"billing.%"}, "worker-1", now, lease, 10)
	if len(got) != 2 {
		t.Fatalf("claimed %d tasks, want 2", len(got))
	}
	byID := map[string]*store.Task{got[0].ID: got[0], got[1].ID: got[1]}
	c := byID[created.ID]
	if c == nil || byID[other.ID] == nil {
		t.Fatalf("claimed %v, want %s and %s", taskIDs(got), created.ID, other.ID)
	}
	if c.LeaseToken == "" {
		t.Fatal("claimed task has no lease token")
	}
	until := now.Add(lease)
	want := *created
	want.Status, want.Attempt, want.LeasedBy, want.LeaseToken, want.LeaseUntil, want.UpdatedAt = status.TaskLeased, 1, "worker-1", c.LeaseToken, &until, now
	diff(t, "claimed task", &want, c)
	diff(t, "GetTask after claim", &want, getTask(t, s, created.ID))
	if c.Reclaimed {
		t.Error("a first claim is marked Reclaimed")
	}

	evs := events(t, s, created.ID)
	diff(t, "event types", []string{"created", "claimed"}, eventTypes(evs))
	diff(t, "event seqs", []int64{1, 2}, seqs(evs))
	if len(evs) == 2 {
		e := evs[1]
		if !e.At.Equal(now) {
			t.Errorf("claimed event at %v, want %v", e.At, now)
		}
		d := eventData(t, e)
		if d["worker_id"] != "worker-1" || d["attempt"] != float64(1) {
			t.Errorf("claimed event data = %v, want worker_id worker-1 and attempt 1", d)
		}
		if lu, _ := d["lease_until"].(string); lu == "" {
			t.Errorf("claimed event data %v has no lease_until", d)
		} else if pt, err := time.Parse(time.RFC3339Nano, lu); err != nil || !pt.Equal(until) {
			t.Errorf("claimed event lease_until = %q, want %v", lu, until)
		}
	}
	// Max caps the claim.
	for range 3 {
		mkTask(t, s, newTask("billing.batch.v1", t0), t0)
	}
	if got := claimTasks(t, s, []string{"billing.batch.v1"}, "w", now, lease, 2); len(got) != 2 {
		t.Errorf("claim with Max 2 returned %d tasks", len(got))
	}
	if got, err := s.ClaimTasks(t.Context(), store.ClaimTasks{Patterns: []string{"%"}, WorkerID: "w", Lease: lease, Max: 0, Now: now}); err != nil || len(got) != 0 {
		t.Errorf("claim with Max 0 = %v, %v; want nothing", taskIDs(got), err)
	}
}

func testTaskLeaseExpiry(t *testing.T, s store.Store) {
	k := mkTask(t, s, newTask("billing.invoice.v1", t0), t0)
	lease := 30 * time.Second
	c1 := claimTasks(t, s, []string{"billing.%"}, "w1", t0, lease, 1)
	if len(c1) != 1 {
		t.Fatalf("first claim returned %d tasks", len(c1))
	}
	old := c1[0]
	for _, now := range []time.Time{t0, at(lease / 2), at(lease - time.Microsecond)} {
		if got := claimTasks(t, s, []string{"billing.%"}, "w2", now, lease, 10); len(got) != 0 {
			t.Errorf("claim at %v during the lease (until %v) returned the task", now, old.LeaseUntil)
		}
	}
	diff(t, "task during its lease", old, getTask(t, s, k.ID))

	expiry := at(lease)
	c2 := claimTasks(t, s, []string{"billing.%"}, "w2", expiry, lease, 10)
	if len(c2) != 1 {
		t.Fatalf("claim after the lease expired returned %d tasks, want 1", len(c2))
	}
	cur := c2[0]
	if cur.ID != k.ID {
		t.Fatalf("reclaimed %s, want %s", cur.ID, k.ID)
	}
	if cur.LeaseToken == "" || cur.LeaseToken == old.LeaseToken {
		t.Errorf("reclaimed with token %q (old %q), want a new one", cur.LeaseToken, old.LeaseToken)
	}
	until := expiry.Add(lease)
	if cur.Attempt != 2 || !cur.Reclaimed || cur.LeasedBy != "w2" || cur.Status != status.TaskLeased || cur.LeaseUntil == nil || !cur.LeaseUntil.Equal(until) {
		t.Errorf("reclaimed task = {Attempt:%d Reclaimed:%v LeasedBy:%s Status:%s LeaseUntil:%v}, want {2 true w2 leased %v}",
			cur.Attempt, cur.Reclaimed, cur.LeasedBy, cur.Status, cur.LeaseUntil, until)
	}
	diff(t, "GetTask after reclaim", cur, getTask(t, s, k.ID))

	evs := events(t, s, k.ID)
	diff(t, "event types after reclaim", []string{"created", "claimed", "lease_expired", "claimed"}, eventTypes(evs))
	diff(t, "event seqs after reclaim", seqRange(1, 4), seqs(evs))
	if len(evs) == 4 {
		if d := eventData(t, evs[2]); d["attempt"] != float64(1) {
			t.Errorf("lease_expired data = %v, want attempt 1 (the expired attempt)", d)
		}
		if d := eventData(t, evs[3]); d["attempt"] != float64(2) || d["worker_id"] != "w2" {
			t.Errorf("second claimed data = %v, want attempt 2 by w2", d)
		}
		for _, e := range evs[2:] {
			if !e.At.Equal(expiry) {
				t.Errorf("%s event at %v, want %v", e.Type, e.At, expiry)
			}
		}
	}

	// And once more: the sequence keeps counting.
	c3 := claimTasks(t, s, []string{"billing.%"}, "w3", until, lease, 10)
	if len(c3) != 1 || c3[0].Attempt != 3 || !c3[0].Reclaimed || c3[0].LeaseToken == cur.LeaseToken {
		t.Fatalf("third claim = %+v, want attempt 3, reclaimed, a new token", c3)
	}
	evs = events(t, s, k.ID)
	diff(t, "event types after the second reclaim", []string{"created", "claimed", "lease_expired", "claimed", "lease_expired", "claimed"}, eventTypes(evs))
	diff(t, "event seqs after the second reclaim", seqRange(1, 6), seqs(evs))
}

func testTaskDisabledTypes(t *testing.T, s store.Store) {
	ctx := t.Context()
	_, err := s.PutTaskType(ctx, &store.TaskType{Type: "media.resize.v1", Enabled: false})
	must(t, err, "PutTaskType disabled")
	_, err = s.PutTaskType(ctx, &store.TaskType{Type: "media.crop.v1", Enabled: true})
	must(t, err, "PutTaskType enabled")
	resize := mkTask(t, s, newTask("media.resize.v1", t0), t0)
	crop := mkTask(t, s, newTask("media.crop.v1", t0), t0)
	free := mkTask(t, s, newTask("media.rotate.v1", t0), t0) // no registry entry: enabled

	got := claimTasks(t, s, []string{"media.%"}, "w", at(time.Second), time.Minute, 10)
	diff(t, "claim with media.resize.v1 disabled", []string{"media.crop.v1", "media.rotate.v1"}, taskTypes(got))
	for _, now := range []time.Time{at(time.Hour), far} {
		if got := claimTasks(t, s, []string{"media.resize.v1"}, "w", now, time.Minute, 10); len(got) != 0 {
			t.Errorf("a disabled type was claimed at %v: %v", now, taskIDs(got))
		}
	}
	if next, ok, err := s.NextTaskDue(ctx, []string{"media.resize.v1"}, t0); err != nil || ok {
		t.Errorf("NextTaskDue of a disabled type = %v, %v, %v; want ok=false", next, ok, err)
	}
	diff(t, "disabled type's task waits untouched", resize, getTask(t, s, resize.ID))

	// Disabling a type also stops reclaims of its expired leases.
	_, err = s.PutTaskType(ctx, &store.TaskType{Type: "media.crop.v1", Enabled: false})
	must(t, err, "PutTaskType disable crop")
	got = claimTasks(t, s, []string{"media.%"}, "w", far, time.Minute, 10)
	diff(t, "reclaim with crop disabled too", []string{"media.rotate.v1"}, taskTypes(got))

	// Re-enabled: the waiting tasks are claimable, nothing was lost.
	_, err = s.PutTaskType(ctx, &store.TaskType{Type: "media.resize.v1", Enabled: true})
	must(t, err, "PutTaskType re-enable resize")
	_, err = s.PutTaskType(ctx, &store.TaskType{Type: "media.crop.v1", Enabled: true})
	must(t, err, "PutTaskType re-enable crop")
	got = claimTasks(t, s, []string{"media.%"}, "w", far.Add(time.Hour), time.Minute, 10)
	diff(t, "claim after re-enabling", []string{"media.crop.v1", "media.resize.v1", "media.rotate.v1"}, taskTypes(got))
	for _, k := range got {
		want := map[string]int{resize.ID: 1, crop.ID: 2, free.ID: 3}[k.ID]
		if k.Attempt != want {
			t.Errorf("%s attempt = %d, want %d", k.Type, k.Attempt, want)
		}
	}
}

func testTaskFinishedNeverClaimed(t *testing.T, s store.Store) {
	finals := []string{status.TaskCancelled, status.TaskSucceeded, status.TaskFailed}
	var finished []string
	for _, st := range finals {
		k := mkTask(t, s, newTask("done.x.v1", t0), t0)
		// Give it an expired lease too: status alone must keep it out.
		setTask(t, s, k.ID, at(time.Second), func(k *store.Task) {
			k.Status, k.LeaseToken, k.LeaseUntil, k.FinishedAt = st, "tok-"+st, ptr(at(2*time.Second)), ptr(at(time.Second))
		})
		finished = append(finished, k.ID)
	}
	pending := mkTask(t, s, newTask("done.x.v1", t0), t0)
	for _, now := range []time.Time{at(time.Minute), far} {
		got := claimTasks(t, s, []string{"done.%"}, "w", now, time.Minute, 10)
		for _, id := range taskIDs(got) {
			if slices.Contains(finished, id) {
				t.Errorf("a finished task %s (%s) was claimed at %v", id, getTask(t, s, id).Status, now)
			}
		}
	}
	if k := getTask(t, s, pending.ID); k.Attempt != 2 {
		t.Errorf("pending control task attempt = %d, want 2 (claimed, then reclaimed)", k.Attempt)
	}
	for i, id := range finished {
		k := getTask(t, s, id)
		if k.Status != finals[i] || k.Attempt != 0 {
			t.Errorf("finished task = {Status:%s Attempt:%d}, want {%s 0}", k.Status, k.Attempt, finals[i])
		}
	}
	if next, ok, err := s.NextTaskDue(t.Context(), []string{"done.%"}, far.Add(time.Hour)); err != nil || (ok && !next.After(far)) {
		t.Errorf("NextTaskDue counts finished tasks: %v, %v, %v", next, ok, err)
	}
}

// testTaskClaimConcurrent has 4 workers claim 300 tasks at most 7 at a time:
// every task is claimed exactly once.
func testTaskClaimConcurrent(t *testing.T, s store.Store) {
	const total, workers, batch = 300, 4, 7
	want := map[string]bool{}
	for i := range total {
		k := newTask(fmt.Sprintf("load.t%d.v1", i%3), at(time.Duration(i%13)*time.Millisecond))
		k.Priority = i % 5
		want[mkTask(t, s, k, t0).ID] = true
	}
	now := at(time.Second)
	claimed := make([][]*store.Task, workers)
	errs := make([]error, workers)
	var count atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			<-start
			for range 20 * total { // bounded; stops once everything is claimed
				if count.Load() >= total {
					return
				}
				got, err := s.ClaimTasks(t.Context(), store.ClaimTasks{Patterns: []string{"load.%"}, WorkerID: fmt.Sprintf("w%d", w), Lease: time.Hour, Max: batch, Now: now})
				if err != nil {
					errs[w] = err
					return
				}
				if len(got) > batch {
					errs[w] = fmt.Errorf("claim returned %d tasks, Max was %d", len(got), batch)
					return
				}
				claimed[w] = append(claimed[w], got...)
				count.Add(int64(len(got)))
			}
		})
	}
	close(start)
	wg.Wait()
	for w, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", w, err)
		}
	}
	seen := map[string]int{}
	tokens := map[string]bool{}
	for _, ts := range claimed {
		for _, k := range ts {
			seen[k.ID]++
			if k.Attempt != 1 || k.Status != status.TaskLeased {
				t.Errorf("task %s claimed with attempt %d status %s, want 1 leased", k.ID, k.Attempt, k.Status)
			}
			tokens[k.LeaseToken] = true
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("task %s claimed %d times", id, n)
		}
		if !want[id] {
			t.Errorf("claimed unknown task %s", id)
		}
	}
	if len(seen) != total {
		t.Errorf("%d distinct tasks claimed, want %d", len(seen), total)
	}
	if got := claimTasks(t, s, []string{"load.%"}, "late", now, time.Hour, 1000); len(got) != 0 {
		t.Errorf("%d tasks still claimable after the workers finished", len(got))
	}
	// Each task's log has exactly created + claimed.
	for id := range want {
		if evs := events(t, s, id); len(evs) != 2 || evs[1].Type != "claimed" {
			t.Errorf("task %s events = %v, want created, claimed", id, eventTypes(evs))
			break
		}
	}
}

func testNextTaskDue(t *testing.T, s store.Store) {
	ctx := t.Context()
	check := func(what string, patterns []string, now time.Time, want time.Time, wantOK bool) {
		t.Helper()
		got, ok, err := s.NextTaskDue(ctx, patterns, now)
		must(t, err, "NextTaskDue "+what)
		if ok != wantOK || (ok && !got.Equal(want)) {
			t.Errorf("NextTaskDue %s = %v, ok=%v; want %v, ok=%v", what, got, ok, want, wantOK)
		}
	}
	check("with no tasks", []string{"%"}, t0, time.Time{}, false)

	mkTask(t, s, newTask("billing.a.v1", at(50*time.Second)), t0)
	check("one future task", []string{"billing.%"}, t0, at(50*time.Second), true)
	check("non-matching pattern", []string{"payments.%"}, t0, time.Time{}, false)

	mkTask(t, s, newTask("other.b.v1", at(10*time.Second)), t0)
	check("earlier task of another type is ignored", []string{"billing.%"}, t0, at(50*time.Second), true)
	check("several patterns", []string{"billing.%", "other.b.v1"}, t0, at(10*time.Second), true)

	// A leased task counts at its lease end.
	mkTask(t, s, newTask("billing.c.v1", at(-time.Hour)), t0)
	c := claimTasks(t, s, []string{"billing.c.v1"}, "w", t0, 40*time.Second, 1)
	if len(c) != 1 {
		t.Fatalf("claimed %d, want 1", len(c))
	}
	check("lease end earlier than run_at", []string{"billing.%"}, t0, at(40*time.Second), true)

	// A disabled type's task does not count.
	_, err := s.PutTaskType(ctx, &store.TaskType{Type: "billing.d.v1", Enabled: false})
	must(t, err, "PutTaskType")
	mkTask(t, s, newTask("billing.d.v1", at(5*time.Second)), t0)
	check("disabled type ignored", []string{"billing.%"}, t0, at(40*time.Second), true)

	// A finished task does not count.
	e := mkTask(t, s, newTask("billing.e.v1", at(time.Second)), t0)
	setTask(t, s, e.ID, t0, func(k *store.Task) { k.Status = status.TaskCancelled })
	check("cancelled task ignored", []string{"billing.%"}, t0, at(40*time.Second), true)

	// A task that is already claimable is not "next": the answer is in
	// the future.
	mkTask(t, s, newTask("billing.f.v1", at(-time.Second)), t0)
	check("past-due task ignored", []string{"billing.%"}, t0, at(40*time.Second), true)
	// Later, the lease end has passed too: the next is the 50s run_at.
	check("after the lease end", []string{"billing.%"}, at(45*time.Second), at(50*time.Second), true)
	check("after everything", []string{"billing.%"}, at(time.Hour), time.Time{}, false)
}

// testNextTaskDueAcrossPriorities: the next due moment is the earliest
// over every priority (the stores read it priority by priority): a more
// urgent task due later does not hide a less urgent one due sooner, a
// priority whose tasks are all of other types, disabled, past due or
// finished is passed over, and a claim that finds nothing reads the same.
func testNextTaskDueAcrossPriorities(t *testing.T, s store.Store) {
	ctx := t.Context()
	task := func(typ string, priority int, runAt time.Time) *store.Task {
		k := newTask(typ, runAt)
		k.Priority = priority
		return mkTask(t, s, k, t0)
	}
	_, err := s.PutTaskType(ctx, &store.TaskType{Type: "billing.off.v1", Enabled: false})
	must(t, err, "PutTaskType")
	task("billing.a.v1", 10, at(70*time.Second))
	task("other.a.v1", 20, at(5*time.Second))
	task("billing.off.v1", 30, at(6*time.Second))
	task("billing.b.v1", 40, at(-time.Minute))
	done := task("billing.c.v1", 50, at(7*time.Second))
	setTask(t, s, done.ID, t0, func(k *store.Task) { k.Status = status.TaskCancelled })
	task("billing.d.v1", 500, at(30*time.Second))
	task("billing.e.v1", 500, at(90*time.Second))
	task("billing.f.v1", 900, at(60*time.Second))
	for _, c := range []struct {
		what     string
		patterns []string
		now      time.Time
		want     time.Time
		ok       bool
	}{
		{"a less urgent priority's earlier task", []string{"billing.%"}, t0, at(30 * time.Second), true},
		{"another type, alone in its priority", []string{"other.%"}, t0, at(5 * time.Second), true},
		{"both types", []string{"billing.%", "other.%"}, t0, at(5 * time.Second), true},
		{"later: the next of each priority", []string{"billing.%"}, at(40 * time.Second), at(60 * time.Second), true},
		{"later still", []string{"billing.%"}, at(75 * time.Second), at(90 * time.Second), true},
		{"after everything", []string{"billing.%"}, at(time.Hour), time.Time{}, false},
	} {
		got, ok, err := s.NextTaskDue(ctx, c.patterns, c.now)
		must(t, err, "NextTaskDue "+c.what)
		if ok != c.ok || (ok && !got.Equal(c.want)) {
			t.Errorf("NextTaskDue %s = %v, ok=%v; want %v, ok=%v", c.what, got, ok, c.want, c.ok)
		}
	}
	// A claim of other.% at t0 finds nothing due (its task is 5 s ahead)
	// and reads the same moment (the store may first claim without
	// reading, right after a claim that got all it asked for).
	for try := 0; try < 2; try++ {
		cl, err := s.ClaimOrNext(ctx, store.ClaimTasks{Patterns: []string{"other.%"}, WorkerID: "w", Lease: time.Minute, Max: 1, Now: t0})
		must(t, err, "ClaimOrNext")
		if len(cl.Tasks) != 0 {
			t.Fatalf("ClaimOrNext claimed %s, want nothing", cl.Tasks[0].ID)
		}
		if cl.NextRead {
			if !cl.NextOK || !cl.Next.Equal(at(5*time.Second)) {
				t.Errorf("ClaimOrNext read next %v, ok=%v; want %v", cl.Next, cl.NextOK, at(5*time.Second))
			}
			return
		}
	}
	t.Error("ClaimOrNext never read when the next task is due")
}

// testClaimOrNext: a claim that finds nothing claimable may say when a
// task next becomes claimable, which must be what NextTaskDue says; one
// that finds a task claims it as ClaimTasks does.
func testClaimOrNext(t *testing.T, s store.Store) {
	ctx := t.Context()
	// nothing claims with patterns at now, retrying once: right after a
	// claim that got all it asked for, the store may claim without the
	// read (NextRead false), and the next claim reads.
	nothing := func(what string, patterns []string, now time.Time, want time.Time, wantOK bool) {
		t.Helper()
		for try := 0; try < 2; try++ {
			c, err := s.ClaimOrNext(ctx, store.ClaimTasks{Patterns: patterns, WorkerID: "w", Lease: 40 * time.Second, Max: 1, Now: now})
			must(t, err, "ClaimOrNext "+what)
			if len(c.Tasks) != 0 {
				t.Fatalf("ClaimOrNext %s claimed %s, want nothing", what, c.Tasks[0].ID)
			}
			if !c.NextRead {
				continue
			}
			if c.NextOK != wantOK || (wantOK && !c.Next.Equal(want)) {
				t.Errorf("ClaimOrNext %s: next %v, ok=%v; want %v, ok=%v", what, c.Next, c.NextOK, want, wantOK)
			}
			next, ok, err := s.NextTaskDue(ctx, patterns, now)
			must(t, err, "NextTaskDue "+what)
			if ok != c.NextOK || !next.Equal(c.Next) {
				t.Errorf("ClaimOrNext %s read %v, ok=%v; NextTaskDue says %v, ok=%v", what, c.Next, c.NextOK, next, ok)
			}
			return
		}
		t.Errorf("ClaimOrNext %s twice in a row did not read the next due time", what)
	}
	nothing("with no tasks", []string{"%"}, t0, time.Time{}, false)
	mkTask(t, s, newTask("billing.a.v1", at(50*time.Second)), t0)
	nothing("one future task", []string{"billing.%"}, t0, at(50*time.Second), true)
	nothing("non-matching pattern", []string{"payments.%"}, t0, time.Time{}, false)
	_, err := s.PutTaskType(ctx, &store.TaskType{Type: "billing.d.v1", Enabled: false})
	must(t, err, "PutTaskType")
	mkTask(t, s, newTask("billing.d.v1", at(-time.Second)), t0)
	nothing("a due task of a disabled type", []string{"billing.%"}, t0, at(50*time.Second), true)

	// A due task is claimed.
	due := mkTask(t, s, newTask("billing.c.v1", at(-time.Hour)), t0)
	c, err := s.ClaimOrNext(ctx, store.ClaimTasks{Patterns: []string{"billing.%"}, WorkerID: "w", Lease: 40 * time.Second, Max: 1, Now: t0})
	must(t, err, "ClaimOrNext a due task")
	if len(c.Tasks) != 1 || c.Tasks[0].ID != due.ID || c.Tasks[0].Status != status.TaskLeased || c.NextRead {
		t.Fatalf("ClaimOrNext with a due task = %+v; want task %s leased, next not read", c, due.ID)
	}
	// Its lease end is now the next moment, before the future task.
	nothing("a leased task", []string{"billing.%"}, t0, at(40*time.Second), true)
	nothing("after the lease end", []string{"billing.a.%"}, at(45*time.Second), at(50*time.Second), true)
}

func testInTaskStandalone(t *testing.T, s store.Store) {
	k := mkTask(t, s, newTask("solo.x.v1", t0), t0)
	called := false
	must(t, s.InTask(t.Context(), k.ID, at(time.Second), func(tx store.TaskTx) error {
		called = true
		diff(t, "tx.Task()", k, tx.Task())
		if tx.Run() != nil {
			t.Errorf("tx.Run() = %v for a standalone task, want nil", tx.Run())
		}
		return nil
	}), "InTask")
	if !called {
		t.Fatal("InTask did not call fn")
	}
	diff(t, "task after a read-only InTask", k, getTask(t, s, k.ID))
}

func testInTaskOfRun(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)
	now := at(time.Second)
	var created *store.Task
	inRun(t, s, r.ID, now, func(tx store.RunTx) error {
		created = &store.Task{Type: "content.thumbnail.v1", Payload: json.RawMessage(`{"id":7}`), Status: status.TaskPending, Priority: 100, RunAt: now, IdempotencyKey: r.ID + ":a", Step: "a"}
		return tx.CreateTask(created)
	})
	if created.ID == "" || created.RunID != r.ID {
		t.Fatalf("RunTx.CreateTask left ID %q RunID %q, want an id and %s", created.ID, created.RunID, r.ID)
	}
	k := getTask(t, s, created.ID)
	if k.RunID != r.ID || k.Step != "a" || k.Status != status.TaskPending || string(k.Payload) != `{"id":7}` || !k.CreatedAt.Equal(now) {
		t.Errorf("run's task = %+v, want run %s step a pending", k, r.ID)
	}
	evs := events(t, s, k.ID)
	diff(t, "run task events", []string{"created"}, eventTypes(evs))
	if len(evs) == 1 {
		diff(t, "created data", map[string]any{"type": "content.thumbnail.v1", "run_id": r.ID, "step": "a"}, eventData(t, evs[0]))
	}
	// The run's own event log is untouched.
	if evs := events(t, s, r.ID); len(evs) != 0 {
		t.Errorf("run events = %v, want none", eventTypes(evs))
	}

	wantRun, wantSteps := getRun(t, s, r.ID)
	called := false
	must(t, s.InTask(t.Context(), k.ID, at(2*time.Second), func(tx store.TaskTx) error {
		called = true
		diff(t, "tx.Task()", k, tx.Task())
		rt := tx.Run()
		if rt == nil {
			t.Fatal("tx.Run() = nil for a run's task")
		}
		diff(t, "tx.Run().Run()", wantRun, rt.Run())
		diff(t, "tx.Run().Steps()", wantSteps, rt.Steps())
		// Both can be written in the one transaction.
		st := *rt.Step("a")
		st.Status = status.StepRunning
		if err := rt.UpdateStep(&st); err != nil {
			return err
		}
		if err := rt.Append(store.NewEvent{Type: "step_started", Step: "a"}); err != nil {
			return err
		}
		u := *tx.Task()
		u.LastError = "noted"
		if err := tx.UpdateTask(&u); err != nil {
			return err
		}
		return tx.AppendTask(store.NewEvent{Type: "note"})
	}), "InTask")
	if !called {
		t.Fatal("InTask did not call fn")
	}
	_, steps := getRun(t, s, r.ID)
	if st := stepNamed(t, steps, "a"); st.Status != status.StepRunning {
		t.Errorf("step a = %s, want running (written through tx.Run())", st.Status)
	}
	diff(t, "run events", []string{"step_started"}, eventTypes(events(t, s, r.ID)))
	diff(t, "task events", []string{"created", "note"}, eventTypes(events(t, s, k.ID)))
	if got := getTask(t, s, k.ID); got.LastError != "noted" {
		t.Errorf("LastError = %q, want noted", got.LastError)
	}

	// Tasks written with the run by CreateRun belong to it as well.
	r2 := mkRun(t, s, &store.NewRun{
		Run:   baseRun(wf, ""),
		Steps: []*store.StepRun{{Name: "t", Position: 0, Type: "task", Status: status.StepRunning}},
		Tasks: []*store.Task{{Type: "content.upload.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: t0, Step: "t"}},
	})
	got := claimTasks(t, s, []string{"content.upload.v1"}, "w", t0, time.Minute, 10)
	if len(got) != 1 || got[0].RunID != r2.ID || got[0].Step != "t" {
		t.Fatalf("claimed %+v, want the task of run %s step t", got, r2.ID)
	}
	must(t, s.InTask(t.Context(), got[0].ID, t0, func(tx store.TaskTx) error {
		if tx.Run() == nil || tx.Run().Run().ID != r2.ID || tx.Run().Step("t") == nil {
			t.Errorf("InTask of a CreateRun task: Run() = %v, want run %s with step t", tx.Run(), r2.ID)
		}
		return nil
	}), "InTask")
}

// succeedTask marks the transaction's task succeeded, with its event.
func succeedTask(tx store.TaskTx) error {
	u := *tx.Task()
	u.Status = status.TaskSucceeded
	if err := tx.UpdateTask(&u); err != nil {
		return err
	}
	return tx.AppendTask(store.NewEvent{Type: "succeeded"})
}

func testInTaskRollback(t *testing.T, s store.Store) {
	k := mkTask(t, s, newTask("solo.x.v1", t0), t0)
	boom := errors.New("boom")
	err := s.InTask(t.Context(), k.ID, at(time.Second), func(tx store.TaskTx) error {
		if err := succeedTask(tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTask error = %v, want fn's error", err)
	}
	diff(t, "task after a failed InTask", k, getTask(t, s, k.ID))
	diff(t, "events after a failed InTask", []int64{1}, seqs(events(t, s, k.ID)))
	// The sequence was not advanced either.
	must(t, s.InTask(t.Context(), k.ID, at(2*time.Second), func(tx store.TaskTx) error {
		return tx.AppendTask(store.NewEvent{Type: "note"})
	}), "InTask")
	diff(t, "events after the next append", []int64{1, 2}, seqs(events(t, s, k.ID)))
}

// testInTasksBatch: one transaction for many tasks; a failing task drops
// only its own writes, tasks of one run see each other's changes in order,
// a repeated id is deferred and an unknown one is not found.
func testInTasksBatch(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r1 := mkRun(t, s, &store.NewRun{
		Run: baseRun(wf, ""),
		Steps: []*store.StepRun{
			{Name: "a", Position: 0, Type: "task", Status: status.StepRunning},
			{Name: "b", Position: 1, Type: "task", Status: status.StepRunning},
			{Name: "c", Position: 2, Type: "task", Status: status.StepRunning},
		},
		Tasks: []*store.Task{
			{Type: "batch.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: t0, Step: "a"},
			{Type: "batch.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: t0, Step: "b"},
			{Type: "batch.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: t0, Step: "c"},
		},
	})
	solo := mkTask(t, s, newTask("batch.solo.v1", t0), t0)
	bystep := map[string]*store.Task{}
	for _, k := range claimTasks(t, s, []string{"batch.x.v1"}, "w", t0, time.Minute, 10) {
		bystep[k.Step] = k
	}
	if len(bystep) != 3 {
		t.Fatalf("claimed %d of the run's tasks, want 3", len(bystep))
	}
	boom := errors.New("boom")
	now := at(time.Second)
	ids := []string{bystep["a"].ID, solo.ID, bystep["b"].ID, bystep["c"].ID, solo.ID, "no-such-task"}
	var seen []string
	errs, err := s.InTasks(t.Context(), ids, nil, now, func(i int, tx store.TaskTx) error {
		if i == 0 {
			// fn may run again for the whole batch (a store may decide
			// it on cached rows first, then again on locked ones): only
			// the last decision counts, and it starts with ids[0].
			seen = nil
		}
		k := *tx.Task()
		if k.RunID == "" { // the standalone task
			k.LastError = "batched"
			if err := tx.UpdateTask(&k); err != nil {
				return err
			}
			return tx.AppendTask(store.NewEvent{Type: "note"})
		}
		rt := tx.Run()
		var done []string
		for _, st := range rt.Steps() {
			if st.Status == status.StepSuccess {
				done = append(done, st.Name)
			}
		}
		seen = append(seen, fmt.Sprintf("%s:%v", k.Step, done))
		st := rt.Step(k.Step)
		st.Status = status.StepSuccess
		if err := rt.UpdateStep(st); err != nil {
			return err
		}
		if err := rt.Append(store.NewEvent{Type: "step_succeeded", Step: k.Step}); err != nil {
			return err
		}
		k.Status = status.TaskSucceeded
		if err := tx.UpdateTask(&k); err != nil {
			return err
		}
		if k.Step == "b" {
			return boom // after changing the step: those changes must go
		}
		return nil
	})
	must(t, err, "InTasks")
	if len(errs) != len(ids) {
		t.Fatalf("InTasks returned %d errors for %d ids", len(errs), len(ids))
	}
	for i, want := range []error{nil, nil, boom, nil, store.ErrRetry, store.ErrNotFound} {
		if (want == nil) != (errs[i] == nil) || (want != nil && !errors.Is(errs[i], want)) {
			t.Errorf("errs[%d] (%s) = %v, want %v", i, ids[i], errs[i], want)
		}
	}
	// c saw a's success but not b's, which failed.
	diff(t, "what each task of the run saw", []string{"a:[]", "b:[a]", "c:[a]"}, seen)
	_, steps := getRun(t, s, r1.ID)
	for name, want := range map[string]string{"a": status.StepSuccess, "b": status.StepRunning, "c": status.StepSuccess} {
		if st := stepNamed(t, steps, name); st.Status != want {
			t.Errorf("step %s = %s, want %s", name, st.Status, want)
		}
	}
	evs := events(t, s, r1.ID)
	diff(t, "run events", []string{"step_succeeded", "step_succeeded"}, eventTypes(evs))
	diff(t, "run event seqs", []int64{1, 2}, seqs(evs))
	for step, want := range map[string]string{"a": status.TaskSucceeded, "b": status.TaskLeased, "c": status.TaskSucceeded} {
		if got := getTask(t, s, bystep[step].ID); got.Status != want {
			t.Errorf("task of step %s = %s, want %s", step, got.Status, want)
		}
	}
	if got := getTask(t, s, solo.ID); got.LastError != "batched" {
		t.Errorf("standalone task LastError = %q, want batched", got.LastError)
	}
	diff(t, "standalone task events", []string{"created", "note"}, eventTypes(events(t, s, solo.ID)))
}

func testUpdateTaskRoundTrip(t *testing.T, s store.Store) {
	in := newTask("billing.invoice.v1", at(time.Minute))
	in.Priority, in.IdempotencyKey, in.MaxAttempts, in.RetryDelay = 17, "round-trip", 9, 90*time.Second+time.Millisecond
	in.Payload = json.RawMessage(`{"a":[1,2,{"b":"ü"}]}`)
	k := mkTask(t, s, in, t0)

	now := at(5*time.Second + 7*time.Microsecond)
	full := *k
	full.Status = status.TaskLeased
	full.RunAt = at(2*time.Minute + 3*time.Microsecond)
	full.Attempt = 4
	full.LeasedBy = "worker-ü"
	full.LeaseToken = "tok-round-trip"
	full.LeaseUntil = ptr(at(3*time.Minute + 9*time.Microsecond))
	full.Reclaimed = true
	full.CancelRequested = true
	full.LastError = "boom: \"quoted\"\nline 2 ✗"
	full.Result = json.RawMessage(`{"id":7,"nested":{"x":[true,null]}}`)
	full.FinishedAt = ptr(at(4*time.Second + 1*time.Microsecond))
	must(t, s.InTask(t.Context(), k.ID, now, func(tx store.TaskTx) error {
		u := full
		if err := tx.UpdateTask(&u); err != nil {
			return err
		}
		if tx.Task().Attempt != 4 || tx.Task().LeaseToken != "tok-round-trip" {
			t.Errorf("tx.Task() after UpdateTask = %+v, want the update", tx.Task())
		}
		return nil
	}), "InTask UpdateTask")
	want := full
	want.UpdatedAt = now
	diff(t, "task after UpdateTask (immutable columns kept)", &want, getTask(t, s, k.ID))
	// Microsecond precision.
	got := getTask(t, s, k.ID)
	if got.LeaseUntil == nil || got.LeaseUntil.UnixMicro() != full.LeaseUntil.UnixMicro() || got.RunAt.UnixMicro() != full.RunAt.UnixMicro() {
		t.Errorf("times lost precision: LeaseUntil %v RunAt %v", got.LeaseUntil, got.RunAt)
	}
	// A transaction sees the stored values.
	must(t, s.InTask(t.Context(), k.ID, now, func(tx store.TaskTx) error {
		diff(t, "tx.Task() in the next transaction", &want, tx.Task())
		return nil
	}), "InTask read")

	// Clearing every optional column round-trips too.
	later := at(6 * time.Second)
	cleared := *k
	cleared.Status = status.TaskSucceeded
	must(t, s.InTask(t.Context(), k.ID, later, func(tx store.TaskTx) error {
		u := cleared
		return tx.UpdateTask(&u)
	}), "InTask clear")
	want = cleared
	want.UpdatedAt = later
	diff(t, "task after clearing", &want, getTask(t, s, k.ID))
	if got := getTask(t, s, k.ID); got.Result != nil || got.LeaseUntil != nil || got.FinishedAt != nil || got.LeaseToken != "" {
		t.Errorf("cleared columns came back: %+v", got)
	}
	// UpdateTask writes no events.
	diff(t, "events", []string{"created"}, eventTypes(events(t, s, k.ID)))
}

func testAppendTaskSeq(t *testing.T, s store.Store) {
	k := mkTask(t, s, newTask("billing.invoice.v1", t0), t0)
	c := claimTasks(t, s, []string{"billing.%"}, "w", t0, 30*time.Second, 1)
	if len(c) != 1 {
		t.Fatalf("claimed %d, want 1", len(c))
	}
	now := at(time.Second)
	must(t, s.InTask(t.Context(), k.ID, now, func(tx store.TaskTx) error {
		if err := tx.AppendTask(store.NewEvent{Type: "heartbeat", Data: map[string]any{"n": 1}}); err != nil {
			return err
		}
		return tx.AppendTask(store.NewEvent{Type: "heartbeat", Data: map[string]any{"n": 2}}, store.NewEvent{Type: "note", Step: `s "<é>"\`})
	}), "InTask append")
	// Appending nothing leaves the sequence alone.
	must(t, s.InTask(t.Context(), k.ID, now, func(store.TaskTx) error { return nil }), "InTask noop")
	later := at(2 * time.Second)
	must(t, s.InTask(t.Context(), k.ID, later, func(tx store.TaskTx) error {
		return tx.AppendTask(store.NewEvent{Type: "retried"})
	}), "InTask append later")
	evs := events(t, s, k.ID)
	diff(t, "types", []string{"created", "claimed", "heartbeat", "heartbeat", "note", "retried"}, eventTypes(evs))
	diff(t, "seqs", seqRange(1, 6), seqs(evs))
	if len(evs) == 6 {
		want := []*store.Event{
			{RunID: k.ID, Seq: 3, Type: "heartbeat", Data: json.RawMessage(`{"n":1}`), At: now},
			{RunID: k.ID, Seq: 4, Type: "heartbeat", Data: json.RawMessage(`{"n":2}`), At: now},
			{RunID: k.ID, Seq: 5, Type: "note", Step: `s "<é>"\`, At: now},
			{RunID: k.ID, Seq: 6, Type: "retried", At: later},
		}
		diff(t, "appended events", want, evs[2:])
	}
	// A claim after the appends continues the same sequence.
	c = claimTasks(t, s, []string{"billing.%"}, "w", at(time.Hour), 30*time.Second, 1)
	if len(c) != 1 {
		t.Fatalf("reclaimed %d, want 1", len(c))
	}
	evs = events(t, s, k.ID)
	diff(t, "seqs after a reclaim", seqRange(1, 8), seqs(evs))
	diff(t, "types after a reclaim", []string{"lease_expired", "claimed"}, eventTypes(evs[len(evs)-2:]))
}

func testCancelTasks(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r1 := mkSimpleRun(t, s, wf)
	r2 := mkSimpleRun(t, s, wf)
	mk := func(runID, typ, step string) *store.Task {
		t.Helper()
		k := &store.Task{Type: typ, Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: t0, Step: step}
		inRun(t, s, runID, t0, func(tx store.RunTx) error { return tx.CreateTask(k) })
		return k
	}
	pending := mk(r1.ID, "r1.pending.v1", "a")
	leased := mk(r1.ID, "r1.leased.v1", "b")
	done := mk(r1.ID, "r1.done.v1", "a")
	otherRun := mk(r2.ID, "r2.pending.v1", "a")
	solo := mkTask(t, s, newTask("solo.pending.v1", t0), t0)

	c := claimTasks(t, s, []string{"r1.leased.v1"}, "w", t0, time.Hour, 1)
	if len(c) != 1 {
		t.Fatalf("claimed %d, want 1", len(c))
	}
	setTask(t, s, done.ID, t0, func(k *store.Task) { k.Status, k.FinishedAt = status.TaskSucceeded, ptr(t0) })
	doneBefore := getTask(t, s, done.ID)
	otherBefore := getTask(t, s, otherRun.ID)
	soloBefore := getTask(t, s, solo.ID)

	now := at(time.Minute)
	// Named with r1's tasks, a task of another run and a standalone one
	// are left alone: a run cancels only its own.
	named := []string{pending.ID, leased.ID, done.ID, otherRun.ID, solo.ID}
	inRun(t, s, r1.ID, now, func(tx store.RunTx) error { return tx.CancelTasks(named...) })

	for _, id := range []string{pending.ID, leased.ID} {
		k := getTask(t, s, id)
		if k.Status != status.TaskCancelled || !k.CancelRequested || k.FinishedAt == nil || !k.FinishedAt.Equal(now) || !k.UpdatedAt.Equal(now) {
			t.Errorf("task %s (%s) = {Status:%s CancelRequested:%v FinishedAt:%v UpdatedAt:%v}, want cancelled at %v",
				id, k.Type, k.Status, k.CancelRequested, k.FinishedAt, k.UpdatedAt, now)
		}
	}
	// The leased task keeps its token so its worker's heartbeat can learn
	// about the cancellation.
	if k := getTask(t, s, leased.ID); k.LeaseToken != c[0].LeaseToken {
		t.Errorf("cancelled leased task token = %q, want %q kept", k.LeaseToken, c[0].LeaseToken)
	}
	evs := events(t, s, pending.ID)
	diff(t, "pending task events", []string{"created", "cancelled"}, eventTypes(evs))
	diff(t, "pending task seqs", []int64{1, 2}, seqs(evs))
	if len(evs) == 2 && !evs[1].At.Equal(now) {
		t.Errorf("cancelled event at %v, want %v", evs[1].At, now)
	}
	evs = events(t, s, leased.ID)
	diff(t, "leased task events", []string{"created", "claimed", "cancelled"}, eventTypes(evs))
	diff(t, "leased task seqs", []int64{1, 2, 3}, seqs(evs))

	diff(t, "finished task of the run untouched", doneBefore, getTask(t, s, done.ID))
	diff(t, "finished task events", []string{"created"}, eventTypes(events(t, s, done.ID)))
	diff(t, "other run's task untouched", otherBefore, getTask(t, s, otherRun.ID))
	diff(t, "standalone task untouched", soloBefore, getTask(t, s, solo.ID))

	got := claimTasks(t, s, []string{"%"}, "w", far, time.Minute, 100)
	diff(t, "claimable after CancelTasks", []string{"r2.pending.v1", "solo.pending.v1"}, taskTypes(got))

	// A second CancelTasks finds nothing more to cancel.
	inRun(t, s, r1.ID, at(2*time.Minute), func(tx store.RunTx) error { return tx.CancelTasks(named...) })
	diff(t, "pending task events after a second CancelTasks", []string{"created", "cancelled"}, eventTypes(events(t, s, pending.ID)))
}

func testTaskTypes(t *testing.T, s store.Store) {
	ctx := t.Context()
	if got, err := s.ListTaskTypes(ctx); err != nil || len(got) != 0 {
		t.Fatalf("ListTaskTypes on an empty store = %v, %v", got, err)
	}
	_, err := s.GetTaskType(ctx, "billing.invoice.v1")
	wantErr(t, err, store.ErrNotFound, "GetTaskType(unknown)")

	in := &store.TaskType{Type: "billing.invoice.v1", Description: "Issue an invoice ✓", Enabled: true, MaxAttempts: 3, RetryDelay: 2*time.Minute + 5*time.Millisecond}
	put, err := s.PutTaskType(ctx, in)
	must(t, err, "PutTaskType")
	if put.CreatedAt.IsZero() || !put.UpdatedAt.Equal(put.CreatedAt) {
		t.Errorf("new type CreatedAt %v UpdatedAt %v, want both set and equal", put.CreatedAt, put.UpdatedAt)
	}
	want := *in
	want.CreatedAt, want.UpdatedAt = put.CreatedAt, put.UpdatedAt
	diff(t, "PutTaskType result", &want, put)
	got, err := s.GetTaskType(ctx, in.Type)
	must(t, err, "GetTaskType")
	diff(t, "GetTaskType", &want, got)

	second, err := s.PutTaskType(ctx, &store.TaskType{Type: "audit.log.v2", Enabled: false})
	must(t, err, "PutTaskType second")
	if second.Enabled || second.Description != "" || second.MaxAttempts != 0 || second.RetryDelay != 0 {
		t.Errorf("second type = %+v, want disabled with zero defaults", second)
	}

	// Put is an upsert: every field is replaced, created_at is kept.
	up := &store.TaskType{Type: "billing.invoice.v1", Description: "changed", Enabled: false, MaxAttempts: 0, RetryDelay: 0}
	upd, err := s.PutTaskType(ctx, up)
	must(t, err, "PutTaskType upsert")
	want = *up
	want.CreatedAt, want.UpdatedAt = put.CreatedAt, upd.UpdatedAt
	diff(t, "upserted type", &want, upd)
	if upd.UpdatedAt.Before(put.UpdatedAt) {
		t.Errorf("UpdatedAt went backwards: %v < %v", upd.UpdatedAt, put.UpdatedAt)
	}
	got, err = s.GetTaskType(ctx, up.Type)
	must(t, err, "GetTaskType after upsert")
	diff(t, "GetTaskType after upsert", upd, got)

	list, err := s.ListTaskTypes(ctx)
	must(t, err, "ListTaskTypes")
	diff(t, "ListTaskTypes (by type)", []*store.TaskType{second, upd}, list)
}

// testInTasksKnownRuns: InTasks takes the runs of tasks the caller knows
// (it need not look them up) and checks them: a task given with a wrong
// run is refused and changes nothing, the others of the call apply.
func testInTasksKnownRuns(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	run := func() *store.Run {
		return mkRun(t, s, &store.NewRun{
			Run:   baseRun(wf, ""),
			Steps: []*store.StepRun{{Name: "a", Position: 0, Type: "task", Status: status.StepRunning}},
			Tasks: []*store.Task{{Type: "known.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: t0, Step: "a"}},
		})
	}
	r1, r2 := run(), run()
	byRun := map[string]*store.Task{}
	for _, k := range claimTasks(t, s, []string{"known.x.v1"}, "w", t0, time.Minute, 10) {
		byRun[k.RunID] = k
	}
	k1, k2 := byRun[r1.ID], byRun[r2.ID]
	if k1 == nil || k2 == nil {
		t.Fatalf("claimed %d tasks, want one per run", len(byRun))
	}
	// k1 given with its run, k2 with r1's: k2 is refused.
	known := map[string]string{k1.ID: r1.ID, k2.ID: r1.ID}
	var applied []string
	errs, err := s.InTasks(t.Context(), []string{k1.ID, k2.ID}, known, at(time.Second), func(i int, tx store.TaskTx) error {
		if i == 0 {
			applied = nil // a decision starts over (see testInTasksBatch)
		}
		k := *tx.Task()
		applied = append(applied, k.RunID)
		if tx.Run() == nil || tx.Run().Run().ID != k.RunID {
			return fmt.Errorf("task of run %s applied under another run's lock", k.RunID)
		}
		k.Status = status.TaskSucceeded
		return tx.UpdateTask(&k)
	})
	must(t, err, "InTasks")
	if errs[0] != nil {
		t.Errorf("task given with its own run: %v", errs[0])
	}
	if errs[1] == nil {
		t.Error("task given with another task's run was applied")
	}
	diff(t, "tasks applied", []string{r1.ID}, applied)
	if got := getTask(t, s, k1.ID); got.Status != status.TaskSucceeded {
		t.Errorf("first task %s, want succeeded", got.Status)
	}
	if got := getTask(t, s, k2.ID); got.Status != status.TaskLeased {
		t.Errorf("refused task %s, want still leased", got.Status)
	}
}

// testCreatedLeasedThenCancelled: a task created leased (handed to a
// worker in its transaction) and cancelled by the same transaction is not
// reported as committed leased, and its object says cancelled; one that
// stays leased is reported.
func testCreatedLeasedThenCancelled(t *testing.T, s store.Store) {
	var mu sync.Mutex
	var leased []string
	s.OnCommit(func(c store.Committed) {
		mu.Lock()
		leased = append(leased, c.Leased...)
		mu.Unlock()
	})
	wf := mkWorkflow(t, s, "wf")
	r1 := mkSimpleRun(t, s, wf)
	r2 := mkSimpleRun(t, s, wf)
	mk := func(tok string) *store.Task {
		return &store.Task{Type: "x.y.v1", Payload: json.RawMessage(`{}`), Status: status.TaskLeased, Attempt: 1, LeasedBy: "w",
			LeaseToken: tok, LeaseUntil: ptr(at(time.Hour)), Priority: 100, RunAt: t0, Step: "a"}
	}
	gone, kept := mk("tok-gone"), mk("tok-kept")
	inRun(t, s, r1.ID, t0, func(tx store.RunTx) error {
		if err := tx.CreateTask(gone); err != nil {
			return err
		}
		return tx.CancelTasks(gone.ID)
	})
	inRun(t, s, r2.ID, t0, func(tx store.RunTx) error { return tx.CreateTask(kept) })
	mu.Lock()
	got := slices.Clone(leased)
	mu.Unlock()
	if !slices.Equal(got, []string{"tok-kept"}) {
		t.Errorf("committed leased tokens = %v, want [tok-kept]", got)
	}
	if gone.Status != status.TaskCancelled || kept.Status != status.TaskLeased {
		t.Errorf("objects after commit: cancelled one %s, kept one %s", gone.Status, kept.Status)
	}
	if k := getTask(t, s, gone.ID); k.Status != status.TaskCancelled {
		t.Errorf("stored task created leased then cancelled = %s", k.Status)
	}
}

// heartbeats appends n heartbeat events to task id, one transaction each.
func heartbeats(t *testing.T, s store.Store, id string, now time.Time, n int) {
	t.Helper()
	for i := range n {
		must(t, s.InTask(t.Context(), id, now, func(tx store.TaskTx) error {
			return tx.AppendTask(store.NewEvent{Type: "heartbeat", Data: map[string]any{"n": i}})
		}), "InTask heartbeat")
	}
}

// testTaskEventsPastRow: a task's log is one sequence however long it
// grows (a store may keep its first events apart from the rest), and
// pages cut it anywhere.
func testTaskEventsPastRow(t *testing.T, s store.Store) {
	k := mkTask(t, s, newTask("billing.invoice.v1", t0), t0)
	if c := claimTasks(t, s, []string{"billing.%"}, "w", t0, time.Hour, 1); len(c) != 1 {
		t.Fatalf("claimed %d, want 1", len(c))
	}
	now := at(time.Second)
	heartbeats(t, s, k.ID, now, 20)
	must(t, s.InTask(t.Context(), k.ID, now, func(tx store.TaskTx) error {
		return tx.AppendTask(store.NewEvent{Type: "succeeded", Step: `s "<é>"\`, Data: map[string]any{"ok": true}})
	}), "InTask succeeded")
	evs := events(t, s, k.ID)
	diff(t, "seqs", seqRange(1, 23), seqs(evs))
	if len(evs) != 23 {
		return
	}
	for i, e := range evs[2:22] {
		if e.Type != "heartbeat" || string(e.Data) != fmt.Sprintf(`{"n":%d}`, i) || !e.At.Equal(now) || e.RunID != k.ID {
			t.Errorf("event %d = %+v (data %s), want heartbeat {\"n\":%d} at %v", e.Seq, e, e.Data, i, now)
		}
	}
	diff(t, "last event", &store.Event{RunID: k.ID, Seq: 23, Type: "succeeded", Step: `s "<é>"\`, Data: json.RawMessage(`{"ok":true}`), At: now}, evs[22])
	for _, p := range []struct {
		after int64
		lim   int
	}{{0, 1}, {5, 3}, {6, 4}, {7, 5}, {8, 1}, {20, 10}, {23, 5}, {0, 1000}} {
		got, err := s.ListEvents(t.Context(), k.ID, p.after, p.lim)
		must(t, err, "ListEvents")
		want := evs[min(p.after, 23):min(p.after+int64(p.lim), 23)]
		diff(t, fmt.Sprintf("page after %d, limit %d", p.after, p.lim), seqs(want), seqs(got))
		if len(want) > 0 && len(got) == len(want) {
			diff(t, fmt.Sprintf("page after %d, limit %d", p.after, p.lim), want, got)
		}
	}
}

// testCancelTasksPastRow: a run's cancellation numbers each task's
// cancelled event after whatever its log holds, short or long.
func testCancelTasksPastRow(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)
	var ks []*store.Task
	for _, step := range []string{"a", "b", "c"} {
		k := &store.Task{Type: "long." + step + ".v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: t0, Step: step}
		inRun(t, s, r.ID, t0, func(tx store.RunTx) error { return tx.CreateTask(k) })
		ks = append(ks, k)
	}
	// 1 + 6 events, 1 + 7 and 1 + 12 before the cancellation: its event
	// is the row's last, just past it, and well past it.
	for i, n := range []int{6, 7, 12} {
		heartbeats(t, s, ks[i].ID, t0, n)
	}
	now := at(time.Minute)
	inRun(t, s, r.ID, now, func(tx store.RunTx) error { return tx.CancelTasks(ks[0].ID, ks[1].ID, ks[2].ID) })
	for i, n := range []int{6, 7, 12} {
		evs := events(t, s, ks[i].ID)
		diff(t, ks[i].Type+" seqs", seqRange(1, int64(n)+2), seqs(evs))
		if len(evs) == n+2 {
			last := evs[n+1]
			if last.Type != "cancelled" || !last.At.Equal(now) || string(last.Data) != `{"reason":"run cancelled"}` {
				t.Errorf("%s: last event = %+v (data %s), want cancelled at %v", ks[i].Type, last, last.Data, now)
			}
		}
	}
}

// testTaskEventsLegacy: a task whose first events were written to the
// events table (by a version before tasks held their own) continues its
// log in order; the migration moves nothing.
func testTaskEventsLegacy(t *testing.T, s store.Store) {
	ctx := t.Context()
	raw := rawDB(t, s)
	k := mkTask(t, s, newTask("legacy.v1", t0), t0)
	before := events(t, s, k.ID)
	if len(before) != 1 {
		t.Fatalf("events of a new task = %d, want 1", len(before))
	}
	for _, q := range []string{
		fmt.Sprintf(`UPDATE tasks SET events = '' WHERE id = '%s'`, k.ID),
		fmt.Sprintf(`INSERT INTO events (run_id, seq, type, step, data, at) VALUES ('%s', 1, 'created', '', '%s', %d)`, k.ID, before[0].Data, t0.UnixMicro()),
	} {
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	diff(t, "the legacy log", before, events(t, s, k.ID))
	if c := claimTasks(t, s, []string{"legacy.%"}, "w", t0, time.Hour, 1); len(c) != 1 {
		t.Fatalf("claimed %d, want 1", len(c))
	}
	heartbeats(t, s, k.ID, t0, 9)
	evs := events(t, s, k.ID)
	diff(t, "seqs", seqRange(1, 11), seqs(evs))
	diff(t, "types", append([]string{"created", "claimed"}, slices.Repeat([]string{"heartbeat"}, 9)...), eventTypes(evs))
	got, err := s.ListEvents(ctx, k.ID, 0, 2)
	must(t, err, "ListEvents")
	diff(t, "first page", seqRange(1, 2), seqs(got))
}

// testTaskCreatedImplied: a task's row implies its created event rather
// than holding it (migration 0016), and the log reads the same from it
// as from a row that holds the event written out (before 0016): for a
// standalone task and a run's, whatever its type holds, on every page.
func testTaskCreatedImplied(t *testing.T, s store.Store) {
	ctx := t.Context()
	raw := rawDB(t, s)
	// Every other time of each task (run_at, updated_at) differs from
	// its creation's, so the event's time can only come from created_at.
	solo := mkTask(t, s, newTask(`odd"type<&>\\é`, at(time.Hour)), t0)
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)
	created := at(time.Second + 7*time.Microsecond)
	later := created.Add(time.Minute)
	var step *store.Task
	inRun(t, s, r.ID, created, func(tx store.RunTx) error {
		step = &store.Task{Type: "content.thumbnail.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: created.Add(time.Second), Step: "a"}
		return tx.CreateTask(step)
	})
	if c := claimTasks(t, s, []string{"content.%"}, "w", later, time.Hour, 1); len(c) != 1 {
		t.Fatalf("claimed %d, want 1", len(c))
	}
	heartbeats(t, s, step.ID, later, 2)
	heartbeats(t, s, solo.ID, later, 1)
	for _, c := range []struct {
		k    *store.Task
		at   time.Time
		data map[string]any
	}{
		{solo, t0, map[string]any{"type": solo.Type}},
		{step, created, map[string]any{"run_id": r.ID, "step": "a", "type": "content.thumbnail.v1"}},
	} {
		var row string
		must(t, raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT events FROM tasks WHERE id = '%s'`, c.k.ID)).Scan(&row), "read the task's row")
		if !strings.HasPrefix(row, "~") || strings.Contains(row, `"created"`) {
			t.Errorf("task row's events = %q, want the created event implied (~), not written", row)
		}
		evs := events(t, s, c.k.ID)
		e := evs[0]
		if e.RunID != c.k.ID || e.Seq != 1 || e.Type != "created" || e.Step != "" || !e.At.Equal(c.at) {
			t.Errorf("created event = %+v, want {RunID:%s Seq:1 Type:created At:%v}", e, c.k.ID, c.at)
		}
		diff(t, "created event data", c.data, eventData(t, e))
		for after := range evs {
			got, err := s.ListEvents(ctx, c.k.ID, int64(after), 2)
			must(t, err, "ListEvents")
			diff(t, fmt.Sprintf("page after %d", after), evs[after:min(after+2, len(evs))], got)
		}

		// The same row with the event written out, as rows before 0016.
		legacy := fmt.Sprintf(`,{"seq":1,"type":"created","data":%s,"at":%d}`, e.Data, c.at.UnixMicro()) + strings.TrimPrefix(row, "~")
		_, err := raw.ExecContext(ctx, fmt.Sprintf(`UPDATE tasks SET events = '%s' WHERE id = '%s'`, legacy, c.k.ID))
		must(t, err, "write the legacy row")
		diff(t, "the log from the legacy row", evs, events(t, s, c.k.ID))
	}
}

// testTaskClaimTies: tasks equal in priority, due time and creation (a
// fan-out's) are claimed in id order, the pending ones and those whose
// lease ran out alike, whatever order the rows come back in.
func testTaskClaimTies(t *testing.T, s store.Store) {
	var ids []string
	for range 6 {
		ids = append(ids, mkTask(t, s, newTask("tie.x.v1", t0), t0).ID)
	}
	slices.Sort(ids)
	// Two of them leased and then left to expire: the claim reads them
	// through the other walk, and they must still take their place by id.
	diff(t, "first claim", ids[:2], taskIDs(claimTasks(t, s, []string{"tie.%"}, "w", t0, time.Second, 2)))
	got := claimTasks(t, s, []string{"tie.%"}, "w", at(time.Minute), time.Minute, 4)
	diff(t, "claimed ids", ids[:4], taskIDs(got))
}

// testCancelTasksManyIDs: runs that name more task ids together than a
// statement can bind on SQLite (a timer transaction stopping a thousand
// runs of many task steps) have their tasks cancelled all the same, each
// run only its own.
func testCancelTasksManyIDs(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r1, r2 := mkSimpleRun(t, s, wf), mkSimpleRun(t, s, wf)
	mk := func(runID string) *store.Task {
		t.Helper()
		k := &store.Task{Type: "many.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: t0, Step: "a"}
		inRun(t, s, runID, t0, func(tx store.RunTx) error { return tx.CreateTask(k) })
		return k
	}
	k1, k2, other := mk(r1.ID), mk(r2.ID), mk(r2.ID)
	unknown := func(prefix string, n int) []string {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("%s-%05d", prefix, i)
		}
		return ids
	}
	// r1 names 20,000 ids with its task in the middle and r2's task among
	// them; r2 names 20,000 more and its own first task last.
	ids1 := unknown("a", 20000)
	ids1[10000], ids1[15000] = k1.ID, other.ID
	ids2 := append(unknown("b", 20000), k2.ID)
	// Both runs' expiries are due: one timer transaction stops both.
	n, errs, err := s.FireTimers(t.Context(), []string{r1.ID, r2.ID}, nil, at(2*time.Hour), time.Minute, func(it *store.QueueItem, tx store.RunTx) error {
		if it.RunID == r1.ID {
			return tx.CancelTasks(ids1...)
		}
		return tx.CancelTasks(ids2...)
	})
	must(t, err, "FireTimers")
	if n != 2 || len(errs) != 0 {
		t.Fatalf("FireTimers took %d items with errors %v, want 2 and none", n, errs)
	}
	for _, k := range []*store.Task{k1, k2} {
		if got := getTask(t, s, k.ID); got.Status != status.TaskCancelled {
			t.Errorf("task %s of its run = %s, want cancelled", k.ID, got.Status)
		}
	}
	if got := getTask(t, s, other.ID); got.Status != status.TaskPending {
		t.Errorf("r2's task named by r1 = %s, want still pending", got.Status)
	}
}

// testConcurrentReportsOfOneRun: reports of one run's tasks in concurrent
// transactions, with run transactions beside them, lose no write: every
// step and task ends as its report left it, and the run's events are
// numbered without gap or repeat. (A store that decides a batch on rows it
// cached must find out that another transaction wrote them since.)
func testConcurrentReportsOfOneRun(t *testing.T, s store.Store) {
	const n, notes = 8, 8
	wf := mkWorkflow(t, s, "wf")
	nr := &store.NewRun{Run: baseRun(wf, "")}
	for i := range n {
		name := fmt.Sprintf("s%d", i)
		nr.Steps = append(nr.Steps, &store.StepRun{Name: name, Position: i, Type: "task", Status: status.StepRunning})
		nr.Tasks = append(nr.Tasks, &store.Task{Type: "conc.x.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: t0, Step: name})
	}
	r := mkRun(t, s, nr)
	ks := claimTasks(t, s, []string{"conc.x.v1"}, "w", t0, time.Minute, n)
	if len(ks) != n {
		t.Fatalf("claimed %d tasks, want %d", len(ks), n)
	}
	now := at(time.Second)
	var wg sync.WaitGroup
	errc := make(chan error, n+notes)
	for _, k := range ks {
		wg.Go(func() {
			errs, err := s.InTasks(t.Context(), []string{k.ID}, map[string]string{k.ID: r.ID}, now, func(_ int, tx store.TaskTx) error {
				task := tx.Task()
				if task.Status != status.TaskLeased || task.LeaseToken != k.LeaseToken {
					return fmt.Errorf("task %s is %s (token %q), want leased with %q", task.ID, task.Status, task.LeaseToken, k.LeaseToken)
				}
				task.Status = status.TaskSucceeded
				if err := tx.UpdateTask(task); err != nil {
					return err
				}
				rt := tx.Run()
				st := rt.Step(task.Step)
				st.Status = status.StepSuccess
				if err := rt.UpdateStep(st); err != nil {
					return err
				}
				return rt.Append(store.NewEvent{Type: "step_succeeded", Step: task.Step})
			})
			if err == nil {
				err = errs[0]
			}
			errc <- err
		})
	}
	for range notes {
		wg.Go(func() {
			errc <- s.InRun(t.Context(), r.ID, now, func(tx store.RunTx) error {
				return tx.Append(store.NewEvent{Type: "noted"})
			})
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Error(err)
		}
	}
	_, steps := getRun(t, s, r.ID)
	for _, st := range steps {
		if st.Status != status.StepSuccess {
			t.Errorf("step %s = %s, want %s", st.Name, st.Status, status.StepSuccess)
		}
	}
	for _, k := range ks {
		if got := getTask(t, s, k.ID); got.Status != status.TaskSucceeded {
			t.Errorf("task of step %s = %s, want %s", k.Step, got.Status, status.TaskSucceeded)
		}
	}
	evs := events(t, s, r.ID)
	count := map[string]int{}
	for _, e := range evs {
		count[e.Type]++
	}
	if count["step_succeeded"] != n || count["noted"] != notes {
		t.Errorf("run events %v, want %d step_succeeded and %d noted", count, n, notes)
	}
	want := make([]int64, len(evs))
	for i := range want {
		want[i] = int64(i + 1)
	}
	diff(t, "run event seqs", want, seqs(evs))
}

// testCommittedTasksAt: a commit whose tasks made pending are all
// scheduled ahead tells when the first becomes claimable (waiting claims
// need not look before); one with any task claimable at once tells zero.
// A retry's backoff counts as scheduled ahead.
// recordCommits registers a commit hook on s and returns what takes the
// commits told since the last take.
func recordCommits(s store.Store) func() []store.Committed {
	var mu sync.Mutex
	var got []store.Committed
	s.OnCommit(func(c store.Committed) {
		mu.Lock()
		got = append(got, c)
		mu.Unlock()
	})
	return func() []store.Committed {
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}
}

func testCommittedTasksAt(t *testing.T, s store.Store) {
	take := recordCommits(s)
	last := func(what string) store.Committed {
		t.Helper()
		got := take()
		if len(got) == 0 || !got[len(got)-1].Tasks {
			t.Fatalf("%s: commits %+v, want the last saying tasks became pending", what, got)
		}
		return got[len(got)-1]
	}
	mkTask(t, s, newTask("at.a.v1", at(time.Hour)), t0)
	if c := last("a task an hour ahead"); !c.TasksAt.Equal(at(time.Hour)) {
		t.Errorf("a task an hour ahead: TasksAt %v, want %v", c.TasksAt, at(time.Hour))
	}
	mkTask(t, s, newTask("at.a.v1", t0), t0)
	if c := last("a task due now"); !c.TasksAt.IsZero() {
		t.Errorf("a task due at once: TasksAt %v, want zero", c.TasksAt)
	}
	wf := mkWorkflow(t, s, "wf")
	r1, r2 := mkSimpleRun(t, s, wf), mkSimpleRun(t, s, wf)
	inRun(t, s, r1.ID, t0, func(tx store.RunTx) error {
		if err := tx.CreateTask(&store.Task{Type: "at.b.v1", Payload: json.RawMessage(`{}`), Priority: 100, RunAt: at(2 * time.Hour), Step: "a"}); err != nil {
			return err
		}
		return tx.CreateTask(&store.Task{Type: "at.b.v1", Payload: json.RawMessage(`{}`), Priority: 100, RunAt: at(time.Minute), Step: "b"})
	})
	if c := last("two tasks ahead"); !c.TasksAt.Equal(at(time.Minute)) {
		t.Errorf("two tasks ahead in one commit: TasksAt %v, want the earlier %v", c.TasksAt, at(time.Minute))
	}
	inRun(t, s, r2.ID, t0, func(tx store.RunTx) error {
		if err := tx.CreateTask(&store.Task{Type: "at.b.v1", Payload: json.RawMessage(`{}`), Priority: 100, RunAt: at(time.Hour), Step: "a"}); err != nil {
			return err
		}
		return tx.CreateTask(&store.Task{Type: "at.b.v1", Payload: json.RawMessage(`{}`), Priority: 100, RunAt: t0, Step: "b"})
	})
	if c := last("one due, one ahead"); !c.TasksAt.IsZero() {
		t.Errorf("one task due and one ahead: TasksAt %v, want zero", c.TasksAt)
	}
	k := claimTasks(t, s, []string{"at.a.v1"}, "w", t0, time.Minute, 1)
	if len(k) != 1 {
		t.Fatalf("claimed %d tasks, want 1", len(k))
	}
	take()
	setTask(t, s, k[0].ID, at(time.Second), func(k *store.Task) {
		k.Status, k.LeaseToken, k.LeaseUntil, k.LeasedBy, k.RunAt = status.TaskPending, "", nil, "", at(10*time.Minute)
	})
	if c := last("a retry backing off"); !c.TasksAt.Equal(at(10 * time.Minute)) {
		t.Errorf("a retry backing off: TasksAt %v, want %v", c.TasksAt, at(10*time.Minute))
	}
}

// testFailedReportOnDueTask: a batch of reports in which one fails on a
// task that is pending and due (a stale report; the batch locked the task
// until it committed, so a claim at that moment skipped it) says tasks
// may be claimable at once, even when the rest of the batch only retried
// a task with a backoff.
func testFailedReportOnDueTask(t *testing.T, s store.Store) {
	due := mkTask(t, s, newTask("stale.a.v1", t0), t0)
	mkTask(t, s, newTask("stale.b.v1", t0), t0)
	leased := claimTasks(t, s, []string{"stale.b.v1"}, "w", t0, time.Minute, 1)
	if len(leased) != 1 {
		t.Fatalf("claimed %d tasks, want 1", len(leased))
	}
	take := recordCommits(s)
	now := at(time.Second)
	errs, err := s.InTasks(t.Context(), []string{due.ID, leased[0].ID}, nil, now, func(i int, tx store.TaskTx) error {
		k := *tx.Task()
		if k.ID == due.ID {
			return errors.New("stale report: the task is not leased")
		}
		k.Status, k.LeaseToken, k.LeaseUntil, k.LeasedBy, k.RunAt = status.TaskPending, "", nil, "", at(10*time.Minute)
		return tx.UpdateTask(&k)
	})
	must(t, err, "InTasks")
	if errs[0] == nil || errs[1] != nil {
		t.Fatalf("errs = %v, want the first report failed and the second applied", errs)
	}
	if got := take(); len(got) != 1 || !got[0].Tasks || !got[0].TasksAt.IsZero() {
		t.Errorf("commits %+v, want one saying tasks may be claimable at once", got)
	}
}

// testEventsCounted: OnEvents tells how many events of each type every
// committed write appended, implied ones included, and nothing of writes
// that rolled back or of a batch's task whose writes were dropped, however
// many times the store decided the batch: the sum over the commits is the
// events the logs hold.
func testEventsCounted(t *testing.T, s store.Store) {
	var mu sync.Mutex
	got := map[string]int{}
	s.OnEvents(func(counts []store.EventCount) {
		mu.Lock()
		defer mu.Unlock()
		seen := map[string]bool{}
		for _, c := range counts {
			if c.N <= 0 || seen[c.Type] {
				t.Errorf("commit's counts %+v: each type once, with a positive count", counts)
			}
			seen[c.Type] = true
			got[c.Type] += c.N
		}
	})
	wf := mkWorkflow(t, s, "wf")
	r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_started", Step: "a"}}})
	inRun(t, s, r.ID, at(time.Second), func(tx store.RunTx) error {
		return tx.Append(store.NewEvent{Type: "step_succeeded", Step: "a"}, store.NewEvent{Type: "step_started", Step: "b"})
	})
	boom := errors.New("boom")
	if err := s.InRun(t.Context(), r.ID, at(2*time.Second), func(tx store.RunTx) error {
		if err := tx.Append(store.NewEvent{Type: "rolled_back"}); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("InRun error = %v, want fn's error", err)
	}

	var ids []string
	for range 3 {
		ids = append(ids, mkTask(t, s, newTask("count.a.v1", t0), t0).ID)
	}
	if n := len(claimTasks(t, s, []string{"count.a.v1"}, "w1", t0, time.Minute, 3)); n != 3 {
		t.Fatalf("claimed %d tasks, want 3", n)
	}
	errs, err := s.InTasks(t.Context(), ids, nil, at(time.Second), func(i int, tx store.TaskTx) error {
		if err := succeedTask(tx); err != nil {
			return err
		}
		if i == 1 {
			return boom // this task's writes are dropped
		}
		return nil
	})
	must(t, err, "InTasks")
	if !errors.Is(errs[1], boom) || errs[0] != nil || errs[2] != nil {
		t.Fatalf("InTasks errs = %v, want only the second to fail", errs)
	}

	want := map[string]int{}
	for _, owner := range append([]string{r.ID}, ids...) {
		for _, e := range events(t, s, owner) {
			want[e.Type]++
		}
	}
	if want["succeeded"] != 2 || want["claimed"] != 3 || want["created"] != 3 || want["rolled_back"] != 0 {
		t.Fatalf("the logs hold %v: not what this test wrote", want)
	}
	mu.Lock()
	defer mu.Unlock()
	diff(t, "events counted at commits against the logs", want, got)
}

// testClaimSince: a claim says when each task it took became claimable:
// its run_at, its last change while pending (a release, a retry), or the
// end of the expired lease it took over.
func testClaimSince(t *testing.T, s store.Store) {
	claim := func(now time.Time) (*store.Task, time.Time) {
		t.Helper()
		c, err := s.ClaimOrNext(t.Context(), store.ClaimTasks{Patterns: []string{"since.a.v1"}, WorkerID: "w", Lease: time.Minute, Max: 1, Now: now})
		must(t, err, "ClaimOrNext")
		if len(c.Tasks) != 1 || len(c.Since) != 1 {
			t.Fatalf("claim at %v: %d tasks, %d moments; want one of each", now, len(c.Tasks), len(c.Since))
		}
		return c.Tasks[0], c.Since[0]
	}
	pend := func(k *store.Task, now, runAt time.Time) {
		t.Helper()
		must(t, s.InTask(t.Context(), k.ID, now, func(tx store.TaskTx) error {
			u := *tx.Task()
			u.Status, u.RunAt, u.LeasedBy, u.LeaseToken, u.LeaseUntil, u.UpdatedAt = status.TaskPending, runAt, "", "", nil, now
			return tx.UpdateTask(&u)
		}), "InTask")
	}
	k := mkTask(t, s, newTask("since.a.v1", at(-time.Minute)), t0) // run_at in the past
	if _, since := claim(at(time.Second)); !since.Equal(t0) {
		t.Errorf("created at t0 with run_at before: since %v, want its creation %v", since, t0)
	}
	pend(k, at(2*time.Second), at(time.Second)) // released: pending from its change
	if _, since := claim(at(3 * time.Second)); !since.Equal(at(2 * time.Second)) {
		t.Errorf("released at +2s: since %v, want %v", since, at(2*time.Second))
	}
	pend(k, at(4*time.Second), at(10*time.Second)) // retried with a backoff
	got, since := claim(at(11 * time.Second))
	if !since.Equal(at(10 * time.Second)) {
		t.Errorf("retried, due at +10s: since %v, want %v", since, at(10*time.Second))
	}
	// Its lease ends at +71s; a claim at +80s takes it over.
	if got.LeaseUntil == nil || !got.LeaseUntil.Equal(at(71*time.Second)) {
		t.Fatalf("lease until %v, want %v", got.LeaseUntil, at(71*time.Second))
	}
	if got, since := claim(at(80 * time.Second)); !got.Reclaimed || !since.Equal(at(71*time.Second)) {
		t.Errorf("reclaimed at +80s: reclaimed %v, since %v, want the old lease's end %v", got.Reclaimed, since, at(71*time.Second))
	}
}
