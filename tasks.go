package ferry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/store"
)

// The task methods below are the durable inbox in library mode: a worker
// embedded in the same process as the engine calls them directly, without
// HTTP. They have the signatures of client.Client's, so package worker runs
// on either, and they refuse what the server refuses with the same
// *client.APIError codes: errors.Is(err, client.ErrLeaseLost) for a stale
// lease token, client.ErrTaskFinished for a finished task,
// client.HasCode(err, client.CodeNotFound) for an unknown task.

// CreateTask records a standalone task; a repeated IdempotencyKey returns
// the first task and created=false.
func (e *Engine) CreateTask(ctx context.Context, nt client.NewTask) (*client.Task, bool, error) {
	if err := e.usable(); err != nil {
		return nil, false, err
	}
	switch {
	case nt.Type == "":
		return nil, false, invalid("type", "type is required")
	case !spec.ValidTaskType(nt.Type):
		return nil, false, invalid("type", fmt.Sprintf("type %q must be a versioned name like \"billing.invoice.v1\"", nt.Type))
	case nt.MaxAttempts < 0 || nt.MaxAttempts > 100:
		return nil, false, invalid("max_attempts", "max_attempts must be from 1 to 100")
	case len(nt.Payload) > client.MaxTaskBody:
		return nil, false, tooLarge(fmt.Sprintf("payload is over %d bytes", client.MaxTaskBody))
	case nt.Priority != nil && (*nt.Priority < 0 || *nt.Priority > 1000):
		return nil, false, invalid("priority", "priority must be from 0 to 1000 (lower runs first)")
	case !spec.ValidKey(nt.IdempotencyKey):
		return nil, false, invalid("idempotency_key", "idempotency_key must be UTF-8 text of at most 255 bytes without control characters (but the tab) or spaces or tabs at its ends")
	case len(nt.Payload) > 0 && !jsonText(nt.Payload):
		return nil, false, invalid("payload", "payload must be JSON")
	case nt.RetryDelay < 0 || (nt.RetryDelay > 0 && nt.RetryDelay < time.Millisecond):
		return nil, false, invalid("retry_delay", "retry_delay must be a duration of at least 1ms")
	case nt.RunAt != nil && nt.RunAt.After(runtime.MaxRunAt):
		return nil, false, invalid("run_at", "run_at must be no later than 9999-12-31T23:59:59.999999Z")
	}
	t, created, err := e.rt.CreateTask(ctx, runtime.NewTask{
		Type: nt.Type, Payload: nt.Payload, Priority: nt.Priority, RunAt: nt.RunAt,
		IdempotencyKey: nt.IdempotencyKey, MaxAttempts: nt.MaxAttempts, RetryDelay: nt.RetryDelay,
	})
	if err != nil {
		return nil, false, taskErr(err)
	}
	return e.clientTask(ctx, t), created, nil
}

// noTask is the answer for an id no task can have (not UTF-8 text, or
// holding NUL): the HTTP API's 404, where a database would fail on it.
func noTask(id string) error {
	if spec.CleanText(id) {
		return nil
	}
	return &client.APIError{StatusCode: http.StatusNotFound, Code: client.CodeNotFound, Message: fmt.Sprintf("task %q", id)}
}

// GetTask returns a task.
func (e *Engine) GetTask(ctx context.Context, id string) (*client.Task, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	if err := noTask(id); err != nil {
		return nil, err
	}
	t, err := e.store.GetTask(ctx, id)
	if err != nil {
		return nil, taskErr(err)
	}
	return e.clientTask(ctx, t), nil
}

// CancelTask cancels a task that has not finished; a leased task's worker
// learns of it at its next heartbeat.
func (e *Engine) CancelTask(ctx context.Context, id string) (*client.Task, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	if err := noTask(id); err != nil {
		return nil, err
	}
	t, err := e.rt.CancelTask(ctx, id)
	if err != nil {
		return nil, taskErr(err)
	}
	return e.clientTask(ctx, t), nil
}

// ClaimTasks leases up to req.Max ready tasks, waiting up to req.Wait (at
// most 60s) when none is ready. It returns early with ctx's error when ctx
// ends.
func (e *Engine) ClaimTasks(ctx context.Context, req client.ClaimRequest) ([]client.ClaimedTask, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	rq, err := claimRequest(req)
	if err != nil {
		return nil, err
	}
	ts, err := e.rt.ClaimTasks(ctx, rq)
	if err != nil {
		return nil, taskErr(err)
	}
	return e.claimed(ctx, ts), nil
}

// claimRequest checks a claim and fills its defaults.
func claimRequest(req client.ClaimRequest) (runtime.ClaimRequest, error) {
	rq := runtime.ClaimRequest{Types: req.Types, WorkerID: req.WorkerID, Lease: req.Lease, Max: req.Max, Wait: req.Wait}
	if fe := runtime.CheckClaim(&rq); fe != nil {
		return rq, invalid(fe.Path, fe.Msg)
	}
	return rq, nil
}

func (e *Engine) claimed(ctx context.Context, ts []*store.Task) []client.ClaimedTask {
	out := make([]client.ClaimedTask, 0, len(ts))
	for _, t := range ts {
		maxAttempts, _ := e.rt.TaskDefaults(ctx, t)
		ct := client.ClaimedTask{
			ID: t.ID, Type: t.Type, Payload: t.Payload, Attempt: t.Attempt, MaxAttempts: maxAttempts,
			LeaseToken: t.LeaseToken, RunID: t.RunID, Step: t.Step, Traceparent: t.TraceParent,
		}
		if t.LeaseUntil != nil {
			ct.LeaseUntil = t.LeaseUntil.UTC()
		}
		out = append(out, ct)
	}
	return out
}

// Heartbeat extends a lease by lease (0 means 30s) and reports whether the
// task was cancelled.
func (e *Engine) Heartbeat(ctx context.Context, id, token string, lease time.Duration) (client.HeartbeatResult, error) {
	if err := e.usable(); err != nil {
		return client.HeartbeatResult{}, err
	}
	if err := noTask(id); err != nil {
		return client.HeartbeatResult{}, err
	}
	if token == "" {
		return client.HeartbeatResult{}, invalid("lease_token", "lease_token is required")
	}
	if lease == 0 {
		lease = 30 * time.Second
	}
	if lease < time.Second || lease > time.Hour {
		return client.HeartbeatResult{}, invalid("lease_seconds", "lease_seconds must be from 1 to 3600")
	}
	res, err := e.rt.Heartbeat(ctx, id, token, lease)
	if err != nil {
		return client.HeartbeatResult{}, taskErr(err)
	}
	return client.HeartbeatResult{LeaseUntil: res.LeaseUntil.UTC(), CancelRequested: res.CancelRequested}, nil
}

// CompleteTask records success with result (any JSON-encodable value; a
// json.RawMessage is kept as is).
func (e *Engine) CompleteTask(ctx context.Context, id, token string, result any) error {
	if err := e.usable(); err != nil {
		return err
	}
	if err := noTask(id); err != nil {
		return err
	}
	raw, err := resultJSON(token, result)
	if err != nil {
		return err
	}
	_, err = e.rt.CompleteTask(ctx, id, token, raw)
	return taskErr(err)
}

// CompleteTaskAndClaim completes a task and takes, in the same transaction,
// up to next.Max of the tasks the completion starts whose types match
// next.Types (eager dispatch: the run's next step goes to this worker with
// no claim in between). next.Wait is ignored.
func (e *Engine) CompleteTaskAndClaim(ctx context.Context, id, token string, result any, next client.ClaimRequest) ([]client.ClaimedTask, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	if err := noTask(id); err != nil {
		return nil, err
	}
	raw, err := resultJSON(token, result)
	if err != nil {
		return nil, err
	}
	next.Wait = 0
	rq := runtime.ClaimRequest{Types: next.Types, WorkerID: next.WorkerID, Lease: next.Lease, Max: next.Max}
	if fe := runtime.CheckClaim(&rq); fe != nil {
		return nil, invalid("next."+fe.Path, fe.Msg) // as the HTTP API names it
	}
	_, ts, err := e.rt.CompleteTaskAndClaim(ctx, id, token, raw, rq)
	if err != nil {
		return nil, taskErr(err)
	}
	return e.claimed(ctx, ts), nil
}

func resultJSON(token string, result any) (json.RawMessage, error) {
	if token == "" {
		return nil, invalid("lease_token", "lease_token is required")
	}
	var raw json.RawMessage
	switch r := result.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if r == nil {
			return nil, nil // a nil result records null, however it is typed
		}
		if !jsonText(r) {
			return nil, invalid("result", "result must be JSON")
		}
		raw = r
	default:
		b, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("ferry: encode task result: %w", err)
		}
		raw = b
	}
	// As over HTTP, where the result shares the request's bound with
	// its lease token.
	if len(token)+len(raw)+len(`{"lease_token":"","result":}`) > client.MaxTaskBody {
		return nil, tooLarge(fmt.Sprintf("the completion is over %d bytes", client.MaxTaskBody))
	}
	return raw, nil
}

// FailTask records a failed attempt, retried with backoff when retryable and
// attempts remain.
func (e *Engine) FailTask(ctx context.Context, id, token, msg string, retryable bool) error {
	if err := e.usable(); err != nil {
		return err
	}
	if err := noTask(id); err != nil {
		return err
	}
	if token == "" {
		return invalid("lease_token", "lease_token is required")
	}
	// The message is stored as text: NUL and bytes that are not UTF-8
	// become U+FFFD rather than fail the report (and the reports batched
	// with it).
	msg = strings.ToValidUTF8(strings.ReplaceAll(msg, "\x00", "\uFFFD"), "\uFFFD")
	_, err := e.rt.FailTask(ctx, id, token, msg, retryable)
	return taskErr(err)
}

// clientTask renders a task as the API does, with its effective defaults.
func (e *Engine) clientTask(ctx context.Context, t *store.Task) *client.Task {
	maxAttempts, delay := e.rt.TaskDefaults(ctx, t)
	ct := &client.Task{
		ID: t.ID, Type: t.Type, Status: t.Status, Payload: t.Payload, Priority: t.Priority, RunAt: t.RunAt.UTC(),
		Attempt: t.Attempt, MaxAttempts: maxAttempts, RetryDelay: delay, IdempotencyKey: t.IdempotencyKey,
		LeasedBy: t.LeasedBy, LeaseUntil: utcPtr(t.LeaseUntil), CancelRequested: t.CancelRequested,
		Result: t.Result, LastError: t.LastError, RunID: t.RunID, Step: t.Step,
		CreatedAt: t.CreatedAt.UTC(), UpdatedAt: t.UpdatedAt.UTC(), FinishedAt: utcPtr(t.FinishedAt),
	}
	if string(ct.Result) == "null" {
		ct.Result = nil
	}
	if raw, err := json.Marshal(ct); err == nil {
		ct.Raw = raw
	}
	return ct
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// tooLarge is the HTTP API's 413 for a request over its bound.
func tooLarge(msg string) error {
	return &client.APIError{StatusCode: http.StatusRequestEntityTooLarge, Code: client.CodeTooLarge, Message: msg}
}

// invalidJSON is the HTTP API's 400 invalid_json, naming the field.
func invalidJSON(path, msg string) error {
	return &client.APIError{StatusCode: http.StatusBadRequest, Code: client.CodeInvalidJSON, Message: msg,
		Details: []client.FieldDetail{{Path: path, Code: client.CodeInvalidJSON, Message: msg}}}
}

func invalid(path, msg string) error {
	return &client.APIError{StatusCode: http.StatusBadRequest, Code: client.CodeInvalidRequest, Message: msg,
		Details: []client.FieldDetail{{Path: path, Code: client.CodeInvalidRequest, Message: msg}}}
}

// workflowErr maps the refusals of ApplyWorkflow and the triggers to the
// HTTP API's errors, as taskErr does the task methods': the store's and
// runtime's sentinels are internal, so a caller could tell an unknown
// workflow from a disabled one or a database failure only by the text.
// Anything else (a database failure, ctx ending) is returned as is.
func workflowErr(err error) error {
	var ve *spec.ValidationError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ve):
		details := make([]client.FieldDetail, len(ve.Errors))
		for i, fe := range ve.Errors {
			details[i] = client.FieldDetail{Path: fe.Path, Code: fe.Code, Message: fe.Message}
		}
		if len(details) == 1 && details[0].Code == spec.CodeInvalidJSON {
			return &client.APIError{StatusCode: http.StatusBadRequest, Code: client.CodeInvalidJSON, Message: details[0].Message, Details: details}
		}
		return &client.APIError{StatusCode: http.StatusUnprocessableEntity, Code: client.CodeInvalidWorkflow, Message: "the workflow definition is invalid", Details: details}
	case errors.Is(err, store.ErrNotFound):
		return &client.APIError{StatusCode: http.StatusNotFound, Code: client.CodeNotFound, Message: err.Error()}
	case errors.Is(err, runtime.ErrDisabled):
		return &client.APIError{StatusCode: http.StatusConflict, Code: client.CodeDisabled, Message: err.Error()}
	case errors.Is(err, store.ErrWorkflowChanged):
		return &client.APIError{StatusCode: http.StatusConflict, Code: client.CodeConflict, Message: err.Error()}
	}
	return err
}

// taskErr maps the runtime's refusals to the API's errors; anything else
// (a database failure, ctx ending) is returned as is.
func taskErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, runtime.ErrStaleLease):
		return &client.APIError{StatusCode: http.StatusConflict, Code: client.CodeStaleLease, Message: err.Error()}
	case errors.Is(err, runtime.ErrTaskFinished):
		return &client.APIError{StatusCode: http.StatusConflict, Code: client.CodeTaskFinished, Message: err.Error()}
	case errors.Is(err, runtime.ErrInvalidTask):
		return &client.APIError{StatusCode: http.StatusBadRequest, Code: client.CodeInvalidRequest, Message: err.Error()}
	case errors.Is(err, store.ErrNotFound):
		return &client.APIError{StatusCode: http.StatusNotFound, Code: client.CodeNotFound, Message: strings.TrimSuffix(err.Error(), ": "+store.ErrNotFound.Error())}
	}
	return err
}
