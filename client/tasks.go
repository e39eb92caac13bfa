package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/status"
)

// Task statuses (the durable inbox's names).
const (
	TaskPending   = status.TaskPending
	TaskLeased    = status.TaskLeased
	TaskSucceeded = status.TaskSucceeded
	TaskFailed    = status.TaskFailed
	TaskCancelled = status.TaskCancelled
)

// TaskTerminal reports whether a task in status s can change no more.
func TaskTerminal(s string) bool { return status.TaskTerminal(s) }

// NewTask is a standalone task to create (an intent without a workflow).
// Zero fields take the server's defaults: priority 100, due now, the task
// type registry's (or the server's) max attempts and retry delay.
type NewTask struct {
	Type string
	// Payload is the JSON handed to the worker; nil means {}.
	Payload json.RawMessage
	// Priority runs lower numbers first (0 to 1000); nil means the default.
	Priority *int
	// RunAt delays the task; nil or a past time means now.
	RunAt *time.Time
	// IdempotencyKey makes a repeated create return the first task.
	IdempotencyKey string
	// MaxAttempts bounds attempts (1 to 100); 0 means the default.
	MaxAttempts int
	// RetryDelay is the base of the attempt² backoff between attempts;
	// 0 means the default.
	RetryDelay time.Duration
}

// MarshalJSON encodes the create request in the server's shape.
func (n NewTask) MarshalJSON() ([]byte, error) {
	body := struct {
		Type           string          `json:"type"`
		Payload        json.RawMessage `json:"payload,omitempty"`
		Priority       *int            `json:"priority,omitempty"`
		RunAt          *time.Time      `json:"run_at,omitempty"`
		IdempotencyKey string          `json:"idempotency_key,omitempty"`
		MaxAttempts    int             `json:"max_attempts,omitempty"`
		RetryDelay     string          `json:"retry_delay,omitempty"`
	}{Type: n.Type, Payload: n.Payload, Priority: n.Priority, RunAt: n.RunAt, IdempotencyKey: n.IdempotencyKey, MaxAttempts: n.MaxAttempts}
	if n.RetryDelay != 0 {
		body.RetryDelay = n.RetryDelay.String()
	}
	return json.Marshal(body)
}

// Task is a unit of work in the durable inbox, standalone or owned by a
// workflow step (RunID and Step set).
type Task struct {
	ID             string          `json:"id"`
	Type           string          `json:"type"`
	Status         string          `json:"status"`
	Payload        json.RawMessage `json:"payload"`
	Priority       int             `json:"priority"`
	RunAt          time.Time       `json:"run_at"`
	Attempt        int             `json:"attempt"`
	MaxAttempts    int             `json:"max_attempts"`
	RetryDelay     time.Duration   `json:"-"` // on the wire a duration string ("1m")
	IdempotencyKey string          `json:"idempotency_key"`
	LeasedBy       string          `json:"leased_by"`
	LeaseUntil     *time.Time      `json:"lease_until"`
	// CancelRequested is set once the task was cancelled; a worker holding
	// it learns so at its next heartbeat.
	CancelRequested bool            `json:"cancel_requested"`
	Result          json.RawMessage `json:"result"`
	LastError       string          `json:"last_error"`
	RunID           string          `json:"run_id"`
	Step            string          `json:"step"`
	CreatedAt       time.Time       `json:"created_at"`
	UpdatedAt       time.Time       `json:"updated_at"`
	FinishedAt      *time.Time      `json:"finished_at"`

	// Raw is the object exactly as the server sent it.
	Raw json.RawMessage `json:"-"`
}

// Terminal reports whether the task can change no more.
func (t *Task) Terminal() bool { return TaskTerminal(t.Status) }

// UnmarshalJSON decodes a task and keeps the raw document in Raw.
func (t *Task) UnmarshalJSON(b []byte) error {
	type plain Task
	var aux struct {
		plain
		RetryDelay string `json:"retry_delay"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*t = Task(aux.plain)
	if aux.RetryDelay != "" {
		d, err := parseDuration(aux.RetryDelay)
		if err != nil {
			return fmt.Errorf("task retry_delay: %w", err)
		}
		t.RetryDelay = d
	}
	if string(t.Result) == "null" {
		t.Result = nil
	}
	t.Raw = append(json.RawMessage(nil), b...)
	return nil
}

// MarshalJSON encodes a task in the server's shape.
func (t Task) MarshalJSON() ([]byte, error) {
	type plain Task
	aux := struct {
		plain
		RetryDelay string `json:"retry_delay,omitempty"`
	}{plain: plain(t)}
	if t.RetryDelay != 0 {
		aux.RetryDelay = formatDuration(t.RetryDelay)
	}
	return json.Marshal(aux)
}

// TaskEvent is one entry of a task's event log ("created", "claimed",
// "heartbeat", "succeeded", "failed", "retried", "cancelled",
// "lease_expired").
type TaskEvent struct {
	TaskID string          `json:"task_id"`
	Seq    int64           `json:"seq"`
	Type   string          `json:"type"`
	Data   json.RawMessage `json:"data,omitempty"`
	At     time.Time       `json:"at"`
}

// TaskType is an entry of the task type registry: defaults for a versioned
// type and whether its tasks may be claimed (tasks of a disabled type wait).
type TaskType struct {
	Type        string `json:"type"`
	Description string `json:"description"`
	// Enabled must be set to true explicitly when putting a type: PUT
	// replaces the whole entry, so a zero TaskType disables the type.
	Enabled bool `json:"enabled"`
	// MaxAttempts and RetryDelay are the type's defaults; 0 means the
	// server's.
	MaxAttempts int           `json:"max_attempts"`
	RetryDelay  time.Duration `json:"-"`
	CreatedAt   time.Time     `json:"created_at"`
	UpdatedAt   time.Time     `json:"updated_at"`
}

// UnmarshalJSON decodes a registry entry (null defaults become 0).
func (tt *TaskType) UnmarshalJSON(b []byte) error {
	type plain TaskType
	var aux struct {
		plain
		MaxAttempts *int    `json:"max_attempts"`
		RetryDelay  *string `json:"retry_delay"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*tt = TaskType(aux.plain)
	if aux.MaxAttempts != nil {
		tt.MaxAttempts = *aux.MaxAttempts
	}
	if aux.RetryDelay != nil && *aux.RetryDelay != "" {
		d, err := parseDuration(*aux.RetryDelay)
		if err != nil {
			return fmt.Errorf("task type retry_delay: %w", err)
		}
		tt.RetryDelay = d
	}
	return nil
}

// ClaimRequest asks for work.
type ClaimRequest struct {
	// Types are exact types ("billing.invoice.v1") or prefixes ending in %
	// ("billing.%"); at least one is required.
	Types []string
	// WorkerID names the worker in the task's events.
	WorkerID string
	// Lease is how long the tasks are held without a heartbeat (1s to 1h;
	// 0 means 30s; anything else out of range, negative included, is
	// refused).
	Lease time.Duration
	// Max is the most tasks to return (1 to 100; 0 means 1; a negative
	// value is refused).
	Max int
	// Wait long-polls up to this long (at most 60s) when nothing is ready;
	// 0 returns at once; a negative value is refused.
	Wait time.Duration
}

// ClaimedTask is a task leased to the caller. LeaseToken must accompany
// every heartbeat and report.
type ClaimedTask struct {
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	Payload     json.RawMessage `json:"payload"`
	Attempt     int             `json:"attempt"`
	MaxAttempts int             `json:"max_attempts"`
	LeaseToken  string          `json:"lease_token"`
	LeaseUntil  time.Time       `json:"lease_until"`
	RunID       string          `json:"run_id"`
	Step        string          `json:"step"`
	// Traceparent is the W3C trace context of the task's run, sent while
	// the server traces (empty otherwise): spans made for the task belong
	// in the run's trace, as children of it. The worker SDK does so.
	Traceparent string `json:"traceparent,omitempty"`
}

// HeartbeatResult is what a heartbeat tells the worker.
type HeartbeatResult struct {
	LeaseUntil time.Time `json:"lease_until"`
	// CancelRequested means the task was cancelled: stop working on it;
	// its report will be refused.
	CancelRequested bool `json:"cancel_requested"`
}

// ---- producers ----

// CreateTask records a standalone task. With an IdempotencyKey already
// used, it returns the first task and created=false.
func (c *Client) CreateTask(ctx context.Context, nt NewTask) (*Task, bool, error) {
	b, err := json.Marshal(nt)
	if err != nil {
		return nil, false, fmt.Errorf("ferry: encode task: %w", err)
	}
	var t Task
	code, err := c.do(ctx, http.MethodPost, "/api/v1/tasks", nil, bytes.NewReader(b), &t)
	if err != nil {
		return nil, false, err
	}
	return &t, code == http.StatusCreated, nil
}

// GetTask returns a task.
func (c *Client) GetTask(ctx context.Context, id string) (*Task, error) {
	var t Task
	if _, err := c.do(ctx, http.MethodGet, taskPath(id, ""), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// CancelTask cancels a task that has not finished and returns it. A pending
// task is never handed out; a leased task's worker learns of the
// cancellation at its next heartbeat. Cancelling a finished task is an error
// matching ErrTaskFinished.
func (c *Client) CancelTask(ctx context.Context, id string) (*Task, error) {
	var t Task
	if _, err := c.do(ctx, http.MethodPost, taskPath(id, "/cancel"), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// TaskEvents returns a task's events with a sequence number above after,
// oldest first, fetching as many batches as needed.
func (c *Client) TaskEvents(ctx context.Context, id string, after int64) ([]TaskEvent, error) {
	out := []TaskEvent{}
	for {
		q := url.Values{}
		if after > 0 {
			q.Set("after", strconv.FormatInt(after, 10))
		}
		var batch []TaskEvent
		if _, err := c.do(ctx, http.MethodGet, taskPath(id, "/events")+encode(q), nil, nil, &batch); err != nil {
			return nil, err
		}
		out = append(out, batch...)
		if len(batch) < eventsPage || batch[len(batch)-1].Seq <= after {
			return out, nil
		}
		after = batch[len(batch)-1].Seq
	}
}

// ---- workers ----

// ClaimTasks leases up to req.Max ready tasks, long-polling up to req.Wait
// when none is ready (an empty slice then). The request lives as long as ctx:
// cancelling ctx abandons the poll. An http.Client given with WithHTTPClient
// must not time out sooner than req.Wait plus a margin.
func (c *Client) ClaimTasks(ctx context.Context, req ClaimRequest) ([]ClaimedTask, error) {
	out, err := postData[[]ClaimedTask](ctx, c, "/api/v1/tasks/claim", req.body())
	if err != nil {
		return nil, err
	}
	if out == nil {
		out = []ClaimedTask{}
	}
	return out, nil
}

// MaxTaskBody is the most a task request's body may take (create,
// complete, fail, heartbeat): 1 MiB, the server's bound (413 too_large
// past it). A completion's result shares it with its lease token.
const MaxTaskBody = 1 << 20

// Heartbeat extends a lease by lease (0 means 30s; out of 1s to 1h,
// negative included, refused) and reports whether the task was cancelled.
// A lease that was lost (it expired and the task was claimed again) is an
// error matching ErrLeaseLost.
func (c *Client) Heartbeat(ctx context.Context, id, token string, lease time.Duration) (HeartbeatResult, error) {
	body := map[string]any{"lease_token": token}
	if lease != 0 { // a negative lease goes to the server, which refuses it
		body["lease_seconds"] = lease.Seconds()
	}
	return postData[HeartbeatResult](ctx, c, taskPath(id, "/heartbeat"), body)
}

// CompleteTask reports success with result, any value that encodes as JSON
// (a json.RawMessage is sent as is; nil records null). For a workflow step
// the result becomes the step's body. A stale lease is an error matching
// ErrLeaseLost; a task already finished (say, cancelled) one matching
// ErrTaskFinished. Either way nothing changed.
func (c *Client) CompleteTask(ctx context.Context, id, token string, result any) error {
	body := map[string]any{"lease_token": token}
	if result != nil {
		raw, err := marshalResult(result)
		if err != nil {
			return err
		}
		body["result"] = raw
	}
	return c.post(ctx, taskPath(id, "/complete"), body, nil)
}

// CompleteTaskAndClaim completes a task like CompleteTask and takes, in the
// same transaction, up to next.Max (default 1) of the tasks the completion
// starts (the run's next steps) whose types match next.Types: eager
// dispatch, no claim round trip between steps. next.Wait must be zero.
func (c *Client) CompleteTaskAndClaim(ctx context.Context, id, token string, result any, next ClaimRequest) ([]ClaimedTask, error) {
	body := map[string]any{"lease_token": token}
	if result != nil {
		raw, err := marshalResult(result)
		if err != nil {
			return nil, err
		}
		body["result"] = raw
	}
	body["next"] = next.body()
	var env struct {
		Next []ClaimedTask `json:"next"`
	}
	if err := c.postEnvelope(ctx, taskPath(id, "/complete"), body, &env); err != nil {
		return nil, err
	}
	if env.Next == nil {
		env.Next = []ClaimedTask{}
	}
	return env.Next, nil
}

// MaxCompleteBatch is the most completions one CompleteTasks call sends.
const MaxCompleteBatch = 100

// Completion is one task's success for CompleteTasks.
type Completion struct {
	ID         string
	LeaseToken string
	// Result is any value that encodes as JSON, as in CompleteTask.
	Result any
}

// CompletionResult is how the server answered one Completion: Err is
// what CompleteTask would have returned for it alone (an *APIError,
// matching ErrLeaseLost or ErrTaskFinished as there), and Next the tasks
// it was handed when CompleteTasks asked for them.
type CompletionResult struct {
	ID   string
	Next []ClaimedTask
	Err  error
}

// CompleteTasks reports several tasks' success in one request (1 to
// MaxCompleteBatch): each is applied and answered as CompleteTask (with
// next: CompleteTaskAndClaim, each completion taking up to next.Max of
// the tasks it starts) would apply and answer it, and one failing does
// not hold back the others. The error is for the request as a whole (no
// answer, or a malformed request); the results are in the order of cs.
func (c *Client) CompleteTasks(ctx context.Context, cs []Completion, next *ClaimRequest) ([]CompletionResult, error) {
	type item struct {
		ID         string          `json:"id"`
		LeaseToken string          `json:"lease_token"`
		Result     json.RawMessage `json:"result,omitempty"`
	}
	body := struct {
		Completions []item         `json:"completions"`
		Next        map[string]any `json:"next,omitempty"`
	}{Completions: make([]item, len(cs))}
	for i, cp := range cs {
		body.Completions[i] = item{ID: cp.ID, LeaseToken: cp.LeaseToken}
		if cp.Result != nil {
			raw, err := marshalResult(cp.Result)
			if err != nil {
				return nil, err
			}
			body.Completions[i].Result = raw
		}
	}
	if next != nil {
		body.Next = next.body()
	}
	answers, err := postData[[]struct {
		ID     string        `json:"id"`
		Status int           `json:"status"`
		Next   []ClaimedTask `json:"next"`
		Error  *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}](ctx, c, "/api/v1/tasks/complete", body)
	if err != nil {
		return nil, err
	}
	if len(answers) != len(cs) {
		return nil, fmt.Errorf("ferry: complete tasks: %d answers for %d completions", len(answers), len(cs))
	}
	out := make([]CompletionResult, len(cs))
	for i, a := range answers {
		out[i] = CompletionResult{ID: a.ID, Next: a.Next}
		switch {
		case a.ID != cs[i].ID:
			return nil, fmt.Errorf("ferry: complete tasks: answer %d is for task %q, not %q", i, a.ID, cs[i].ID)
		case a.Error != nil:
			out[i].Err = &APIError{StatusCode: a.Status, Code: a.Error.Code, Message: a.Error.Message}
		case next != nil && out[i].Next == nil:
			out[i].Next = []ClaimedTask{}
		}
	}
	return out, nil
}

// FailTask reports a failed attempt. A retryable failure is retried with
// backoff while attempts remain; otherwise the task fails for good. Errors
// are those of CompleteTask.
func (c *Client) FailTask(ctx context.Context, id, token, msg string, retryable bool) error {
	body := map[string]any{"lease_token": token, "error": msg, "retryable": retryable}
	return c.post(ctx, taskPath(id, "/fail"), body, nil)
}

// ---- task type registry ----

// PutTaskType creates or replaces a task type's registry entry.
func (c *Client) PutTaskType(ctx context.Context, tt TaskType) (*TaskType, error) {
	body := map[string]any{"description": tt.Description, "enabled": tt.Enabled}
	if tt.MaxAttempts != 0 {
		body["max_attempts"] = tt.MaxAttempts
	}
	if tt.RetryDelay != 0 {
		body["retry_delay"] = tt.RetryDelay.String()
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("ferry: encode task type: %w", err)
	}
	var out TaskType
	if _, err := c.do(ctx, http.MethodPut, "/api/v1/task-types/"+url.PathEscape(tt.Type), nil, bytes.NewReader(b), &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetTaskType returns a task type's registry entry.
func (c *Client) GetTaskType(ctx context.Context, typ string) (*TaskType, error) {
	var out TaskType
	if _, err := c.do(ctx, http.MethodGet, "/api/v1/task-types/"+url.PathEscape(typ), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListTaskTypes returns every registry entry.
func (c *Client) ListTaskTypes(ctx context.Context) ([]TaskType, error) {
	var out []TaskType
	if _, err := c.do(ctx, http.MethodGet, "/api/v1/task-types", nil, nil, &out); err != nil {
		return nil, err
	}
	if out == nil {
		out = []TaskType{}
	}
	return out, nil
}

// ---- helpers ----

func taskPath(id, suffix string) string { return "/api/v1/tasks/" + url.PathEscape(id) + suffix }

func (c *Client) post(ctx context.Context, path string, body any, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("ferry: encode %s request: %w", path, err)
	}
	_, err = c.do(ctx, http.MethodPost, path, nil, bytes.NewReader(b), out)
	return err
}

// body is the request's JSON form; zero fields are left to the server's
// defaults, and negative ones sent for it to refuse (as the embedded
// engine does), not taken for zero.
func (req ClaimRequest) body() map[string]any {
	body := map[string]any{"types": req.Types}
	if req.WorkerID != "" {
		body["worker_id"] = req.WorkerID
	}
	if req.Lease != 0 {
		body["lease_seconds"] = req.Lease.Seconds()
	}
	if req.Max != 0 {
		body["max"] = req.Max
	}
	if req.Wait != 0 {
		body["wait_seconds"] = req.Wait.Seconds()
	}
	return body
}

// postData posts body and decodes the answer's "data" into a T in one
// pass: the workers' calls (claim, heartbeat, complete) are most of a
// worker's requests, and do decodes in two (the envelope, then its data).
func postData[T any](ctx context.Context, c *Client, path string, body any) (T, error) {
	b, err := json.Marshal(body)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("ferry: encode %s request: %w", path, err)
	}
	v, _, err := doData[T](ctx, c, http.MethodPost, path, nil, bytes.NewReader(b))
	return v, err
}

// doData sends a request and decodes the answer's "data" into a T in one
// pass (see postData); it returns the HTTP status code too.
func doData[T any](ctx context.Context, c *Client, method, path string, h http.Header, body io.Reader) (T, int, error) {
	var zero T
	var env struct {
		Data *T `json:"data"`
	}
	code, err := c.doRaw(ctx, method, path, h, body, &env)
	if err != nil {
		return zero, code, err
	}
	if env.Data == nil {
		return zero, code, fmt.Errorf("ferry: %s %s: response has no data", method, path)
	}
	return *env.Data, code, nil
}

// postEnvelope posts body and decodes the whole response envelope into out.
func (c *Client) postEnvelope(ctx context.Context, path string, body any, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("ferry: encode %s request: %w", path, err)
	}
	_, err = c.doRaw(ctx, http.MethodPost, path, nil, bytes.NewReader(b), out)
	return err
}

func marshalResult(v any) (json.RawMessage, error) {
	if raw, ok := v.(json.RawMessage); ok {
		if raw == nil {
			return json.RawMessage("null"), nil // a nil result records null, however it is typed
		}
		if !json.Valid(raw) {
			return nil, fmt.Errorf("ferry: task result is not valid JSON")
		}
		return raw, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("ferry: encode task result: %w", err)
	}
	return b, nil
}

// parseDuration reads the server's duration format: Go's, or whole days
// ("2d").
func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n < 0 || n > int64(1<<63-1)/int64(24*time.Hour) {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}

func formatDuration(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}
