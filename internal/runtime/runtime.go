package runtime

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/engine"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
)

// Errors callers branch on.
var (
	ErrDisabled         = errors.New("workflow is disabled")
	ErrAlreadyDelivered = errors.New("webhook already delivered")
	ErrRunFinished      = errors.New("run already finished")
	ErrStepFinished     = errors.New("step already finished")
	// ErrRunning: Run was called while another Run of the runtime runs.
	ErrRunning = errors.New("ferry: the engine is already running (one Run at a time)")
)

// Config tunes the runtime.
type Config struct {
	Store     store.Store
	HTTP      *httpstep.Executor
	Clock     clock.Clock
	Logger    *slog.Logger
	PublicURL string // base of callback URLs, e.g. http://127.0.0.1:8080
	// Concurrency bounds queue items processed at once (HTTP attempts
	// dominate). Default 64.
	Concurrency int
	// Lease is how long a claimed item is held before another node may take
	// it over; in-flight HTTP attempts renew it. Default 30s.
	Lease time.Duration
	// SafetyTick bounds how long the dispatcher sleeps without a wake-up.
	// Default 5s.
	SafetyTick time.Duration
	// Observer learns what the runtime measures (metrics); none by
	// default.
	Observer Observer
	// Tracer makes the spans of triggers and HTTP attempts; none by
	// default.
	Tracer Tracer
}

// Runtime executes workflow runs.
type Runtime struct {
	running atomic.Bool // Run is running (one at a time)
	cfg     Config
	st      store.Store
	clk     clock.Clock
	log     *slog.Logger
	defs    sync.Map // defKey -> *spec.Workflow
	// wfs caches trigger references (id or name) -> *store.Workflow, only
	// enabled ones; every run built from one is checked against the
	// workflow's row in the transaction that writes it (NewRun.Workflow).
	wfs  sync.Map
	wfsN atomic.Int64
	// taskRuns: task id -> run id of tasks handed to workers (reportLane)
	taskRuns  sync.Map
	taskRunsN atomic.Int64
	// runTraces: run id -> the traceparent its tasks are handed out with
	// (traceTasks), while tracing is on.
	runTraces  sync.Map
	runTracesN atomic.Int64
	types      sync.Map // task type -> cachedType
	// exhaustedFn is exhausted as a func value, made once rather than a
	// claim (store.ClaimTasks.Exhausted).
	exhaustedFn func(*store.Task) bool
	wake        chan struct{}
	freed       chan struct{} // a processing slot came free
	sem         chan struct{}
	// planned is when the dispatcher will next look at the queue (Unix
	// ns; MaxInt64 while it is deciding): commits that queue something
	// due earlier wake it, others need not.
	planned atomic.Int64
	mu      sync.Mutex
	inflt   map[string]map[int64]context.CancelFunc // run id -> item id -> cancel
	wg      sync.WaitGroup

	drainOnce sync.Once
	draining  chan struct{} // closed when the server stops: long-polls return

	taskMu  sync.Mutex
	taskSig *taskSignal // closed and replaced when tasks may have become claimable
	// waiting are the claims long-polling on this node, to which writes
	// hand the tasks they create (handoff.go).
	waiting waiters

	timers *timerLoop
	// yield is held while late timers are being written: trigger and
	// report batches wait for it (at most yieldBound each), so a flood of
	// new runs, or of the steps earlier wake-ups started, cannot make the
	// runs still asleep wake late.
	yield yieldGate

	reports   *batcher[*reportReq]
	triggers  *batcher[*triggerReq]
	batchWG   sync.WaitGroup
	closeOnce sync.Once
	// Batch triggers write on the caller's goroutine: bulk bounds how many
	// at once, and bulkMu orders them before Close.
	bulk       chan struct{}
	bulkMu     sync.RWMutex
	bulkClosed bool
	closed     chan struct{}
}

// New builds a runtime; call Run to start dispatching.
func New(cfg Config) *Runtime {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.SafetyTick <= 0 {
		cfg.SafetyTick = 5 * time.Second
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	if cfg.Tracer == nil {
		cfg.Tracer = noTracer{}
	}
	cfg.PublicURL = strings.TrimRight(cfg.PublicURL, "/")
	r := &Runtime{
		cfg:      cfg,
		st:       cfg.Store,
		clk:      cfg.Clock,
		log:      cfg.Logger,
		wake:     make(chan struct{}, 1),
		freed:    make(chan struct{}, 1),
		sem:      make(chan struct{}, cfg.Concurrency),
		inflt:    map[string]map[int64]context.CancelFunc{},
		taskSig:  &taskSignal{ch: make(chan struct{})},
		draining: make(chan struct{}),
		closed:   make(chan struct{}),
		bulk:     make(chan struct{}, batchLanes),
	}
	// Reports of one run go to one lane where lanes are concurrent
	// transactions (Postgres); with one writer in turn (SQLite) the
	// serialReportLoops loops take them from one shared queue.
	reportKey, reportLoops := r.reportLane, batchLanes
	r.timers = newTimerLoop(concurrentTimers)
	if sw, ok := cfg.Store.(serialWriter); ok && sw.SerialWrites() {
		reportKey, reportLoops = nil, serialReportLoops
		r.timers = newTimerLoop(serialTimers)
	}
	r.reports = newBatcher(r.closed, &r.batchWG, reportLoops, reportKey, r.applyReports)
	r.triggers = newBatcher(r.closed, &r.batchWG, batchLanes, nil, r.applyTriggers)
	// Where a batch is a transaction of its own, reports under load wait
	// to share one (see flushWindow). Triggers do not: with them waiting
	// too, Postgres sleep's lateness p99 was worse (median of eight pairs
	// 91 against 68 ms).
	if reportKey != nil {
		r.reports.coalesce(flushWindow, flushSize)
	}
	r.planned.Store(math.MaxInt64)
	r.exhaustedFn = r.exhausted
	cfg.Store.OnCommit(r.committed)
	return r
}

// committed wakes what a committed write made ready: waiting claims when
// tasks became claimable, the dispatcher when an item is due before it
// would look anyway. Wake-ups follow commits, so nothing is missed.
func (r *Runtime) committed(c store.Committed) {
	if c.Registry {
		r.types.Clear()
	}
	r.waiting.committed(c.Leased)
	if c.Tasks {
		r.tasksReadyAt(c.TasksAt, c.Types)
	}
	if !c.HTTPDue.IsZero() && c.HTTPDue.UnixNano() < r.planned.Load() {
		r.Nudge()
	}
	if !c.TimerDue.IsZero() {
		r.timers.queued(c.TimerDue.UnixNano())
	}
}

// Nudge wakes the dispatcher and the timer loop: new work may be due.
func (r *Runtime) Nudge() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
	r.timers.nudge()
}

// defKey names a cached definition: a workflow's id and version.
type defKey struct {
	id      string
	version int
}

// Definition returns the parsed definition of a workflow version, cached:
// versions are immutable.
func (r *Runtime) Definition(ctx context.Context, workflowID string, version int) (*spec.Workflow, error) {
	key := defKey{workflowID, version}
	if v, ok := r.defs.Load(key); ok {
		return v.(*spec.Workflow), nil
	}
	w, err := r.st.GetWorkflowVersion(ctx, workflowID, version)
	if err != nil {
		return nil, err
	}
	def, err := spec.Parse(w.Definition, spec.Limits{Stored: true})
	if err != nil {
		return nil, fmt.Errorf("stored definition %s@%d: %w", workflowID, version, err)
	}
	r.defs.Store(key, def)
	return def, nil
}

// CallbackURL is the public URL of a webhook callback token.
func (r *Runtime) CallbackURL(token string) string {
	return r.cfg.PublicURL + "/wh/" + token
}

// serialWriter is a store whose writes are applied by one writer in turn.
type serialWriter interface{ SerialWrites() bool }

// TriggerRequest is a request to start a run.
type TriggerRequest struct {
	Workflow       string // id or name
	Input          json.RawMessage
	Headers        map[string]string
	IdempotencyKey string
}

// Trigger starts a run, writing it and its first work in one transaction.
// A repeated idempotency key returns the first run and created=false.
//
// The workflow comes from a cache of references; the transaction that
// writes the run checks it is still live, enabled and at that version, and
// a trigger whose workflow changed meanwhile reads it again and retries.
func (r *Runtime) Trigger(ctx context.Context, req TriggerRequest) (run *store.Run, created bool, err error) {
	ctx, end := r.cfg.Tracer.Trigger(ctx, req.Workflow, 1)
	defer func() { end(err) }()
	req.Headers = r.cfg.Tracer.Headers(ctx, req.Headers)
	err = r.withWorkflow(ctx, req.Workflow, func(wf *store.Workflow) (bool, error) {
		var err error
		run, created, err = r.trigger(ctx, req, wf)
		return !created, err
	})
	return run, created, err
}

// withWorkflow runs write with the workflow ref names, from the cache, and
// again with it read afresh (up to three times) when the writing
// transaction found it changed (store.ErrWorkflowChanged). write reports
// whether it only found runs by idempotency key and wrote nothing: those
// were not checked against the workflow (see changedSince), so with a
// cached workflow it is read again and, if it changed, write runs again.
func (r *Runtime) withWorkflow(ctx context.Context, ref string, write func(wf *store.Workflow) (foundOnly bool, err error)) error {
	for attempt := 0; ; attempt++ {
		wf, err := r.workflow(ctx, ref, attempt > 0)
		if err != nil {
			return err
		}
		foundOnly, err := write(wf)
		if errors.Is(err, store.ErrWorkflowChanged) && attempt < 3 {
			continue // changed again while this trigger was written
		}
		if err == nil && foundOnly && attempt == 0 {
			changed, err := r.changedSince(ctx, ref, wf)
			if err != nil {
				return err
			}
			if changed {
				continue
			}
		}
		return err
	}
}

// changedSince tells whether the workflow ref names is no longer wf. A run
// found by its idempotency key is not checked against its workflow when
// written (nothing is written): with wf from the cache, the key may name a
// run of a workflow since deleted, disabled or replaced, which a trigger
// must not return. Key hits are rare; this reads the workflow again.
func (r *Runtime) changedSince(ctx context.Context, ref string, wf *store.Workflow) (bool, error) {
	fresh, err := r.workflow(ctx, ref, true)
	if err != nil {
		return false, err
	}
	return fresh.ID != wf.ID || fresh.Version != wf.Version || fresh.Name != wf.Name, nil
}

// workflow resolves a trigger's reference, from the cache unless fresh.
func (r *Runtime) workflow(ctx context.Context, ref string, fresh bool) (*store.Workflow, error) {
	if !fresh {
		if v, ok := r.wfs.Load(ref); ok {
			return v.(*store.Workflow), nil
		}
	}
	r.wfs.Delete(ref)
	wf, err := r.st.GetWorkflow(ctx, ref)
	if err != nil {
		return nil, err
	}
	if !wf.Enabled {
		return nil, fmt.Errorf("workflow %q: %w", wf.Name, ErrDisabled)
	}
	// Bounded: references of deleted or renamed workflows stay until
	// used; past maxCachedRefs the cache starts again.
	if r.wfsN.Add(1) > maxCachedRefs {
		r.wfs.Clear()
		r.wfsN.Store(0)
	}
	r.wfs.Store(ref, wf)
	return wf, nil
}

const maxCachedRefs = 4096

func (r *Runtime) trigger(ctx context.Context, req TriggerRequest, wf *store.Workflow) (*store.Run, bool, error) {
	def, err := r.Definition(ctx, wf.ID, wf.Version)
	if err != nil {
		return nil, false, err
	}
	nr := r.newRun(wf, def, req, r.clk.Now())
	q := &triggerReq{ctx: ctx, nr: nr, done: make(chan struct{})}
	if err := r.triggers.do(q, q.done); err != nil {
		return nil, false, err
	}
	if q.err != nil {
		return nil, false, q.err
	}
	if q.created {
		r.log.Info("run started", "run_id", q.run.ID, "workflow", wf.Name, "version", wf.Version)
	}
	return q.run, q.created, nil
}

// newRun is a new run of wf with its first decisions made: its steps,
// first work, queue items and events.
func (r *Runtime) newRun(wf *store.Workflow, def *spec.Workflow, req TriggerRequest, now time.Time) *store.NewRun {
	input := req.Input
	if len(input) == 0 {
		input = json.RawMessage("{}")
	}
	run := store.Run{
		ID:             uuid.Must(uuid.NewV7()).String(),
		WorkflowID:     wf.ID,
		Version:        wf.Version,
		Status:         status.RunRunning,
		Input:          input,
		TriggerHeaders: req.Headers,
		IdempotencyKey: req.IdempotencyKey,
		StartedAt:      now,
		ExpiresAt:      now.Add(def.MaxDuration),
	}
	steps := make([]*store.StepRun, len(def.Steps))
	rows := make([]store.StepRun, len(def.Steps)) // one allocation for all of them
	for i, s := range def.Steps {
		rows[i] = store.StepRun{Name: s.Name, Position: i, Type: string(s.Type), Status: status.StepPending}
		steps[i] = &rows[i]
		if s.Type == spec.StepWebhook {
			// Created with the run so {{wait.<step>.url}} resolves
			// before the step starts.
			steps[i].CallbackToken = "wh_" + rand.Text()
		}
	}
	ch := &changes{now: now, runID: run.ID}
	ch.events = append(ch.events, store.NewEvent{Type: "run_started", Data: store.EventJSON(runStartedData(wf.Name, wf.Version))})
	r.decide(def, &run, steps, ch)
	nr := &store.NewRun{Run: run, Steps: steps, Queue: ch.queue, Tasks: ch.tasks, Events: ch.events, Workflow: wf}
	if ch.finished {
		nr.Queue = nil
	}
	return nr
}

// MaxTriggerBatch is the most runs one TriggerBatch call starts.
const MaxTriggerBatch = 1000

// ErrBatchTooLarge: a TriggerBatch call over MaxTriggerBatch runs.
var ErrBatchTooLarge = fmt.Errorf("more than %d runs in one batch", MaxTriggerBatch)

// TriggerResult is one run of TriggerBatch: the run, and whether this call
// created it (false: its idempotency key named an existing run).
type TriggerResult struct {
	Run     *store.Run
	Created bool
}

// TriggerBatch starts runs of the workflow named by ref, one per request
// (their Workflow field is ignored), in one transaction: a backfill of a
// thousand runs costs one commit. Results are in request order. An
// idempotency key already used returns the first run with Created false,
// also when it repeats within the batch. On an error no run of the batch
// was started. An empty batch starts nothing.
func (r *Runtime) TriggerBatch(ctx context.Context, ref string, reqs []TriggerRequest) (_ []TriggerResult, err error) {
	if len(reqs) > MaxTriggerBatch {
		return nil, fmt.Errorf("%d runs: %w", len(reqs), ErrBatchTooLarge)
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	ctx, end := r.cfg.Tracer.Trigger(ctx, ref, len(reqs))
	defer func() { end(err) }()
	reqs = r.traced(ctx, reqs)
	r.bulkMu.RLock()
	defer r.bulkMu.RUnlock()
	if r.bulkClosed {
		return nil, errClosed
	}
	// As many batches write at once as trigger lanes; more would only
	// queue in the store and hold memory.
	select {
	case r.bulk <- struct{}{}:
		defer func() { <-r.bulk }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var out []TriggerResult
	err = r.withWorkflow(ctx, ref, func(wf *store.Workflow) (bool, error) {
		var err error
		out, err = r.triggerBatch(ctx, wf, reqs)
		// A batch that created runs passed the check when written, so
		// its keys were looked up under the live workflow.
		return !slices.ContainsFunc(out, func(t TriggerResult) bool { return t.Created }), err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// traced is reqs with ctx's trace context in their headers (Tracer.Headers),
// reqs itself when no request's headers change. Requests with no headers,
// and consecutive ones that share a headers map (the API gives a batch's
// runs one), share one traced copy.
func (r *Runtime) traced(ctx context.Context, reqs []TriggerRequest) []TriggerRequest {
	var out []TriggerRequest
	var lastIn, lastOut map[string]string
	var empty map[string]string // the traced copy of no headers, if one was made
	emptyDone := false
	for i, q := range reqs {
		var h map[string]string
		switch {
		case len(q.Headers) == 0 && emptyDone:
			h = q.Headers
			if empty != nil {
				h = empty
			}
		case lastIn != nil && sameMap(q.Headers, lastIn):
			h = lastOut
		default:
			h = r.cfg.Tracer.Headers(ctx, q.Headers)
			if len(q.Headers) == 0 {
				emptyDone = true
				if !sameMap(h, q.Headers) {
					empty = h
				}
			} else {
				lastIn, lastOut = q.Headers, h
			}
		}
		if sameMap(h, q.Headers) {
			continue
		}
		if out == nil {
			out = slices.Clone(reqs)
		}
		out[i].Headers = h
	}
	if out == nil {
		return reqs
	}
	return out
}

// sameMap tells whether a and b are the same map (not equal ones).
func sameMap(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func (r *Runtime) triggerBatch(ctx context.Context, wf *store.Workflow, reqs []TriggerRequest) ([]TriggerResult, error) {
	def, err := r.Definition(ctx, wf.ID, wf.Version)
	if err != nil {
		return nil, err
	}
	now := r.clk.Now()
	nrs := make([]*store.NewRun, len(reqs))
	for i, q := range reqs {
		nrs[i] = r.newRun(wf, def, q, now)
	}
	out := make([]TriggerResult, len(reqs))
	todo := make([]int, len(reqs))
	for i := range todo {
		todo[i] = i
	}
	created := 0
	// A key repeated within the batch is ErrRetry on its later uses: the
	// next round finds the run its first use created.
	for round := 0; len(todo) > 0; round++ {
		if round == 2 {
			return nil, fmt.Errorf("idempotency keys still unresolved after two rounds: %w", store.ErrRetry)
		}
		r.yield.wait(r.clk, yieldBound)
		batch := make([]*store.NewRun, len(todo))
		for j, i := range todo {
			batch[j] = nrs[i]
		}
		res, err := r.createRuns(ctx, batch, now)
		if err != nil {
			return nil, err
		}
		var again []int
		for j, c := range res {
			i := todo[j]
			switch {
			case errors.Is(c.Err, store.ErrRetry):
				again = append(again, i)
			case c.Err != nil:
				return nil, c.Err
			default:
				out[i] = TriggerResult{Run: c.Run, Created: c.Created}
				if c.Created {
					created++
				}
			}
		}
		todo = again
	}
	if created > 0 {
		r.log.Info("runs started", "count", created, "workflow", wf.Name, "version", wf.Version)
	}
	return out, nil
}

// createRuns writes new runs, their first tasks handed to claims waiting
// on this node. A run not created (an idempotency key naming another run)
// keeps its tasks pending for a later attempt.
func (r *Runtime) createRuns(ctx context.Context, nrs []*store.NewRun, now time.Time) ([]store.CreateResult, error) {
	of := r.newOffer()
	for _, nr := range nrs {
		for _, t := range nr.Tasks {
			of.take(ctx, t, now)
		}
	}
	if len(of.held) > 0 {
		// A waiting claim's tasks ride on this write: the caller going
		// away must not cut it short after COMMIT was sent.
		ctx = context.WithoutCancel(ctx)
	}
	res, err := r.st.CreateRuns(ctx, nrs, now)
	of.settle(err)
	return res, err
}

type triggerReq struct {
	ctx     context.Context
	nr      *store.NewRun
	run     *store.Run
	created bool
	err     error
	done    chan struct{}
}

func (q *triggerReq) context() context.Context { return q.ctx }
func (q *triggerReq) fail(err error)           { q.err = err }
func (q *triggerReq) finish()                  { close(q.done) }

// applyTriggers writes a batch of new runs in one transaction.
func (r *Runtime) applyTriggers(batch []*triggerReq) []*triggerReq {
	r.yield.wait(r.clk, yieldBound)
	nrs := make([]*store.NewRun, len(batch))
	for i, q := range batch {
		nrs[i] = q.nr
	}
	res, err := r.createRuns(context.Background(), nrs, r.clk.Now())
	if err != nil && len(batch) > 1 && r.refused(err) {
		// The database refused the batch as a whole: one request it cannot
		// store must not fail the others. Each is written alone.
		return alone(r, batch, r.applyTriggers)
	}
	var retry []*triggerReq
	for i, q := range batch {
		switch {
		case err != nil:
			q.fail(err)
		case errors.Is(res[i].Err, store.ErrRetry):
			retry = append(retry, q) // the same key as an earlier one: it finds that run
			continue
		default:
			q.run, q.created, q.err = res[i].Run, res[i].Created, res[i].Err
		}
		q.finish()
	}
	return retry
}

// refuser is a store that tells a refusal of the data a write carries
// (text the database cannot store, an index entry too large) from a
// failure of the database itself (postgres.Store.Refused).
type refuser interface{ Refused(err error) bool }

// refused tells whether err refused a batch's data: only then is the
// batch written again request by request (a database that is down would
// fail each in turn, each waiting out its own connection attempt).
func (r *Runtime) refused(err error) bool {
	rs, ok := r.st.(refuser)
	return ok && rs.Refused(err)
}

// alone applies each request of a batch the database refused as a whole
// in a batch of its own, and returns those to retry: the request at fault
// fails alone.
func alone[R request](r *Runtime, batch []R, apply func([]R) []R) []R {
	var retry []R
	for _, q := range batch {
		retry = append(retry, apply([]R{q})...)
	}
	r.log.Warn("a batch failed as a whole; its requests were written one by one", "requests", len(batch), "retried", len(retry))
	return retry
}

// changes collects what one decision round writes.
type changes struct {
	now      time.Time
	runID    string
	touched  []*store.StepRun
	queue    []store.QueueItem
	tasks    []*store.Task
	events   []store.NewEvent
	finished bool
	// stopped: the run ends with steps cut short (cancel, timeout), whose
	// tasks must be cancelled. A run that ends because every step finished
	// has no unfinished task: a task step finishes with its task.
	stopped bool
	eager   *eagerClaim // a completing worker takes the tasks it starts
	offer   *offer      // claims waiting on this node take the others
}

func (c *changes) touch(s *store.StepRun) {
	for _, t := range c.touched {
		if t == s {
			return
		}
	}
	c.touched = append(c.touched, s)
}

// decide asks the engine what moves now and applies it to the in-memory run
// and steps, collecting the writes.
func (r *Runtime) decide(def *spec.Workflow, run *store.Run, steps []*store.StepRun, ch *changes) {
	states := stateMaps.Get().(map[string]engine.StepState)
	defer func() {
		if len(states) <= 64 { // a large run's map would cost every small one its clear and walks
			clear(states)
			stateMaps.Put(states)
		}
	}()
	in := engine.Run{
		Def:            def,
		TriggerBody:    run.Input,
		TriggerHeaders: run.TriggerHeaders,
		Steps:          states,
	}
	for _, s := range steps {
		in.Steps[s.Name] = engine.StepState{Status: s.Status, StatusCode: s.StatusCode, Body: s.Body, Headers: s.Headers, Truncated: s.Truncated, Blocked: s.Blocked}
		if s.CallbackToken != "" {
			if in.WaitURLs == nil {
				in.WaitURLs = map[string]string{}
			}
			in.WaitURLs[s.Name] = r.CallbackURL(s.CallbackToken)
		}
	}
	now := ch.now
	decisions := engine.Next(in)
	var byName map[string]*store.StepRun
	if len(decisions) > 1 && len(steps) > 16 {
		byName = make(map[string]*store.StepRun, len(steps))
		for _, s := range steps {
			byName[s.Name] = s
		}
	}
	for _, d := range decisions {
		s := stepNamed(steps, byName, d.Step)
		ch.touch(s)
		switch d.Action {
		case engine.Skip:
			s.Status, s.Blocked, s.Error, s.FinishedAt = status.StepSkipped, d.Blocked, d.Reason, &now
			ch.events = append(ch.events, store.NewEvent{Type: "step_skipped", Step: s.Name, Data: map[string]any{"reason": d.Reason}})
		case engine.TemplateError:
			s.Status, s.Error, s.StartedAt, s.FinishedAt = status.StepTemplateError, d.Reason, &now, &now
			ch.events = append(ch.events, store.NewEvent{Type: "step_failed", Step: s.Name, Data: map[string]any{"status": s.Status, "error": d.Reason}})
		case engine.StartHTTP:
			b, _ := json.Marshal(d.HTTP)
			s.Status, s.Attempt, s.Request, s.StartedAt = status.StepRunning, 1, b, &now
			ch.queue = append(ch.queue, store.QueueItem{Kind: store.KindHTTP, RunID: run.ID, Step: s.Name, Attempt: 1, DueAt: now})
			ch.events = append(ch.events, store.NewEvent{Type: "step_started", Step: s.Name})
		case engine.StartTask:
			st := def.Step(s.Name)
			s.Status, s.Attempt, s.StartedAt = status.StepRunning, 0, &now
			t := &store.Task{
				ID: uuid.Must(uuid.NewV7()).String(), Type: st.TaskType, Payload: d.Payload, Status: status.TaskPending,
				// No idempotency key: the run's transaction already
				// makes one task per step, and keys belong to producers.
				Priority: st.TaskPriority, RunAt: now,
				RetryDelay: st.RetryDelay, RunID: run.ID, Step: s.Name,
			}
			if st.RetriesSet {
				t.MaxAttempts = st.Retries + 1
			}
			ref := taskRef(t.ID, t.Type)
			s.Request = ref
			ch.tasks = append(ch.tasks, t)
			ch.events = append(ch.events, store.NewEvent{Type: "step_started", Step: s.Name, Data: store.EventJSON(ref)})
		case engine.StartSleep:
			wake := now.Add(d.Sleep)
			s.Status, s.WakeAt, s.StartedAt = status.StepSleeping, &wake, &now
			ch.queue = append(ch.queue, store.QueueItem{Kind: store.KindWake, RunID: run.ID, Step: s.Name, DueAt: wake})
			ch.events = append(ch.events, store.NewEvent{Type: "step_sleeping", Step: s.Name, Data: map[string]any{"wake_at": wake.UTC()}})
		case engine.StartWait:
			s.StartedAt = &now
			if s.Body != nil {
				// The callback arrived before the step started: it is
				// already satisfied.
				s.Status, s.FinishedAt = status.StepSuccess, &now
				ch.events = append(ch.events, store.NewEvent{Type: "step_succeeded", Step: s.Name, Data: map[string]any{"early_callback": true}})
				// The engine saw it as waiting; decide again.
				r.decide(def, run, steps, ch)
				return
			}
			s.Status = status.StepWaiting
			if d.Timeout > 0 {
				due := now.Add(d.Timeout)
				s.WakeAt = &due
				ch.queue = append(ch.queue, store.QueueItem{Kind: store.KindWaitTimeout, RunID: run.ID, Step: s.Name, DueAt: due})
			}
			ch.events = append(ch.events, store.NewEvent{Type: "step_waiting", Step: s.Name})
		}
		// The states the engine was given, with what it decided: what
		// the run's outcome is judged on.
		st := in.Steps[s.Name]
		st.Status, st.Blocked = s.Status, s.Blocked
		in.Steps[s.Name] = st
	}
	r.finishIfDone(def, run, in.Steps, ch)
}

// stateMaps are decide's maps of step states, reused: a map's slots were
// most of what deciding a small run allocated. decide and what it calls
// keep no reference to the map past its return.
var stateMaps = sync.Pool{New: func() any { return map[string]engine.StepState{} }}

// stepNamed is the step of steps called name, found in byName if it is
// not nil (a run of many steps), else by a walk (a map costs more than
// a walk of a few).
func stepNamed(steps []*store.StepRun, byName map[string]*store.StepRun, name string) *store.StepRun {
	if byName != nil {
		return byName[name]
	}
	for _, s := range steps {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// finishIfDone ends the run if states (its steps' statuses) say it is
// done.
func (r *Runtime) finishIfDone(def *spec.Workflow, run *store.Run, states map[string]engine.StepState, ch *changes) {
	out := engine.Evaluate(def, states)
	if !out.Done {
		return
	}
	now := ch.now
	run.Status, run.Error, run.FinishedAt = out.Status, out.Reason, &now
	ch.finished = true
	ch.events = append(ch.events, store.NewEvent{Type: runEndedType(out.Status), Data: store.EventJSON(runEndedData(out.Status, out.Reason))})
}

// advance applies decisions inside a run transaction.
func (r *Runtime) advance(ctx context.Context, tx store.RunTx, ch *changes) error {
	run := tx.Run()
	if status.RunTerminal(run.Status) {
		return r.flush(ctx, tx, run, ch)
	}
	def, err := r.Definition(ctx, run.WorkflowID, run.Version)
	if err != nil {
		return err
	}
	r.decide(def, run, tx.Steps(), ch)
	return r.flush(ctx, tx, run, ch)
}

func (r *Runtime) flush(ctx context.Context, tx store.RunTx, run *store.Run, ch *changes) error {
	for _, s := range ch.touched {
		if err := tx.UpdateStep(s); err != nil {
			return err
		}
	}
	if ch.finished {
		if err := tx.UpdateRun(run); err != nil {
			return err
		}
		if err := tx.DropQueue(); err != nil {
			return err
		}
		if ch.stopped {
			if err := tx.CancelTasks(stepTasks(tx.Steps())...); err != nil {
				return err
			}
		}
	} else {
		if err := tx.Enqueue(ch.queue...); err != nil {
			return err
		}
		for _, t := range ch.tasks {
			if ch.eager != nil {
				r.take(ctx, ch.eager, t, ch.now)
			}
			ch.offer.take(ctx, t, ch.now)
			if err := tx.CreateTask(t); err != nil {
				return err
			}
		}
	}
	return tx.Append(ch.events...)
}

// Cancel stops a run: pending and in-flight steps become cancelled, queued
// work is dropped and in-flight HTTP requests on this node are aborted (other
// nodes notice at their next lease renewal).
func (r *Runtime) Cancel(ctx context.Context, runID string) (*store.Run, error) {
	err := r.st.InRun(ctx, runID, r.clk.Now(), func(tx store.RunTx) error {
		now := tx.Now() // not before the run's last write
		run := tx.Run()
		if status.RunTerminal(run.Status) {
			return fmt.Errorf("run %s is %s: %w", runID, run.Status, ErrRunFinished)
		}
		ch := &changes{now: now, runID: runID}
		for _, s := range tx.Steps() {
			if !status.StepTerminal(s.Status) {
				s.Status, s.Error, s.FinishedAt = status.StepCancelled, "run cancelled", &now
				ch.touch(s)
			}
		}
		run.Status, run.Error, run.FinishedAt = status.RunCancelled, "cancelled by request", &now
		ch.finished, ch.stopped = true, true
		ch.events = append(ch.events, store.NewEvent{Type: "run_cancelled"})
		return r.flush(ctx, tx, run, ch)
	})
	if err != nil {
		return nil, err
	}
	r.abortRun(runID)
	run, _, err := r.st.GetRun(ctx, runID)
	return run, err
}

func (r *Runtime) abortRun(runID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cancel := range r.inflt[runID] {
		cancel()
	}
}

// DeliverWebhook records a callback payload for a wait_for_webhook step and
// advances the run. A payload that arrives before the step starts is kept and
// satisfies the step when it starts.
func (r *Runtime) DeliverWebhook(ctx context.Context, token string, payload []byte, headers map[string]string) error {
	runID, name, err := r.st.StepByToken(ctx, token)
	if err != nil {
		return err
	}
	if len(payload) == 0 {
		payload = []byte("null")
	}
	of := r.newOffer()
	err = r.st.InRun(ctx, runID, r.clk.Now(), func(tx store.RunTx) error {
		now := tx.Now() // not before the run's last write
		run := tx.Run()
		s := tx.Step(name)
		if s == nil {
			return fmt.Errorf("step %s: %w", name, store.ErrNotFound)
		}
		if s.Body != nil {
			return fmt.Errorf("step %s: %w", name, ErrAlreadyDelivered)
		}
		if status.StepTerminal(s.Status) {
			return fmt.Errorf("step %s is %s and no longer accepts callbacks: %w", name, s.Status, ErrStepFinished)
		}
		if status.RunTerminal(run.Status) {
			// The run's id stays out: the caller of a callback URL holds
			// a token, not the API key.
			return fmt.Errorf("step %s: its run is %s: %w", name, run.Status, ErrRunFinished)
		}
		// Past a deadline whose timer has not fired yet (a backlog, a
		// restart after downtime): the callback came too late, as it
		// would once the timer fired, whenever that is.
		if s.Status == status.StepWaiting && s.WakeAt != nil && !now.Before(*s.WakeAt) {
			return fmt.Errorf("step %s timed out at %s and no longer accepts callbacks: %w", name, s.WakeAt.UTC().Format(time.RFC3339), ErrStepFinished)
		}
		if pastExpiry(run, now) {
			// As once the expiry is applied: the run's unfinished steps
			// are cancelled, so the step no longer accepts a callback.
			return fmt.Errorf("step %s: its run exceeded max_duration at %s, and the step no longer accepts callbacks: %w", name, run.ExpiresAt.UTC().Format(time.RFC3339), ErrStepFinished)
		}
		ch := &changes{now: now, runID: runID, offer: of}
		s.Body, s.Headers = payload, headers
		ch.touch(s)
		ch.events = append(ch.events, store.NewEvent{Type: "webhook_received", Step: name})
		if s.Status == status.StepWaiting {
			s.Status, s.FinishedAt = status.StepSuccess, &now
			ch.events = append(ch.events, store.NewEvent{Type: "step_succeeded", Step: name})
		}
		return r.advance(ctx, tx, ch)
	})
	of.settle(err)
	return err
}

func jitter() float64 { return mrand.Float64() }

// stepTasks is the ids of the tasks steps started. A step starts once, and
// a task step's request names its task from then on (decide), whatever
// the step's status: a step that timed out may have left its task leased.
// So these are all of the run's tasks, and no index of tasks by run is
// needed to find them.
func stepTasks(steps []*store.StepRun) []string {
	var ids []string
	for _, s := range steps {
		if s.Type != string(spec.StepTask) || len(s.Request) == 0 {
			continue
		}
		var req struct {
			TaskID string `json:"task_id"`
		}
		if json.Unmarshal(s.Request, &req) == nil && req.TaskID != "" {
			ids = append(ids, req.TaskID)
		}
	}
	return ids
}
