package ferry_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// The embedded engine and the HTTP client expose one worker interface.
type workerSource interface {
	ClaimTasks(ctx context.Context, req client.ClaimRequest) ([]client.ClaimedTask, error)
	Heartbeat(ctx context.Context, id, token string, lease time.Duration) (client.HeartbeatResult, error)
	CompleteTask(ctx context.Context, id, token string, result any) error
	FailTask(ctx context.Context, id, token, msg string, retryable bool) error
	CreateTask(ctx context.Context, nt client.NewTask) (*client.Task, bool, error)
	CancelTask(ctx context.Context, id string) (*client.Task, error)
	GetTask(ctx context.Context, id string) (*client.Task, error)
}

var (
	_ workerSource = (*ferry.Engine)(nil)
	_ workerSource = (*client.Client)(nil)
)

func TestEngineTaskLifecycle(t *testing.T) {
	srv := ferrytest.Start(t)
	eng := srv.Engine
	ctx := context.Background()

	task, created, err := eng.CreateTask(ctx, client.NewTask{Type: "billing.invoice.v1", Payload: json.RawMessage(`{"n": 1}`), IdempotencyKey: "k1", RetryDelay: time.Minute})
	if err != nil || !created || task.Status != client.TaskPending || task.MaxAttempts != 5 || task.RetryDelay != time.Minute || string(task.Payload) != `{"n": 1}` {
		t.Fatalf("create: %+v %v %v", task, created, err)
	}
	again, created, err := eng.CreateTask(ctx, client.NewTask{Type: "billing.invoice.v1", IdempotencyKey: "k1"})
	if err != nil || created || again.ID != task.ID {
		t.Fatalf("repeated key: %+v %v %v", again, created, err)
	}
	// The engine's view is the server's.
	viaHTTP, err := client.New(srv.URL, srv.Key).GetTask(ctx, task.ID)
	if err != nil || viaHTTP.ID != task.ID || viaHTTP.Status != task.Status || viaHTTP.MaxAttempts != task.MaxAttempts || viaHTTP.RetryDelay != task.RetryDelay {
		t.Fatalf("over HTTP: %+v %v", viaHTTP, err)
	}

	got, err := eng.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"billing.%"}, WorkerID: "embedded", Lease: 10 * time.Second, Max: 10})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %+v %v", got, err)
	}
	ct := got[0]
	if ct.ID != task.ID || ct.Attempt != 1 || ct.MaxAttempts != 5 || ct.LeaseToken == "" || time.Until(ct.LeaseUntil) < 5*time.Second || ct.RunID != "" {
		t.Fatalf("claimed %+v", ct)
	}
	hb, err := eng.Heartbeat(ctx, ct.ID, ct.LeaseToken, time.Minute)
	if err != nil || hb.CancelRequested || time.Until(hb.LeaseUntil) < 50*time.Second {
		t.Fatalf("heartbeat: %+v %v", hb, err)
	}
	for name, err := range map[string]error{
		"heartbeat": func() error { _, err := eng.Heartbeat(ctx, ct.ID, "stale", time.Minute); return err }(),
		"complete":  eng.CompleteTask(ctx, ct.ID, "stale", nil),
		"fail":      eng.FailTask(ctx, ct.ID, "stale", "x", true),
	} {
		var ae *client.APIError
		if !errors.Is(err, client.ErrLeaseLost) || errors.Is(err, client.ErrTaskFinished) || !errors.As(err, &ae) || ae.Code != client.CodeStaleLease {
			t.Errorf("stale %s: %v", name, err)
		}
	}
	if err := eng.CompleteTask(ctx, ct.ID, ct.LeaseToken, map[string]int{"invoice": 7}); err != nil {
		t.Fatal(err)
	}
	done, err := eng.GetTask(ctx, ct.ID)
	if err != nil || done.Status != client.TaskSucceeded || string(done.Result) != `{"invoice":7}` || done.FinishedAt == nil {
		t.Fatalf("completed: %+v %v", done, err)
	}
	if _, err := eng.CancelTask(ctx, ct.ID); !errors.Is(err, client.ErrTaskFinished) {
		t.Fatalf("cancel finished: %v", err)
	}
	if _, err := eng.GetTask(ctx, "nope"); !client.HasCode(err, client.CodeNotFound) {
		t.Fatalf("unknown: %v", err)
	}
}

func TestEngineFailCancelAndRawResult(t *testing.T) {
	eng := ferrytest.Start(t).Engine
	ctx := context.Background()
	a, _, err := eng.CreateTask(ctx, client.NewTask{Type: "jobs.a.v1", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	got, err := eng.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"jobs.a.v1"}})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %+v %v", got, err)
	}
	if err := eng.FailTask(ctx, a.ID, got[0].LeaseToken, "out of attempts", true); err != nil {
		t.Fatal(err)
	}
	if task, _ := eng.GetTask(ctx, a.ID); task.Status != client.TaskFailed || task.LastError != "out of attempts" {
		t.Fatalf("failed: %+v", task)
	}

	b, _, err := eng.CreateTask(ctx, client.NewTask{Type: "jobs.b.v1"})
	if err != nil {
		t.Fatal(err)
	}
	got, err = eng.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"jobs.b.v1"}})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %+v %v", got, err)
	}
	if err := eng.CompleteTask(ctx, b.ID, got[0].LeaseToken, json.RawMessage(`{bad`)); !client.HasCode(err, client.CodeInvalidRequest) {
		t.Fatalf("invalid raw result: %v", err)
	}
	if c, err := eng.CancelTask(ctx, b.ID); err != nil || c.Status != client.TaskCancelled || !c.CancelRequested {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	if hb, err := eng.Heartbeat(ctx, b.ID, got[0].LeaseToken, 0); err != nil || !hb.CancelRequested {
		t.Fatalf("heartbeat after cancel: %+v %v", hb, err)
	}
	if err := eng.CompleteTask(ctx, b.ID, got[0].LeaseToken, json.RawMessage(`{"ok":true}`)); !errors.Is(err, client.ErrTaskFinished) {
		t.Fatalf("complete after cancel: %v", err)
	}
}

func TestEngineClaimLongPoll(t *testing.T) {
	eng := ferrytest.Start(t).Engine
	ctx := context.Background()
	begin := time.Now()
	got, err := eng.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"x.%"}, Wait: time.Second})
	if err != nil || len(got) != 0 || time.Since(begin) < 900*time.Millisecond {
		t.Fatalf("empty poll: %+v %v after %s", got, err, time.Since(begin))
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := eng.ClaimTasks(cctx, client.ClaimRequest{Types: []string{"x.%"}, Wait: time.Minute})
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled poll: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled poll did not return")
	}
}

func TestEngineTaskValidation(t *testing.T) {
	eng := ferrytest.Start(t).Engine
	ctx := context.Background()
	for name, nt := range map[string]client.NewTask{
		"unversioned type": {Type: "invoice"},
		"max_attempts":     {Type: "a.b.v1", MaxAttempts: 500},
		"priority":         {Type: "a.b.v1", Priority: new(2000)},
		"payload":          {Type: "a.b.v1", Payload: json.RawMessage(`{`)},
	} {
		if _, _, err := eng.CreateTask(ctx, nt); !client.HasCode(err, client.CodeInvalidRequest) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, req := range map[string]client.ClaimRequest{
		"no types":    {},
		"bad pattern": {Types: []string{"a%b"}},
		"lease":       {Types: []string{"a.%"}, Lease: time.Millisecond},
		"max":         {Types: []string{"a.%"}, Max: 101},
		"wait":        {Types: []string{"a.%"}, Wait: 2 * time.Minute},
	} {
		if _, err := eng.ClaimTasks(ctx, req); !client.HasCode(err, client.CodeInvalidRequest) {
			t.Errorf("claim %s: %v", name, err)
		}
	}
}

// A RunAt later than 9999-12-31 UTC is refused: past it no answer of the
// API can show the task, and far past it (a year beyond 294246) the
// microseconds the store keeps wrapped into the past, so the task was
// claimable at once.
func TestEngineTaskRunAtBeyond9999(t *testing.T) {
	eng := ferrytest.Start(t).Engine
	ctx := context.Background()
	for _, at := range []time.Time{
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		if _, _, err := eng.CreateTask(ctx, client.NewTask{Type: "far.v1", RunAt: &at}); !client.HasCode(err, client.CodeInvalidRequest) {
			t.Errorf("run_at %v: %v", at, err)
		}
	}
	got, err := eng.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"far.v1"}})
	if err != nil || len(got) != 0 {
		t.Fatalf("claim: %v, %d tasks (a task scheduled for the year 300000 is not due)", err, len(got))
	}
}
