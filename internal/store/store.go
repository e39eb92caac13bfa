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
	// ExpiresAt is when the run ends as timed out if it has not finished
	// (max_duration after its start); the store reports it as a due
	// KindRunExpire timer then. It never changes.
	ExpiresAt  time.Time
	StartedAt  time.Time
	FinishedAt *time.Time
	UpdatedAt  time.Time
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
	// KindRunExpire: a run reached max_duration. It is not a queue row:
	// a run that is not finished is due to expire at its ExpiresAt, and
	// DueTimers, FireTimers and NextDue report it as an item of this kind
	// with ID 0. Enqueuing one is ErrExpiryNotQueued.
	KindRunExpire = "run_expire"
)

// ErrExpiryNotQueued: a queue item of kind KindRunExpire was written; a
// run's expiry is its ExpiresAt.
var ErrExpiryNotQueued = errors.New("a run's expiry is its expires_at, not a queue item")

// TimerKinds are the kinds applied by FireTimers: they touch only the
// database, so they are fired in batches without a lease each.
var TimerKinds = []string{KindWake, KindWaitTimeout, KindRunExpire}

// IsTimer says whether kind is one of TimerKinds.
func IsTimer(kind string) bool {
	return kind == KindWake || kind == KindWaitTimeout || kind == KindRunExpire
}

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
	Data any // encoded as json.Marshal does, or EventJSON kept as it is
}

// EventJSON is event data already encoded, valid JSON as json.Marshal
// writes it: the store keeps it as it is, without a copy, so it must not be
// changed once given. The runtime encodes the data of
// its most frequent events itself (a map, its boxed values and their
// encoding were a tenth of what a step allocated).
type EventJSON []byte

// Page selects a slice of a list: items after Cursor (exclusive), newest
// first, at most Limit.
type Page struct {
	Cursor string
	Limit  int
}

// CreateResult is one run of CreateRuns: the run as stored, and whether
// this call created it (false: its idempotency key named an existing run).
type CreateResult struct {
	Run     *Run
	Created bool
	Err     error
}

// NewRun is everything a trigger writes in one transaction.
type NewRun struct {
	Run    Run
	Steps  []*StepRun
	Queue  []QueueItem
	Tasks  []*Task
	Events []NewEvent
	// Workflow, when set, is the workflow the run was built from, as the
	// caller last read it (perhaps from a cache): the run is created only
	// if, inside the writing transaction, that workflow is still live,
	// enabled, named Workflow.Name and at version Run.Version. Otherwise
	// the result's Err is ErrWorkflowChanged and nothing of it is written.
	Workflow *Workflow
}

// Task is a unit of work handed to external workers (the durable inbox). A
// task may belong to a workflow step (RunID, Step) or stand alone.
type Task struct {
	ID              string
	Type            string
	Payload         json.RawMessage
	Status          string
	Priority        int
	RunAt           time.Time
	IdempotencyKey  string
	Attempt         int
	MaxAttempts     int
	RetryDelay      time.Duration // base of the attempt² backoff; 0 = default
	LeasedBy        string
	LeaseToken      string
	LeaseUntil      *time.Time
	Reclaimed       bool // the current lease took over an expired one
	CancelRequested bool
	LastError       string
	Result          json.RawMessage
	RunID           string
	Step            string
	CreatedAt       time.Time
	UpdatedAt       time.Time
	FinishedAt      *time.Time
	// ToWaitingClaim: created leased to a claim waiting on the server
	// rather than to the worker whose completion started it (the claimed
	// event says which). Not stored.
	ToWaitingClaim bool
	// TraceParent is the W3C traceparent of the run's trace context, set
	// on a run's tasks handed out to workers while tracing is on, so that
	// a worker's spans join the run's trace. Not stored.
	TraceParent string
}

// TaskType is a registry entry: defaults for a versioned task type and
// whether its tasks may be claimed.
type TaskType struct {
	Type        string
	Description string
	Enabled     bool
	MaxAttempts int           // 0 = default
	RetryDelay  time.Duration // 0 = default
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// ClaimTasks asks for up to Max claimable tasks whose type matches one of
// Patterns: an exact type, or a prefix ending in % ("billing.%").
type ClaimTasks struct {
	Patterns []string
	WorkerID string
	Lease    time.Duration
	Max      int
	Now      time.Time
	// Exhausted, if not nil, says whether a task whose lease ran out, or
	// a pending task already attempted (a retry, a released task), has
	// had its final attempt: such a task is not leased again (nor counted
	// toward Max) but returned in Claim.Exhausted, as it was, for the
	// caller to fail.
	Exhausted func(*Task) bool
}

// Claim is what ClaimOrNext found: the tasks it leased and, when it read
// it, when a matching task next becomes claimable.
type Claim struct {
	Tasks []*Task
	// Since is, for each of Tasks, when it became claimable: its run_at,
	// its last change while pending (created, retried, released), or the
	// end of the expired lease the claim took over (metrics: how long
	// tasks wait for workers).
	Since []time.Time
	// Exhausted are the tasks the claim met that had their final attempt
	// (ClaimTasks.Exhausted): not leased, left as they were.
	Exhausted []*Task
	// NextRead says Next and NextOK were read with the claim, which then
	// found nothing claimable: they are what NextTaskDue returns at the
	// claim's Now (NextOK false: no task becomes claimable later).
	NextRead bool
	Next     time.Time
	NextOK   bool
}

// Store is the persistence seam. Every method is safe for concurrent use.
type Store interface {
	// Dialect is "sqlite" or "postgres".
	Dialect() string
	// InTasks runs fn for many tasks in one transaction; see
	// sqlstore.Store.InTasks for the locking order and ErrRetry. runs, when
	// not nil, gives the run of some of the tasks (task id -> run id, as
	// the store returned it with the task); the others are looked up.
	// fn is called in increasing i. A store may decide the batch more than
	// once (Postgres: on cached rows first, then on locked ones when those
	// changed); each decision calls fn again from the lowest i, and only
	// the last one's writes count.
	InTasks(ctx context.Context, ids []string, runs map[string]string, now time.Time, fn func(i int, tx TaskTx) error) (errs []error, err error)
	// OnCommit registers the function told about each committed write that
	// queued items or made tasks claimable (set once, before use).
	OnCommit(fn func(Committed))
	// OnEvents registers the function told, after each committed write
	// that appended events, how many of each type it appended (set once,
	// before use; it runs on the committing goroutine and must be quick).
	OnEvents(fn func([]EventCount))
	// OnFinished registers the function told, after each committed write
	// that ended steps or runs, which ones (set once, before use; it runs
	// on the committing goroutine and must be quick). Tracing records a
	// span for each.
	OnFinished(fn func([]Finished))
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
	// CreateRuns writes many runs in one transaction; a result's Err is
	// ErrRetry for an idempotency key repeated within the call.
	CreateRuns(ctx context.Context, nrs []*NewRun, now time.Time) ([]CreateResult, error)
	GetRun(ctx context.Context, id string) (*Run, []*StepRun, error)
	// TriggerHeaders returns the trigger headers of the runs named (for
	// tracing, their trace context), keyed by run id; runs that do not
	// exist are left out.
	TriggerHeaders(ctx context.Context, runIDs []string) (map[string]map[string]string, error)
	// ListRuns lists a workflow's runs, newest first, without their
	// Input and TriggerHeaders (empty): a list shows neither, and a page
	// of large inputs is not read for it.
	ListRuns(ctx context.Context, workflowID string, p Page) ([]*Run, string, error)
	ListEvents(ctx context.Context, runID string, afterSeq int64, limit int) ([]*Event, error)
	// CountRuns counts a workflow's runs by status.
	CountRuns(ctx context.Context, workflowID string) (map[string]int, error)
	// StepByToken finds the step that owns a webhook callback token.
	StepByToken(ctx context.Context, token string) (runID, step string, err error)

	// InRun runs fn in a transaction holding the run's lock, so at most one
	// decision about a run is made at a time, on every node.
	InRun(ctx context.Context, runID string, now time.Time, fn func(tx RunTx) error) error

	// Claim leases up to n due queue items (due, and not leased or with an
	// expired lease) until now+lease, in one round trip.
	Claim(ctx context.Context, now time.Time, lease time.Duration, n int, kinds ...string) ([]*QueueItem, error)
	// ExtendLease moves a claimed item's lease end; ErrLeaseLost when the
	// item is gone (done, or its run finished) or leased to someone else.
	ExtendLease(ctx context.Context, id int64, leaseToken string, until time.Time) error
	// DueTimers lists up to max timer items (TimerKinds) due by until
	// (now, or later to read ahead) and not held by a lease at now,
	// earliest first, without locking anything: the caller picks runs
	// from them for FireTimers once they are due. The expiries of runs
	// not finished are among them (see KindRunExpire). Items of the runs
	// in skip are left out: the caller is firing them or holds them back,
	// and a read full of them would hide the timers due after them. A
	// store shared by several servers may list only this server's share
	// of them, and the others' once they are overdue (Postgres:
	// sqlstore.Store.ShareTimers).
	DueTimers(ctx context.Context, now, until time.Time, max int, skip ...string) ([]*QueueItem, error)
	// FireTimers applies the due timer items of the given runs in one
	// transaction, calling fn for each under its run's lock; read, when
	// not nil, is the caller's DueTimers read, which the store may decide
	// on instead of reading the items again. It may then decide the
	// transaction again: it calls fn(nil, nil) to say that what fn did
	// so far is dropped, then fn for the items again. See
	// sqlstore.Store.FireTimers.
	FireTimers(ctx context.Context, runIDs []string, read []*QueueItem, now time.Time, lease time.Duration, fn func(it *QueueItem, tx RunTx) error) (taken int, errs []error, err error)
	// NextDue is the earliest time later than after (any time, when after
	// is zero) at which an item of one of kinds becomes due: its due time,
	// or its lease end while it is leased. No kinds means the kinds kept as
	// queue rows (run expiries are asked for by KindRunExpire). With
	// timers shared among servers, another server's timer is due to this
	// one when DueTimers would list it (ShareTimers).
	NextDue(ctx context.Context, after time.Time, kinds ...string) (time.Time, bool, error)
	// Sweep deletes queue items of finished runs (they can do nothing).
	Sweep(ctx context.Context) (int, error)

	// CreateTask inserts a standalone task with a "created" event. A
	// repeated idempotency key writes nothing and returns the first task
	// with created=false.
	CreateTask(ctx context.Context, t *Task, now time.Time) (task *Task, created bool, err error)
	GetTask(ctx context.Context, id string) (*Task, error)
	// ClaimTasks leases due tasks (pending and due, or leased with an
	// expired lease) in priority, due time and age order, skipping disabled
	// types; attempt is incremented and "claimed" (and "lease_expired")
	// events are appended.
	ClaimTasks(ctx context.Context, req ClaimTasks) ([]*Task, error)
	// ClaimOrNext is ClaimTasks that, when it finds nothing claimable,
	// may read in the same statement when a matching task next becomes
	// claimable (Claim.NextRead): a worker going back to wait then costs
	// the database one statement, not one for the claim and one for
	// NextTaskDue.
	ClaimOrNext(ctx context.Context, req ClaimTasks) (Claim, error)
	// NextTaskDue is the earliest time a task matching patterns becomes
	// claimable (a run_at or a lease end in the future).
	NextTaskDue(ctx context.Context, patterns []string, now time.Time) (time.Time, bool, error)
	// ExpiredTaskLeases lists up to limit leased tasks whose lease ended
	// at or before now on their final attempt: the attempt has reached
	// the task's max_attempts, else its type's, else defaultMax.
	ExpiredTaskLeases(ctx context.Context, now time.Time, defaultMax, limit int) ([]*Task, error)
	// InTask runs fn in a transaction holding the task's lock and, when the
	// task belongs to a run, the run's lock first (runs are always locked
	// before their tasks, so the two never deadlock).
	InTask(ctx context.Context, id string, now time.Time, fn func(tx TaskTx) error) error
	PutTaskType(ctx context.Context, tt *TaskType) (*TaskType, error)
	GetTaskType(ctx context.Context, typ string) (*TaskType, error)
	ListTaskTypes(ctx context.Context) ([]*TaskType, error)

	// API keys are stored as SHA-256 hashes.
	AddAPIKey(ctx context.Context, name, hash string) error
	HasAPIKeys(ctx context.Context) (bool, error)
	APIKeyExists(ctx context.Context, hash string) (bool, error)
}

// RunTx is a transaction that holds one run's lock.
type RunTx interface {
	// Now is the transaction's timestamp: the time InRun (or the batch)
	// was given, unless the run was last written later than that (the
	// caller read its clock, then waited for the run's lock while another
	// writer went first), in which case it is that write's time. What the
	// transaction records (events, and the times its caller sets) is then
	// never earlier than what the run already holds.
	Now() time.Time
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
	// CreateTask inserts a task owned by one of the run's steps, with its
	// "created" event.
	CreateTask(t *Task) error
	// CancelTasks cancels those of the run's tasks with these ids that
	// are unfinished (workers see cancel_requested at their next
	// heartbeat). The caller names them, from its steps, because no index
	// finds a run's tasks: one would take an entry at every task's insert
	// and claim.
	CancelTasks(ids ...string) error
}

// TaskTx is a transaction that holds one task's lock (and its run's).
type TaskTx interface {
	// Now is the transaction's timestamp (what updated_at records).
	Now() time.Time
	Task() *Task
	UpdateTask(t *Task) error
	AppendTask(events ...NewEvent) error
	// Run is the owning run's transaction, or nil for a standalone task.
	Run() RunTx
}

// ErrWorkflowChanged: a NewRun's workflow was renamed, disabled, deleted
// or given a new version since the caller read it; read it again.
var ErrWorkflowChanged = errors.New("workflow changed since it was read")

// ErrRetry: a batched request shares its run or task with an earlier one in
// the same batch; submit it again in a later batch.
var ErrRetry = errors.New("retry in a later batch")

// EventCount is how many events of one type a committed write appended
// (the run and step events of the API's event log, and the task events
// of tasks' logs, implied ones included).
type EventCount struct {
	Type string
	N    int
}

// Finished is a step or a run that a committed write ended: it appended
// the step's terminal event (step_succeeded, step_failed, step_skipped,
// step_timeout) or the run's (run_completed, run_failed, run_cancelled,
// run_timeout); a step under way when its run was cancelled or timed out
// (cancelled with it, no event of its own) is told with the run. Each
// ending is told once, by the write that appended its event.
type Finished struct {
	RunID      string
	WorkflowID string
	Version    int
	// Step is the step's name; empty for the run itself.
	Step string
	// Type is the step's type (task, http, sleep, …); empty for a run.
	Type    string
	Status  string // the step's or the run's status as written
	Attempt int    // the step's last attempt; 0 for a run
	Error   string
	// StartedAt is zero for a step that never started (skipped).
	StartedAt  time.Time
	FinishedAt time.Time
	// TriggerHeaders are the run's (its trace context, for tracing).
	TriggerHeaders map[string]string
}

// Committed tells, after a write committed, what it made ready: the
// earliest queue items it added and whether tasks became claimable. Wake-ups follow commits, never precede them, so a woken
// dispatcher or claim always sees the rows.
type Committed struct {
	// HTTPDue is the earliest HTTP attempt queued, TimerDue the earliest
	// timer (TimerKinds); zero when none.
	HTTPDue  time.Time
	TimerDue time.Time
	Tasks    bool
	// TasksAt, with Tasks, is when the first of those tasks becomes
	// claimable if none is at the commit (all of them scheduled ahead: a
	// retry's backoff, a task's run_at); zero when some may be claimable
	// at once. A waiting claim need not look before it.
	TasksAt time.Time
	// Types are the types of the tasks this write itself made pending,
	// each once; with Tasks, it may be empty (tasks a claim locked and
	// left pending, a task type enabled again).
	Types []string
	// Leased are the lease tokens of the tasks the write created already
	// leased (handed to a worker in the same transaction).
	Leased []string
	// Registry says the write changed the task-type registry: entries
	// cached from it are stale. Other nodes learn it as a wake-up for
	// everything (Notifier), after which they read the registry again.
	Registry bool
}

// Notifier is an optional capability: a store that can tell other nodes that
// new work was queued (Postgres LISTEN/NOTIFY).
type Notifier interface {
	// Wakeups delivers a value when another node may have queued work of
	// any kind, without saying which (everything is to be looked at
	// again); closed with ctx. What another node's commits made ready,
	// when its notification says, goes to the OnCommit function instead,
	// as this node's own commits do, while Wakeups runs. When ctx ends
	// the node tells the others it stopped running (Postgres: its
	// goodbye, so they take its share of the timers).
	Wakeups(ctx context.Context) <-chan struct{}
}
