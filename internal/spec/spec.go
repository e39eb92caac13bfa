package spec

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/textproto"
	"time"

	"github.com/ferryhq/ferry/internal/expr"
)

// StepType is what a step does. A step has exactly one.
type StepType string

const (
	StepHTTP    StepType = "http"
	StepSleep   StepType = "sleep"
	StepWebhook StepType = "wait_for_webhook"
	StepTask    StepType = "task"
)

// DefaultTaskPriority is a task step's priority unless set (lower first).
const DefaultTaskPriority = 100

// Defaults, as in the seed.
const (
	DefaultMaxDuration = 30 * 24 * time.Hour
	DefaultHTTPTimeout = 30 * time.Second
	DefaultRetries     = 5
	DefaultMethod      = "POST"
)

// Limits bounds what a definition may contain.
type Limits struct {
	MaxBytes int // size of the submitted document
	MaxSteps int
	// Stored reads a version accepted before: the checks added since
	// versions were first stored (a definition is UTF-8, an if is not
	// empty, a task type is at most MaxTaskTypeLen bytes) are not applied,
	// so that the runs of a version stored under older rules go on. An
	// empty if then means no condition, as it did.
	Stored bool
}

// DefaultLimits are the limits the issue names: 256 KB and 100 steps.
var DefaultLimits = Limits{MaxBytes: 256 << 10, MaxSteps: 100}

// Workflow is a validated, normalised definition. Steps keep the order in
// which they were written, which is also the order they are shown in.
type Workflow struct {
	Name        string
	Description string
	Trigger     string
	MaxDuration time.Duration
	Enabled     bool
	Steps       []*Step

	// Source is the definition as submitted, in JSON form; it is what is
	// stored and returned, so users get back what they wrote.
	Source json.RawMessage

	index map[string]*Step
}

// Step is one node of the DAG.
type Step struct {
	Name  string
	Type  StepType
	Needs []string
	If    string
	Cond  *expr.Condition // parsed If; nil when absent

	// HTTP
	URL     string
	Method  string
	Headers map[string]string
	Body    any // decoded JSON (json.Number for numbers); nil when HasBody is false
	HasBody bool
	Retries int
	Timeout time.Duration

	// Sleep
	Sleep time.Duration

	// Wait for webhook; zero WaitTimeout means "until the run's max_duration".
	WaitTimeout time.Duration

	// Task (external worker)
	TaskType     string
	Payload      any // decoded JSON; templates allowed
	HasPayload   bool
	TaskPriority int
	RetriesSet   bool          // retries given explicitly (task defaults come from the type registry)
	RetryDelay   time.Duration // base of the attempt² backoff; 0 = type's or default
}

// Step returns the named step or nil.
func (w *Workflow) Step(name string) *Step { return w.index[name] }

// Fingerprint identifies the content of a definition: two documents that mean
// the same (key order, whitespace, defaults spelled out or not) share it.
func (w *Workflow) Fingerprint() string {
	h := sha256.Sum256(w.canonical())
	return "sha256:" + hex.EncodeToString(h[:])
}

// canonical is a deterministic encoding of the normalised definition.
func (w *Workflow) canonical() []byte {
	type cstep struct {
		Name        string            `json:"name"`
		Type        StepType          `json:"type"`
		Needs       []string          `json:"needs"`
		If          string            `json:"if,omitempty"`
		URL         string            `json:"url,omitempty"`
		Method      string            `json:"method,omitempty"`
		Headers     map[string]string `json:"headers,omitempty"`
		Body        any               `json:"body,omitempty"`
		HasBody     bool              `json:"has_body,omitempty"`
		Retries     int               `json:"retries,omitempty"`
		Timeout     time.Duration     `json:"timeout,omitempty"`
		Sleep       time.Duration     `json:"sleep,omitempty"`
		WaitTimeout time.Duration     `json:"wait_timeout,omitempty"`
		TaskType    string            `json:"task_type,omitempty"`
		Payload     any               `json:"payload,omitempty"`
		HasPayload  bool              `json:"has_payload,omitempty"`
		Priority    int               `json:"priority,omitempty"`
		RetriesSet  bool              `json:"retries_set,omitempty"`
		RetryDelay  time.Duration     `json:"retry_delay,omitempty"`
	}
	out := struct {
		Name        string        `json:"name"`
		Description string        `json:"description"`
		Trigger     string        `json:"trigger"`
		MaxDuration time.Duration `json:"max_duration"`
		Enabled     bool          `json:"enabled"`
		Steps       []cstep       `json:"steps"`
	}{w.Name, w.Description, w.Trigger, w.MaxDuration, w.Enabled, nil}
	for _, s := range w.Steps {
		// Spelling out a default must not change the fingerprint; only a
		// task step's retries defer to the type registry when absent.
		retriesSet := s.RetriesSet && s.Type == StepTask
		// A payload of {} is what a task step without one is handed.
		payload, hasPayload := s.Payload, s.HasPayload
		if m, ok := payload.(map[string]any); ok && len(m) == 0 {
			payload, hasPayload = nil, false
		}
		// Header names go out in their canonical form, whatever their case.
		var headers map[string]string
		if len(s.Headers) > 0 {
			headers = make(map[string]string, len(s.Headers))
			for k, v := range s.Headers {
				headers[textproto.CanonicalMIMEHeaderKey(k)] = v
			}
		}
		out.Steps = append(out.Steps, cstep{s.Name, s.Type, s.Needs, s.If, s.URL, s.Method, headers, s.Body, s.HasBody, s.Retries, s.Timeout, s.Sleep, s.WaitTimeout, s.TaskType, payload, hasPayload, s.TaskPriority, retriesSet, s.RetryDelay})
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(out) // maps are encoded with sorted keys, so this is deterministic
	return buf.Bytes()
}
