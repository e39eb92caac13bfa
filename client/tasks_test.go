package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
)

func TestTaskLifecycle(t *testing.T) {
	c, _ := startServer(t)
	ctx := context.Background()
	prio := 7
	task, created, err := c.CreateTask(ctx, client.NewTask{
		Type: "billing.invoice.v1", Payload: json.RawMessage(`{"order_id": 42}`), Priority: &prio,
		IdempotencyKey: "order-42", MaxAttempts: 3, RetryDelay: 90 * time.Second,
	})
	if err != nil || !created {
		t.Fatalf("create: created=%v err=%v", created, err)
	}
	if task.ID == "" || task.Type != "billing.invoice.v1" || task.Status != client.TaskPending || task.Priority != 7 ||
		task.MaxAttempts != 3 || task.RetryDelay != 90*time.Second || task.IdempotencyKey != "order-42" ||
		task.Attempt != 0 || string(task.Payload) != `{"order_id":42}` || task.Result != nil || task.Terminal() {
		t.Fatalf("created task = %s", task.Raw)
	}
	again, created, err := c.CreateTask(ctx, client.NewTask{Type: "billing.invoice.v1", IdempotencyKey: "order-42"})
	if err != nil || created || again.ID != task.ID {
		t.Fatalf("repeated key: id %s created=%v err=%v", again.ID, created, err)
	}

	// Nothing of another type: the long-poll waits, then returns empty.
	begin := time.Now()
	got, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"shipping.%"}, WorkerID: "w1", Wait: 1200 * time.Millisecond})
	if err != nil || len(got) != 0 || got == nil {
		t.Fatalf("empty claim: %v %v", got, err)
	}
	if d := time.Since(begin); d < time.Second {
		t.Fatalf("the long-poll returned after %s, before its wait", d)
	}

	got, err = c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"billing.%"}, WorkerID: "w1", Lease: 20 * time.Second, Max: 5})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %+v %v", got, err)
	}
	ct := got[0]
	if ct.ID != task.ID || ct.Type != task.Type || string(ct.Payload) != `{"order_id":42}` || ct.Attempt != 1 || ct.MaxAttempts != 3 ||
		ct.LeaseToken == "" || ct.RunID != "" || ct.Step != "" || time.Until(ct.LeaseUntil) < 15*time.Second {
		t.Fatalf("claimed %+v", ct)
	}
	if task, err = c.GetTask(ctx, ct.ID); err != nil || task.Status != client.TaskLeased || task.LeasedBy != "w1" || task.LeaseUntil == nil {
		t.Fatalf("leased task: %v %v", task, err)
	}

	hb, err := c.Heartbeat(ctx, ct.ID, ct.LeaseToken, time.Minute)
	if err != nil || hb.CancelRequested || time.Until(hb.LeaseUntil) < 50*time.Second {
		t.Fatalf("heartbeat: %+v %v", hb, err)
	}
	if _, err := c.Heartbeat(ctx, ct.ID, "not-the-token", time.Minute); !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("stale heartbeat: %v", err)
	}
	if err := c.CompleteTask(ctx, ct.ID, "not-the-token", "x"); !errors.Is(err, client.ErrLeaseLost) || errors.Is(err, client.ErrTaskFinished) {
		t.Fatalf("stale complete: %v", err)
	}
	if err := c.CompleteTask(ctx, ct.ID, ct.LeaseToken, map[string]any{"invoice": "INV-1"}); err != nil {
		t.Fatal(err)
	}
	task, err = c.GetTask(ctx, ct.ID)
	if err != nil || task.Status != client.TaskSucceeded || string(task.Result) != `{"invoice":"INV-1"}` || task.FinishedAt == nil || !task.Terminal() {
		t.Fatalf("completed task: %v %v", task, err)
	}
	// The holder's repeated report learns the task finished; anyone else's
	// token is stale.
	if err := c.CompleteTask(ctx, ct.ID, ct.LeaseToken, "again"); !errors.Is(err, client.ErrTaskFinished) {
		t.Fatalf("second complete: %v", err)
	}
	if err := c.FailTask(ctx, ct.ID, "not-the-token", "x", true); !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("stale fail after completion: %v", err)
	}
	if _, err := c.CancelTask(ctx, ct.ID); !errors.Is(err, client.ErrTaskFinished) || errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("cancel finished: %v", err)
	}

	evs, err := c.TaskEvents(ctx, ct.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range evs {
		if ev.TaskID != ct.ID {
			t.Fatalf("event of another task: %+v", ev)
		}
		types = append(types, ev.Type)
	}
	if fmt.Sprint(types) != "[created claimed heartbeat succeeded]" {
		t.Fatalf("events %v", types)
	}
	if rest, err := c.TaskEvents(ctx, ct.ID, evs[1].Seq); err != nil || len(rest) != 2 || rest[0].Type != "heartbeat" {
		t.Fatalf("events after %d: %+v %v", evs[1].Seq, rest, err)
	}

	if _, err := c.GetTask(ctx, "no-such-task"); !client.HasCode(err, client.CodeNotFound) {
		t.Fatalf("unknown task: %v", err)
	}
}

func TestFailAndCancelTask(t *testing.T) {
	c, _ := startServer(t)
	ctx := context.Background()
	a, _, err := c.CreateTask(ctx, client.NewTask{Type: "jobs.a.v1", MaxAttempts: 2, RetryDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	claim := func() client.ClaimedTask {
		t.Helper()
		got, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"jobs.a.v1"}, Wait: 10 * time.Second})
		if err != nil || len(got) != 1 {
			t.Fatalf("claim: %+v %v", got, err)
		}
		return got[0]
	}
	ct := claim()
	if err := c.FailTask(ctx, ct.ID, ct.LeaseToken, "flaky upstream", true); err != nil {
		t.Fatal(err)
	}
	if task, _ := c.GetTask(ctx, a.ID); task.Status != client.TaskPending || task.LastError != "flaky upstream" {
		t.Fatalf("after a retryable failure: %s", task.Raw)
	}
	ct = claim() // the long-poll wakes when the retry comes due
	if ct.Attempt != 2 {
		t.Fatalf("attempt %d", ct.Attempt)
	}
	if err := c.FailTask(ctx, ct.ID, ct.LeaseToken, "bad input", false); err != nil {
		t.Fatal(err)
	}
	if task, _ := c.GetTask(ctx, a.ID); task.Status != client.TaskFailed || task.LastError != "bad input" || task.Attempt != 2 {
		t.Fatalf("after a final failure: %s", task.Raw)
	}

	// Cancelling a leased task: the holder learns it from its heartbeat,
	// and its report is refused.
	b, _, err := c.CreateTask(ctx, client.NewTask{Type: "jobs.b.v1"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"jobs.b.v1"}})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %+v %v", got, err)
	}
	cancelled, err := c.CancelTask(ctx, b.ID)
	if err != nil || cancelled.Status != client.TaskCancelled || !cancelled.CancelRequested {
		t.Fatalf("cancel: %v %v", cancelled, err)
	}
	if hb, err := c.Heartbeat(ctx, b.ID, got[0].LeaseToken, 0); err != nil || !hb.CancelRequested {
		t.Fatalf("heartbeat after cancel: %+v %v", hb, err)
	}
	if err := c.CompleteTask(ctx, b.ID, got[0].LeaseToken, nil); !errors.Is(err, client.ErrTaskFinished) {
		t.Fatalf("complete after cancel: %v", err)
	}
}

func TestClaimLongPollWakesOnNewTask(t *testing.T) {
	c, _ := startServer(t)
	ctx := context.Background()
	type result struct {
		got []client.ClaimedTask
		err error
	}
	done := make(chan result, 1)
	begin := time.Now()
	go func() {
		got, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"mail.%"}, Wait: 50 * time.Second})
		done <- result{got, err}
	}()
	task, _, err := c.CreateTask(ctx, client.NewTask{Type: "mail.send.v1"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		// The claim may have started after the create; either way it
		// must return the task long before its wait.
		if r.err != nil || len(r.got) != 1 || r.got[0].ID != task.ID {
			t.Fatalf("claim: %+v %v", r.got, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the long-poll did not wake for the new task")
	}
	if d := time.Since(begin); d > 20*time.Second {
		t.Fatalf("took %s", d)
	}

	// Cancelling the context abandons the poll.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		_, err := c.ClaimTasks(cctx, client.ClaimRequest{Types: []string{"mail.%"}, Wait: 50 * time.Second})
		done <- result{nil, err}
	}()
	cancel()
	select {
	case r := <-done:
		if !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled claim: %v", r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a cancelled claim did not return")
	}
}

func TestClaimRequestEncoding(t *testing.T) {
	var body map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/tasks/claim" || r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer k" {
			t.Errorf("request %s %s", r.Method, r.URL.Path)
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"data": [{"id": "t1", "type": "a.b.v1", "payload": {"x": 1}, "attempt": 2, "max_attempts": 5, "lease_token": "tok", "lease_until": "2026-01-02T03:04:05Z", "run_id": null, "step": null}]}`)
	}))
	defer srv.Close()
	c := client.New(srv.URL, "k")
	got, err := c.ClaimTasks(context.Background(), client.ClaimRequest{Types: []string{"a.%"}, WorkerID: "w", Lease: 1500 * time.Millisecond, Max: 3, Wait: 2500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"types": []any{"a.%"}, "worker_id": "w", "lease_seconds": 1.5, "max": 3.0, "wait_seconds": 2.5}
	if fmt.Sprint(body) != fmt.Sprint(want) {
		t.Fatalf("sent %v, want %v", body, want)
	}
	if len(got) != 1 || got[0].ID != "t1" || got[0].Attempt != 2 || got[0].LeaseToken != "tok" || got[0].RunID != "" ||
		!got[0].LeaseUntil.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) || string(got[0].Payload) != `{"x": 1}` {
		t.Fatalf("decoded %+v", got)
	}
}

func TestTaskTypes(t *testing.T) {
	c, _ := startServer(t)
	ctx := context.Background()
	tt, err := c.PutTaskType(ctx, client.TaskType{Type: "billing.invoice.v1", Description: "Invoices", Enabled: true, MaxAttempts: 4, RetryDelay: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if tt.Type != "billing.invoice.v1" || tt.Description != "Invoices" || !tt.Enabled || tt.MaxAttempts != 4 || tt.RetryDelay != 2*time.Minute || tt.CreatedAt.IsZero() {
		t.Fatalf("put = %+v", tt)
	}
	if _, err := c.PutTaskType(ctx, client.TaskType{Type: "billing.refund.v1", RetryDelay: 48 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetTaskType(ctx, "billing.refund.v1")
	if err != nil || got.Enabled || got.MaxAttempts != 0 || got.RetryDelay != 48*time.Hour {
		t.Fatalf("get = %+v %v", got, err)
	}
	list, err := c.ListTaskTypes(ctx)
	if err != nil || len(list) != 2 || list[0].Type != "billing.invoice.v1" || list[1].Type != "billing.refund.v1" {
		t.Fatalf("list = %+v %v", list, err)
	}
	// A task of the disabled type waits; the registry's defaults apply.
	task, _, err := c.CreateTask(ctx, client.NewTask{Type: "billing.refund.v1"})
	if err != nil || task.RetryDelay != 48*time.Hour || task.MaxAttempts != 5 {
		t.Fatalf("task of a registered type: %v %v", task, err)
	}
	if claimed, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"billing.refund.v1"}}); err != nil || len(claimed) != 0 {
		t.Fatalf("claimed a disabled type's task: %+v %v", claimed, err)
	}
	if _, err := c.GetTaskType(ctx, "billing.none.v1"); !client.HasCode(err, client.CodeNotFound) {
		t.Fatalf("unknown type: %v", err)
	}
	if _, err := c.PutTaskType(ctx, client.TaskType{Type: "not-versioned"}); !client.HasCode(err, client.CodeInvalidRequest) {
		t.Fatalf("invalid type: %v", err)
	}
}

func TestCreateTaskValidation(t *testing.T) {
	c, _ := startServer(t)
	ctx := context.Background()
	for _, nt := range []client.NewTask{
		{Type: "no-version"},
		{Type: "a.b.v1", MaxAttempts: 101},
		{Type: "a.b.v1", Priority: new(-1)},
	} {
		if _, _, err := c.CreateTask(ctx, nt); !client.HasCode(err, client.CodeInvalidRequest) {
			t.Errorf("%+v: %v", nt, err)
		}
	}
	if _, err := c.ClaimTasks(ctx, client.ClaimRequest{}); !client.HasCode(err, client.CodeInvalidRequest) {
		t.Errorf("claim without types: %v", err)
	}
}

func TestAPIErrorIs(t *testing.T) {
	stale := &client.APIError{StatusCode: 409, Code: client.CodeStaleLease}
	finished := &client.APIError{StatusCode: 409, Code: client.CodeTaskFinished}
	wrapped := fmt.Errorf("report: %w", stale)
	switch {
	case !errors.Is(stale, client.ErrLeaseLost), errors.Is(stale, client.ErrTaskFinished):
		t.Error("stale_lease")
	case !errors.Is(finished, client.ErrTaskFinished), errors.Is(finished, client.ErrLeaseLost):
		t.Error("task_finished")
	case !errors.Is(wrapped, client.ErrLeaseLost):
		t.Error("wrapped")
	case errors.Is(&client.APIError{StatusCode: 500, Code: client.CodeStaleLease}, client.ErrLeaseLost):
		t.Error("a 500 is not a lost lease")
	case errors.Is(&client.APIError{StatusCode: 409, Code: client.CodeConflict}, client.ErrLeaseLost):
		t.Error("another conflict")
	}
}

func TestTaskJSONRoundTrip(t *testing.T) {
	raw := `{"id":"t1","type":"a.b.v1","status":"succeeded","payload":{},"priority":100,"run_at":"2026-01-01T00:00:00Z","attempt":1,"max_attempts":5,"retry_delay":"2d","idempotency_key":null,"leased_by":null,"lease_until":null,"cancel_requested":false,"result":{"ok":true},"last_error":null,"run_id":null,"step":null,"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z","finished_at":"2026-01-01T00:00:01Z"}`
	var task client.Task
	if err := json.Unmarshal([]byte(raw), &task); err != nil {
		t.Fatal(err)
	}
	if task.RetryDelay != 48*time.Hour || string(task.Result) != `{"ok":true}` || task.FinishedAt == nil || string(task.Raw) != raw {
		t.Fatalf("decoded %+v", task)
	}
	b, err := json.Marshal(task)
	if err != nil {
		t.Fatal(err)
	}
	var back client.Task
	if err := json.Unmarshal(b, &back); err != nil || back.RetryDelay != task.RetryDelay || back.ID != "t1" || string(back.Result) != `{"ok":true}` {
		t.Fatalf("round trip %s: %+v %v", b, back, err)
	}
}

// TestCompleteTasks: completions sent together are applied and answered
// one by one (a stale lease refused for its task alone, the others
// stored with their results), each takes the next step its completion
// starts, and a malformed request is refused whole, naming the field.
func TestCompleteTasks(t *testing.T) {
	c, _ := startServer(t)
	ctx := context.Background()
	var ids []string
	for i := range 3 {
		task, _, err := c.CreateTask(ctx, client.NewTask{Type: "batch.v1", Payload: json.RawMessage(fmt.Sprintf(`{"i": %d}`, i))})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
	}
	got, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"batch.v1"}, WorkerID: "w", Max: 3})
	if err != nil || len(got) != 3 {
		t.Fatalf("claim: %v %v", got, err)
	}
	res, err := c.CompleteTasks(ctx, []client.Completion{
		{ID: got[0].ID, LeaseToken: got[0].LeaseToken, Result: map[string]int{"n": 0}},
		{ID: got[1].ID, LeaseToken: "not-the-token", Result: map[string]int{"n": 1}},
		{ID: got[2].ID, LeaseToken: got[2].LeaseToken, Result: json.RawMessage(`{"n": 2}`)},
	}, nil)
	if err != nil || len(res) != 3 {
		t.Fatalf("complete: %v %v", res, err)
	}
	if res[0].ID != got[0].ID || res[0].Err != nil || res[2].Err != nil || !errors.Is(res[1].Err, client.ErrLeaseLost) || res[0].Next != nil {
		t.Fatalf("results %+v", res)
	}
	for i, want := range []string{client.TaskSucceeded, client.TaskLeased, client.TaskSucceeded} {
		task, err := c.GetTask(ctx, got[i].ID)
		if err != nil || task.Status != want {
			t.Fatalf("task %d: %v %v", i, task, err)
		}
		if want == client.TaskSucceeded && string(task.Result) != fmt.Sprintf(`{"n":%d}`, i) {
			t.Errorf("task %d result %s", i, task.Result)
		}
	}
	// A completion larger than a request of its own may be is refused
	// alone, as that request would be (413), the others applied.
	more, _, err := c.CreateTask(ctx, client.NewTask{Type: "batch.v1"})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"batch.v1"}, WorkerID: "w", Max: 1})
	if err != nil || len(claimed) != 1 || claimed[0].ID != more.ID {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	res, err = c.CompleteTasks(ctx, []client.Completion{
		{ID: got[1].ID, LeaseToken: got[1].LeaseToken, Result: json.RawMessage(`"` + strings.Repeat("x", 1<<20) + `"`)},
		{ID: more.ID, LeaseToken: claimed[0].LeaseToken},
	}, nil)
	var ae *client.APIError
	if err != nil || !errors.As(res[0].Err, &ae) || ae.StatusCode != http.StatusRequestEntityTooLarge || ae.Code != "too_large" || res[1].Err != nil {
		t.Fatalf("too large: %+v %v", res, err)
	}
	if task, _ := c.GetTask(ctx, got[1].ID); task.Status != client.TaskLeased {
		t.Fatalf("the refused completion changed its task: %s", task.Raw)
	}

	// Completed again: refused as finished, item by item.
	res, err = c.CompleteTasks(ctx, []client.Completion{{ID: got[0].ID, LeaseToken: got[0].LeaseToken}}, nil)
	if err != nil || !errors.Is(res[0].Err, client.ErrTaskFinished) {
		t.Fatalf("again: %+v %v", res, err)
	}

	// With next: each completion takes the step it starts.
	if _, err := c.CreateWorkflow(ctx, []byte(`{"name": "batch-chain", "tasks": {"a": {"task": {"type": "batch.step.v1"}}, "b": {"needs": ["a"], "task": {"type": "batch.step.v1"}}}}`)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, _, err := c.Trigger(ctx, "batch-chain", nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	firsts, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"batch.step.v1"}, WorkerID: "w", Max: 2, Wait: 5 * time.Second})
	for err == nil && len(firsts) < 2 {
		var more []client.ClaimedTask
		more, err = c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"batch.step.v1"}, WorkerID: "w", Max: 2 - len(firsts), Wait: 5 * time.Second})
		firsts = append(firsts, more...)
	}
	if err != nil {
		t.Fatal(err)
	}
	next := client.ClaimRequest{Types: []string{"batch.step.v1"}, WorkerID: "w", Max: 1}
	res, err = c.CompleteTasks(ctx, []client.Completion{
		{ID: firsts[0].ID, LeaseToken: firsts[0].LeaseToken},
		{ID: firsts[1].ID, LeaseToken: firsts[1].LeaseToken},
	}, &next)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || len(r.Next) != 1 || r.Next[0].RunID != firsts[i].RunID || r.Next[0].Step != "b" || r.Next[0].LeaseToken == "" {
			t.Fatalf("completion %d: %+v", i, r)
		}
	}

	// Malformed requests are refused whole.
	for _, tc := range []struct {
		cs   []client.Completion
		path string
	}{
		{nil, "completions"},
		{make([]client.Completion, client.MaxCompleteBatch+1), "completions"},
		{[]client.Completion{{ID: ids[0]}}, "completions[0].lease_token"},
		{[]client.Completion{{LeaseToken: "x"}}, "completions[0].id"},
		{[]client.Completion{{ID: ids[0], LeaseToken: "x"}, {ID: ids[0], LeaseToken: "y"}}, "completions[1].id"},
	} {
		_, err := c.CompleteTasks(ctx, tc.cs, nil)
		ae := apiError(t, err)
		if ae.StatusCode != http.StatusBadRequest || len(ae.Details) != 1 || ae.Details[0].Path != tc.path {
			t.Errorf("%d completions: %v (%+v)", len(tc.cs), err, ae.Details)
		}
	}
	wait := client.ClaimRequest{Types: []string{"x"}, Wait: time.Second}
	if _, err := c.CompleteTasks(ctx, []client.Completion{{ID: ids[0], LeaseToken: "x"}}, &wait); apiError(t, err).Details[0].Path != "next.wait_seconds" {
		t.Errorf("next with a wait: %v", err)
	}
}

// TestOnePassCallsNeedData: the calls decoded in one pass (the workers'
// and Trigger) still refuse a 200 answer without "data" (a proxy's, say)
// instead of returning nothing claimed.
func TestOnePassCallsNeedData(t *testing.T) {
	// Without "data", and with "data": null (which the server never
	// sends; the old two-pass decode took it for an empty answer).
	for _, body := range []string{`{"ok": true}`, `{"data": null}`} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(body))
		}))
		c := client.New(srv.URL, "k")
		ctx := context.Background()
		if _, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"a.%"}}); err == nil || !strings.Contains(err.Error(), "no data") {
			t.Errorf("%s: claim: %v", body, err)
		}
		if _, err := c.Heartbeat(ctx, "t", "tok", time.Minute); err == nil || !strings.Contains(err.Error(), "no data") {
			t.Errorf("%s: heartbeat: %v", body, err)
		}
		if _, err := c.CompleteTasks(ctx, []client.Completion{{ID: "t", LeaseToken: "tok"}}, nil); err == nil || !strings.Contains(err.Error(), "no data") {
			t.Errorf("%s: complete many: %v", body, err)
		}
		if _, _, err := c.Trigger(ctx, "wf", nil, ""); err == nil || !strings.Contains(err.Error(), "no data") {
			t.Errorf("%s: trigger: %v", body, err)
		}
		if _, err := c.TriggerBatch(ctx, "wf", []client.BatchRun{{}}); err == nil || !strings.Contains(err.Error(), "no data") {
			t.Errorf("%s: trigger batch: %v", body, err)
		}
		srv.Close()
	}
	// A batch answered with fewer results than runs is an error too.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"data": {"runs": []}}`))
	}))
	defer srv.Close()
	if _, err := client.New(srv.URL, "k").TriggerBatch(context.Background(), "wf", []client.BatchRun{{}}); err == nil || !strings.Contains(err.Error(), "0 results for 1") {
		t.Errorf("short batch answer: %v", err)
	}
}
