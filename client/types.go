package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ferryhq/ferry/internal/status"
)

// Run statuses.
const (
	RunRunning   = status.RunRunning
	RunPaused    = status.RunPaused
	RunCompleted = status.RunCompleted
	RunFailed    = status.RunFailed
	RunCancelled = status.RunCancelled
	RunTimeout   = status.RunTimeout
)

// Step statuses.
const (
	StepPending       = status.StepPending
	StepRunning       = status.StepRunning
	StepSleeping      = status.StepSleeping
	StepWaiting       = status.StepWaiting
	StepSuccess       = status.StepSuccess
	StepFailed        = status.StepFailed
	StepTimeout       = status.StepTimeout
	StepSkipped       = status.StepSkipped
	StepTemplateError = status.StepTemplateError
	StepCancelled     = status.StepCancelled
)

// RunTerminal reports whether a run in status s can change no more.
func RunTerminal(s string) bool { return status.RunTerminal(s) }

// Workflow is a stored workflow. Tasks, the steps exactly as submitted, is
// only present when the workflow is fetched on its own (GetWorkflow,
// UpdateWorkflow), not in lists or create responses.
type Workflow struct {
	ID          string          `json:"id"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Trigger     string          `json:"trigger"`
	Version     int             `json:"version"`
	Fingerprint string          `json:"fingerprint"`
	TaskCount   int             `json:"task_count"`
	Enabled     bool            `json:"enabled"`
	MaxDuration string          `json:"max_duration"`
	InsertedAt  time.Time       `json:"inserted_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
	Tasks       json.RawMessage `json:"tasks,omitempty"`

	// Raw is the object exactly as the server sent it.
	Raw json.RawMessage `json:"-"`
}

// UnmarshalJSON decodes a workflow and keeps the raw document in Raw.
func (w *Workflow) UnmarshalJSON(b []byte) error {
	type plain Workflow
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*w = Workflow(p)
	w.Raw = append(json.RawMessage(nil), b...)
	return nil
}

// TriggerResult describes the run a trigger started (or, for a repeated
// idempotency key, the run it started the first time).
type TriggerResult struct {
	RunID      string    `json:"run_id"`
	WorkflowID string    `json:"workflow_id"`
	Version    int       `json:"version"`
	Status     string    `json:"status"`
	StartedAt  time.Time `json:"started_at"`

	// Raw is the object exactly as the server sent it.
	Raw json.RawMessage `json:"-"`
}

// BatchRun is one run of TriggerBatch: its input (nil is {}) and an
// optional idempotency key.
type BatchRun struct {
	Input          json.RawMessage `json:"input,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
}

// BatchResult is one run started, or found by its idempotency key, by
// TriggerBatch.
type BatchResult struct {
	TriggerResult
	Created bool // false: the idempotency key named an existing run
}

// UnmarshalJSON decodes a batch item, the trigger result and "created",
// in one pass (a batch answers with up to 1,000 of them).
func (b *BatchResult) UnmarshalJSON(data []byte) error {
	type plain TriggerResult
	var p struct {
		plain
		Created bool `json:"created"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	b.TriggerResult = TriggerResult(p.plain)
	b.Raw = append(json.RawMessage(nil), data...)
	b.Created = p.Created
	return nil
}

// UnmarshalJSON decodes a trigger result and keeps the raw document in Raw.
func (t *TriggerResult) UnmarshalJSON(b []byte) error {
	type plain TriggerResult
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*t = TriggerResult(p)
	t.Raw = append(json.RawMessage(nil), b...)
	return nil
}

// Run is one execution of a pinned workflow version. Input and Tasks are
// only present when the run is fetched on its own (GetRun, CancelRun), not in
// ListRuns.
type Run struct {
	ID         string          `json:"id"`
	WorkflowID string          `json:"workflow_id"`
	Workflow   string          `json:"workflow"` // the workflow's name
	Version    int             `json:"version"`
	Status     string          `json:"status"`
	Error      string          `json:"error,omitempty"`
	StartedAt  time.Time       `json:"started_at"`
	FinishedAt *time.Time      `json:"finished_at"`
	ExpiresAt  time.Time       `json:"expires_at"`
	Input      json.RawMessage `json:"input,omitempty"`
	// Tasks holds one result per step in definition order. On the wire it
	// is an object keyed by step name; the key order is kept here.
	Tasks []TaskResult `json:"tasks,omitempty"`

	// Raw is the object exactly as the server sent it.
	Raw json.RawMessage `json:"-"`
}

// Terminal reports whether the run can change no more.
func (r *Run) Terminal() bool { return RunTerminal(r.Status) }

// Task returns the named step's result, or nil.
func (r *Run) Task(name string) *TaskResult {
	for i := range r.Tasks {
		if r.Tasks[i].Name == name {
			return &r.Tasks[i]
		}
	}
	return nil
}

// TaskResult is the state of one step of a run.
type TaskResult struct {
	Name       string     `json:"-"` // the key in the run's tasks object
	Type       string     `json:"type"`
	Status     string     `json:"status"`
	StatusCode *int       `json:"status_code"`
	DurationMS *int64     `json:"duration_ms"`
	Attempt    int        `json:"attempt"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	Error      string     `json:"error,omitempty"`
	WakeAt     *time.Time `json:"wake_at,omitempty"`
	// TaskID is the task a task step created, once it started.
	TaskID      string `json:"task_id,omitempty"`
	CallbackURL string `json:"callback_url,omitempty"`
	// Body is the HTTP response body: the JSON value itself when the
	// response was complete JSON, otherwise a JSON string holding the text.
	Body        json.RawMessage   `json:"body,omitempty"`
	IsTruncated bool              `json:"is_truncated,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
}

// UnmarshalJSON decodes a run, keeping the order of its tasks object.
func (r *Run) UnmarshalJSON(b []byte) error {
	type plain Run
	var aux struct {
		plain
		Tasks json.RawMessage `json:"tasks"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*r = Run(aux.plain)
	r.Tasks = nil
	if len(aux.Tasks) > 0 && string(aux.Tasks) != "null" {
		tasks, err := decodeTasks(aux.Tasks)
		if err != nil {
			return err
		}
		r.Tasks = tasks
	}
	r.Raw = append(json.RawMessage(nil), b...)
	return nil
}

// MarshalJSON encodes a run in the server's shape, tasks as an object keyed
// by step name in order.
func (r Run) MarshalJSON() ([]byte, error) {
	type plain Run
	aux := struct {
		plain
		Tasks json.RawMessage `json:"tasks,omitempty"`
	}{plain: plain(r)}
	if r.Tasks != nil {
		var buf bytes.Buffer
		buf.WriteByte('{')
		for i, t := range r.Tasks {
			if i > 0 {
				buf.WriteByte(',')
			}
			k, err := json.Marshal(t.Name)
			if err != nil {
				return nil, err
			}
			v, err := json.Marshal(t)
			if err != nil {
				return nil, err
			}
			buf.Write(k)
			buf.WriteByte(':')
			buf.Write(v)
		}
		buf.WriteByte('}')
		aux.Tasks = buf.Bytes()
	}
	return json.Marshal(aux)
}

// decodeTasks reads a JSON object of step name to result in key order.
func decodeTasks(raw []byte) ([]TaskResult, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("run tasks: %w", err)
	}
	if tok != json.Delim('{') {
		return nil, fmt.Errorf("run tasks: want a JSON object, got %v", tok)
	}
	out := []TaskResult{}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("run tasks: %w", err)
		}
		name, _ := kt.(string)
		var t TaskResult
		if err := dec.Decode(&t); err != nil {
			return nil, fmt.Errorf("run tasks.%s: %w", name, err)
		}
		t.Name = name
		out = append(out, t)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("run tasks: %w", err)
	}
	return out, nil
}

// Event is one entry of a run's event log.
type Event struct {
	RunID string          `json:"run_id"`
	Seq   int64           `json:"seq"`
	Type  string          `json:"type"`
	Step  string          `json:"step,omitempty"`
	Data  json.RawMessage `json:"data,omitempty"`
	At    time.Time       `json:"at"`
}
