package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Sentinel errors. Implementations wrap them with %w.
var (
	ErrNotFound  = errors.New("not found")
	ErrConflict  = errors.New("conflict")
	ErrLeaseLost = errors.New("lease lost")
	ErrFinished  = errors.New("run already finished")
)

// Workflow is a workflow with its current version's definition.
type Workflow struct {
	ID          string
	Name        string
	Version     int
	Fingerprint string
	Definition  json.RawMessage
	Enabled     bool
	CreatedAt   time.Time
	UpdatedAt   time.Time
	DeletedAt   *time.Time
}

// Run is one execution of a pinned workflow version.
type Run struct {
	ID             string
	WorkflowID     string
	WorkflowName   string
	Version        int
	Status         string
	Input          json.RawMessage
	TriggerHeaders map[string]string
	IdempotencyKey string
	Error          string
	ExpiresAt      time.Time
	StartedAt      time.Time
	FinishedAt     *time.Time
	UpdatedAt      time.Time
}

// StepRun is one step of a run.
type StepRun struct {
	RunID         string
	Name          string
	Position      int
	Type          string
	Status        string
	Attempt       int
	CallbackToken string
	StatusCode    *int
	DurationMS    *int64
	Request       json.RawMessage // the rendered HTTP request, so retries resend it unchanged
	Body          []byte
	Headers       map[string]string
	Truncated     bool
	Blocked       bool
	Error         string
	WakeAt        *time.Time
	StartedAt     *time.Time
	FinishedAt    *time.Time
}

// Queue item kinds: the work a dispatcher claims.
const (
	KindHTTP        = "http"         // execute an HTTP step attempt
	KindWake        = "wake"         // a sleep step is due
	KindWaitTimeout = "wait_timeout" // a webhook wait expired
	KindRunExpire   = "run_expire"   // a run reached max_duration
)

// QueueItem is durable work with a due time; it is deleted when done.
type QueueItem struct {
	ID         int64
	Kind       string
	RunID      string
	Step       string
	Attempt    int
	DueAt      time.Time
	LeaseToken string
	LeaseUntil time.Time
}

// Event is an append-only record of something that happened to a run.
type Event struct {
	RunID string          `json:"run_id"`
	Seq   int64           `json:"seq"`
	Type  string          `json:"type"`
	Step  string          `json:"step,omitempty"`
	Data  json.RawMessage `json:"data,omitempty"`
	At    time.Time       `json:"at"`
}

// NewEvent is an event to append; the store assigns Seq and At.
type NewEvent struct {
	Type string
	Step string
	Data any
}

// Page selects a slice of a list: items after Cursor (exclusive), newest
// first, at most Limit.
type Page struct {
	Cursor string
	Limit  int
}

// NewRun is everything a trigger writes in one transaction.
type NewRun struct {
	Run    Run
	Steps  []*StepRun
	Queue  []QueueItem
	Events []NewEvent
}

// Store is the persistence seam. Every method is safe for concurrent use.
type Store interface {
	// Dialect is "sqlite" or "postgres".
	Dialect() string
	Migrate(ctx context.Context) error
	Close() error

	CreateWorkflow(ctx context.Context, w *Workflow) (*Workflow, error)
	// UpdateWorkflow stores a new version of the workflow named by ref (id
	// or name) unless the fingerprint is unchanged.
	UpdateWorkflow(ctx context.Context, ref string, w *Workflow) (*Workflow, error)
	GetWorkflow(ctx context.Context, ref string) (*Workflow, error)
	GetWorkflowVersion(ctx context.Context, id string, version int) (*Workflow, error)
	ListWorkflows(ctx context.Context, p Page) ([]*Workflow, string, error)
	DeleteWorkflow(ctx context.Context, ref string) error

	// CreateRun writes the run, its steps, queue items and events at once.
	// With an idempotency key already used for the workflow it writes
	// nothing and returns the first run with created=false.
	CreateRun(ctx context.Context, nr *NewRun, now time.Time) (run *Run, created bool, err error)
	GetRun(ctx context.Context, id string) (*Run, []*StepRun, error)
	ListRuns(ctx context.Context, workflowID string, p Page) ([]*Run, string, error)
	ListEvents(ctx context.Context, runID string, afterSeq int64, limit int) ([]*Event, error)
	// StepByToken finds the step that owns a webhook callback token.
	StepByToken(ctx context.Context, token string) (runID, step string, err error)

	// InRun runs fn in a transaction holding the run's lock, so at most one
	// decision about a run is made at a time, on every node.
	InRun(ctx context.Context, runID string, now time.Time, fn func(tx RunTx) error) error

	// Claim leases up to n due queue items (due, and not leased or with an
	// expired lease) until now+lease, in one round trip.
	Claim(ctx context.Context, now time.Time, lease time.Duration, n int) ([]*QueueItem, error)
	// ExtendLease moves a claimed item's lease end; ErrLeaseLost when the
	// item is gone (done, or its run finished) or leased to someone else.
	ExtendLease(ctx context.Context, id int64, leaseToken string, until time.Time) error
	// NextDue is the earliest time a queue item becomes claimable.
	NextDue(ctx context.Context) (time.Time, bool, error)
	// Sweep deletes queue items of finished runs (they can do nothing).
	Sweep(ctx context.Context) (int, error)

	// API keys are stored as SHA-256 hashes.
	AddAPIKey(ctx context.Context, name, hash string) error
	HasAPIKeys(ctx context.Context) (bool, error)
	APIKeyExists(ctx context.Context, hash string) (bool, error)
}

// RunTx is a transaction that holds one run's lock.
type RunTx interface {
	Run() *Run
	Steps() []*StepRun
	Step(name string) *StepRun
	// UpdateRun writes status, error and finished_at.
	UpdateRun(r *Run) error
	// UpdateStep writes all mutable step columns.
	UpdateStep(s *StepRun) error
	Enqueue(items ...QueueItem) error
	// Dequeue deletes a claimed item; ErrLeaseLost when it is gone or leased
	// to someone else, which fences out stale workers.
	Dequeue(id int64, leaseToken string) error
	// DropQueue deletes all of the run's queue items.
	DropQueue() error
	Append(events ...NewEvent) error
}

// Notifier is an optional capability: a store that can tell other nodes that
// new work was queued (Postgres LISTEN/NOTIFY).
type Notifier interface {
	// Wakeups delivers a value when any node queued work; closed with ctx.
	Wakeups(ctx context.Context) <-chan struct{}
}
