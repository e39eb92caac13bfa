package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/jsonenc"
)

// Source hands out tasks and takes their reports. *client.Client (over
// HTTP) and *ferry.Engine (embedded, in the same process) satisfy it.
type Source interface {
	ClaimTasks(ctx context.Context, req client.ClaimRequest) ([]client.ClaimedTask, error)
	Heartbeat(ctx context.Context, id, token string, lease time.Duration) (client.HeartbeatResult, error)
	CompleteTask(ctx context.Context, id, token string, result any) error
	FailTask(ctx context.Context, id, token, msg string, retryable bool) error
}

// EagerSource is a Source that can complete a task and hand the worker, in
// the same call, the tasks the completion starts (the run's next steps):
// eager dispatch. *client.Client and *ferry.Engine satisfy it.
type EagerSource interface {
	CompleteTaskAndClaim(ctx context.Context, id, token string, result any, next client.ClaimRequest) ([]client.ClaimedTask, error)
}

// Config configures a Worker. Zero fields take the defaults noted.
type Config struct {
	// Types lists the exact types ("billing.invoice.v1") and prefixes
	// ("billing.%") to claim. Empty means the types given to Handle.
	Types []string
	// Concurrency bounds the tasks held at once (default 1).
	Concurrency int
	// Lease is how long a task is held without a heartbeat (default 30s,
	// from 1s to 1h, the protocol's bounds). Heartbeats are sent every
	// Lease/3.
	Lease time.Duration
	// WorkerID names the worker in the tasks' events (default
	// hostname-pid).
	WorkerID string
	// PollWait is how long a claim long-polls when nothing is ready
	// (default 30s, at most 60s).
	PollWait time.Duration
	// ShutdownTimeout is how long in-flight handlers may keep running after
	// Run's context ends before their own context is cancelled (default
	// 30s).
	ShutdownTimeout time.Duration
	// Logger receives the worker's logs (default slog.Default()).
	Logger *slog.Logger
	// Prefetch lets a claim take up to this many tasks beyond the free
	// slots; they wait in memory for a slot. Fewer, larger claims help when
	// handlers are quick. A prefetched task's lease runs while it waits, so
	// keep Prefetch well below what the handlers finish in a lease: one
	// that waited half a lease or more is sent a heartbeat before its
	// handler starts, and dropped, unrun, if its lease has been lost
	// meanwhile. Default 0 (claim only for free slots).
	Prefetch int
	// NoEager turns off eager dispatch. By default, when the Source is an
	// EagerSource, a completion asks for the next step of the same run if
	// its type is one this worker claims, and runs it in the slot the
	// completed task held: no claim round trip between the steps. Tasks
	// taken this way skip the queue's priority order.
	NoEager bool
	// NoBatch turns off batched completions. By default, when the Source
	// is a BatchSource (*client.Client), completions of handlers that
	// finish while 32 completion requests are in flight (fewer for a
	// worker of more than 256 handlers, down to 4) wait and go together
	// in the next request, up to 100 a request; each is still
	// answered on its own. A completion finds a request free at once
	// unless the worker finishes tasks faster than it can report them one
	// by one.
	NoBatch bool
	// TracerProvider makes a span for each task's handler ("ferry.task
	// <type>", a consumer span), whose context the handler's ctx carries.
	// Its parent is the task's run's trace context when the server sent
	// one (it does while it traces: Task.Traceparent), so the span joins
	// the run's trace. Default: OpenTelemetry's global provider, which
	// makes nothing until the application sets one.
	TracerProvider trace.TracerProvider
}

// Context causes of a handler's cancellation (see context.Cause). A lost
// lease has a cause matching client.ErrLeaseLost.
var (
	// ErrTaskCancelled: the task was cancelled on the server.
	ErrTaskCancelled = errors.New("worker: task cancelled")
	// ErrShutdown: the worker is shutting down and ShutdownTimeout passed.
	ErrShutdown = errors.New("worker: shutdown timeout passed")
)

// Task is a task handed to a handler.
type Task struct {
	ID      string
	Type    string
	Payload json.RawMessage
	// Attempt counts from 1; MaxAttempts is the last one.
	Attempt     int
	MaxAttempts int
	// RunID and Step name the workflow step that owns the task, if any.
	RunID string
	Step  string
	// Traceparent is the W3C trace context of the task's run as the
	// server sent it (while it traces; empty otherwise, and for standalone
	// tasks). The handler's ctx carries the task's own span, a child of
	// it (Config.TracerProvider): propagate from ctx, so that what the
	// handler calls is that span's child.
	Traceparent string
}

// Decode unmarshals the task's JSON payload into v.
func (t *Task) Decode(v any) error {
	p := t.Payload
	if len(p) == 0 {
		p = json.RawMessage("{}")
	}
	if err := json.Unmarshal(p, v); err != nil {
		return fmt.Errorf("task %s: decode %s payload: %w", t.ID, t.Type, err)
	}
	return nil
}

// HandlerFunc does a task's work. Its result (any JSON-encodable value; a
// json.RawMessage is kept as is) completes the task; an error fails the
// attempt. ctx is cancelled when the task is cancelled, its lease is lost or
// the shutdown timeout passes.
type HandlerFunc func(ctx context.Context, t *Task) (any, error)

// NonRetryable marks err as permanent: the task fails without further
// attempts. NonRetryable(nil) is nil.
func NonRetryable(err error) error {
	if err == nil {
		return nil
	}
	return &nonRetryable{err}
}

// IsNonRetryable reports whether err is, or wraps, an error marked with
// NonRetryable.
func IsNonRetryable(err error) bool {
	var nr *nonRetryable
	return errors.As(err, &nr)
}

type nonRetryable struct{ err error }

func (e *nonRetryable) Error() string { return e.err.Error() }
func (e *nonRetryable) Unwrap() error { return e.err }

// Worker pulls tasks from a Source and runs their handlers.
type Worker struct {
	src    Source
	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer

	mu       sync.Mutex
	handlers map[string]registered
	running  bool
	// reporting counts the reports being sent (their handlers returned):
	// at the shutdown deadline, the tasks still held are these as well
	// as handlers still running, and the error says which.
	reporting atomic.Int64
}

// registered is a handler and the name of its spans, made once: building
// the name for each task was a third of what tracing cost a task while
// nothing was kept.
type registered struct {
	h    HandlerFunc
	span string
}

// reporters are a Run's completers when the source is a BatchSource (nil
// otherwise): with and without eager dispatch.
type reporters struct {
	eager, plain *completer
	// beats ends with Run: the heartbeats of handlers it abandoned stop,
	// so that their tasks' leases expire.
	beats context.Context
	// pool runs the Run's tasks (startInSlot).
	pool *handlerPool
}

// eagerNext is what a completion asks for with eager dispatch: one next
// task of the types the worker claims now (Handle may add some while it
// runs).
func (w *Worker) eagerNext() *client.ClaimRequest {
	return &client.ClaimRequest{Types: w.claimTypes(), WorkerID: w.cfg.WorkerID, Lease: w.cfg.Lease, Max: 1}
}

// Tunables of the loop.
const (
	maxClaim        = 100 // the protocol's cap on one claim
	maxClaimTypes   = 100 // and on the types it lists
	maxWorkerID     = 255 // and on a worker's id
	maxTypeLen      = 255 // and on a type's length
	maxPollWait     = 60 * time.Second
	claimBackoffMin = 100 * time.Millisecond
	claimBackoffMax = 5 * time.Second
	reportAttempts  = 5
	reportTimeout   = 10 * time.Second
	// abandonGrace is how long Run still waits for handlers after it
	// cancelled their context at the shutdown timeout.
	abandonGrace = 5 * time.Second
	maxErrorLen  = 8 << 10
)

// New returns a worker on src. Register handlers with Handle, then call Run.
func New(src Source, cfg Config) *Worker {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	cfg.Prefetch = max(cfg.Prefetch, 0)
	if cfg.WorkerID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "worker"
		}
		cfg.WorkerID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if cfg.PollWait <= 0 {
		cfg.PollWait = 30 * time.Second
	}
	cfg.PollWait = min(cfg.PollWait, maxPollWait)
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Types = slices.Clone(cfg.Types)
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	return &Worker{src: src, cfg: cfg, log: cfg.Logger.With("worker_id", cfg.WorkerID), handlers: map[string]registered{},
		tracer: cfg.TracerProvider.Tracer(tracerName)}
}

// ID is the worker's id, as the tasks' events record it.
func (w *Worker) ID() string { return w.cfg.WorkerID }

// Handle registers h for tasks of exactly type typ, replacing an earlier
// handler. When Config.Types is empty, typ is also claimed.
func (w *Worker) Handle(typ string, h HandlerFunc) {
	if typ == "" || strings.Contains(typ, "%") || h == nil {
		panic(fmt.Sprintf("worker: Handle(%q): need an exact type and a handler", typ))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handlers[typ] = registered{h: h, span: "ferry.task " + typ}
}

func (w *Worker) handler(typ string) registered {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.handlers[typ]
}

// claimTypes is what to ask for: Config.Types, else the handled types.
func (w *Worker) claimTypes() []string {
	if len(w.cfg.Types) > 0 {
		return w.cfg.Types
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.handlers))
	for t := range w.handlers {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// Run claims and handles tasks until ctx ends, then shuts down gracefully:
// it stops claiming at once, waits for in-flight handlers up to
// Config.ShutdownTimeout, cancels the context of those still running,
// reports every outcome and returns. It returns nil after a shutdown in
// which every handler returned, or an error when the configuration is
// unusable, when the server refuses the API key (a 401 to a claim: the
// worker then shuts down as at the end of ctx, and the error holds the
// *client.APIError), or when a handler ignored its cancelled context (its
// task is then abandoned: its lease expires and it is handed out again).
func (w *Worker) Run(ctx context.Context) error {
	if err := w.check(); err != nil {
		return err
	}
	w.mu.Lock()
	if w.running {
		w.mu.Unlock()
		return errors.New("worker: Run is already running")
	}
	w.running = true
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.running = false
		w.mu.Unlock()
	}()

	// Handlers outlive ctx: their context ends only at the shutdown
	// deadline.
	hctx, hardStop := context.WithCancelCause(context.WithoutCancel(ctx))
	defer hardStop(nil)
	var (
		wg       sync.WaitGroup
		inflight = make(chan struct{}, w.cfg.Concurrency) // a slot per held task
	)
	// This run's completers: handlers a run abandoned at its shutdown
	// deadline may still report through theirs while a later Run starts.
	beats, stopBeats := context.WithCancel(context.Background())
	defer stopBeats()
	rep := reporters{beats: beats, pool: newHandlerPool()}
	defer rep.pool.close()
	if bs, ok := w.src.(BatchSource); ok && !w.cfg.NoBatch {
		limit := reportsInFlight(w.cfg.Concurrency)
		rep.plain = &completer{src: bs, limit: limit, single: func(ctx context.Context, c client.Completion) ([]client.ClaimedTask, error) {
			return nil, w.src.CompleteTask(ctx, c.ID, c.LeaseToken, c.Result)
		}}
		if es, ok := w.src.(EagerSource); ok && !w.cfg.NoEager {
			rep.eager = &completer{src: bs, limit: limit, next: w.eagerNext, single: func(ctx context.Context, c client.Completion) ([]client.ClaimedTask, error) {
				return es.CompleteTaskAndClaim(ctx, c.ID, c.LeaseToken, c.Result, *w.eagerNext())
			}}
		}
	}
	w.log.Info("worker started", "types", w.claimTypes(), "concurrency", w.cfg.Concurrency, "lease", w.cfg.Lease)
	refused := w.claimLoop(ctx, hctx, inflight, &wg, rep)

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if n := len(inflight); n > 0 {
		w.log.Info("worker stopping: waiting for in-flight handlers", "in_flight", n, "timeout", w.cfg.ShutdownTimeout)
	}
	deadline := time.NewTimer(w.cfg.ShutdownTimeout)
	defer deadline.Stop()
	select {
	case <-done:
		w.log.Info("worker stopped")
		return refused
	case <-deadline.C:
	}
	hardStop(ErrShutdown)
	w.log.Warn("shutdown timeout passed: in-flight handlers cancelled", "in_flight", len(inflight))
	grace := time.NewTimer(abandonGrace)
	defer grace.Stop()
	select {
	case <-done:
		w.log.Info("worker stopped")
		return refused
	case <-grace.C:
		n := len(inflight)
		sending := min(int(w.reporting.Load()), n)
		if running := n - sending; running > 0 {
			w.log.Error("handlers ignored their cancelled context; abandoning their tasks", "in_flight", running)
			refused = errors.Join(refused, fmt.Errorf("worker: %d handler(s) still running %s after their context was cancelled; their tasks were abandoned", running, abandonGrace))
		}
		if sending > 0 {
			// Their handlers returned; the server did not take their
			// outcomes (unreachable, or answering 5xx).
			w.log.Error("outcomes not reported by the shutdown deadline; abandoning their tasks", "in_flight", sending)
			refused = errors.Join(refused, fmt.Errorf("worker: %d finished task(s) whose outcome could not be reported by the shutdown deadline; their tasks were abandoned (handed out again when their leases expire)", sending))
		}
		return refused
	}
}

func (w *Worker) check() error {
	if w.cfg.Lease < time.Second || w.cfg.Lease > time.Hour {
		return fmt.Errorf("worker: Lease %s is outside the protocol's 1s to 1h", w.cfg.Lease)
	}
	for _, t := range w.cfg.Types {
		switch {
		case t == "" || strings.Contains(strings.TrimSuffix(t, "%"), "%"):
			return fmt.Errorf("worker: type %q: use an exact type or a prefix ending in %%", t)
		case len(t) > maxTypeLen+1 || !utf8.ValidString(t) || strings.IndexByte(t, 0) >= 0:
			return fmt.Errorf("worker: type %.40q…: a type is UTF-8 text without NUL of at most %d bytes", t, maxTypeLen)
		}
	}
	switch n := len(w.claimTypes()); {
	case n == 0:
		return errors.New("worker: nothing to claim: set Config.Types or register a handler with Handle")
	case n > maxClaimTypes:
		return fmt.Errorf("worker: %d types to claim, more than a claim may list (%d)", n, maxClaimTypes)
	}
	if len(w.cfg.WorkerID) > maxWorkerID || !utf8.ValidString(w.cfg.WorkerID) || strings.IndexByte(w.cfg.WorkerID, 0) >= 0 {
		return fmt.Errorf("worker: WorkerID must be UTF-8 text without NUL of at most %d bytes", maxWorkerID)
	}
	return nil
}

// claimLoop claims while ctx lives, never holding more tasks than there are
// slots in inflight. Claim errors back off (jittered, doubling up to 5s).
//
// It returns an error, and the worker stops as it does at the end of its
// context, when the server refuses the API key (401): no later claim can
// succeed, and backing off for ever only logged warnings while the
// worker looked up.
func (w *Worker) claimLoop(ctx, hctx context.Context, inflight chan struct{}, wg *sync.WaitGroup, rep reporters) error {
	backoff := time.Duration(0)
	for ctx.Err() == nil {
		// Wait for a free slot, then take every other free one.
		select {
		case inflight <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		if ctx.Err() != nil { // both were ready
			<-inflight
			return nil
		}
		n := 1
	more:
		for n < maxClaim {
			select {
			case inflight <- struct{}{}:
				n++
			default:
				break more
			}
		}
		polled := time.Now()
		tasks, err := w.src.ClaimTasks(ctx, client.ClaimRequest{
			Types: w.claimTypes(), WorkerID: w.cfg.WorkerID, Lease: w.cfg.Lease, Max: min(n+w.cfg.Prefetch, maxClaim), Wait: w.cfg.PollWait,
		})
		// The leases began during the claim: a long-poll returns as soon
		// as it has claimed, so about now.
		claimed := time.Now()
		if err != nil {
			tasks = nil
		}
		for i := len(tasks); i < n; i++ {
			<-inflight // give back the unused slots
		}
		for i, ct := range tasks {
			if i >= n { // more than asked for: wait for a slot
				select {
				case inflight <- struct{}{}:
				case <-ctx.Done():
					// Shutting down: the rest start as slots free up, in
					// the background, so that the shutdown timer runs.
					w.startLater(ctx, hctx, tasks[i:], claimed, inflight, wg, rep)
					return nil
				}
			}
			w.startInSlot(ctx, hctx, ct, claimed, inflight, wg, rep)
		}
		var d time.Duration
		var ae *client.APIError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &ae) && ae.StatusCode == http.StatusUnauthorized:
			w.log.Error("the server refused the API key; the worker stops", "err", err)
			return fmt.Errorf("worker: the server refused the API key: %w", err)
		case err == nil && (len(tasks) > 0 || claimed.Sub(polled) >= w.cfg.PollWait/2):
			backoff = 0
			continue
		case err == nil:
			// An empty answer long before the poll's wait: a source that
			// does not long-poll must not be hammered.
			d = jitter(claimBackoffMin)
		default:
			backoff = min(max(2*backoff, claimBackoffMin), claimBackoffMax)
			d = jitter(backoff)
			w.log.Warn("claim failed; backing off", "err", err, "retry_in", d)
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
	return nil
}

// startLater starts prefetched tasks as slots free up, until the
// handlers' context ends (the rest are left to their leases).
func (w *Worker) startLater(ctx, hctx context.Context, tasks []client.ClaimedTask, claimed time.Time, inflight chan struct{}, wg *sync.WaitGroup, rep reporters) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, ct := range tasks {
			select {
			case inflight <- struct{}{}:
			case <-hctx.Done():
				return
			}
			w.startInSlot(ctx, hctx, ct, claimed, inflight, wg, rep)
		}
	}()
}

// startInSlot runs ct (and the tasks its eager completions hand over) in
// the slot it holds, which it gives back when done.
func (w *Worker) startInSlot(ctx, hctx context.Context, ct client.ClaimedTask, claimed time.Time, inflight chan struct{}, wg *sync.WaitGroup, rep reporters) {
	wg.Add(1)
	rep.pool.run(func() {
		defer wg.Done()
		defer func() { <-inflight }()
		w.executeChain(ctx, hctx, ct, claimed, rep)
	})
}

// jitter spreads d over [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// executeChain runs a claimed task and then, in the same slot, the tasks
// its completion handed over (eager dispatch) while the worker runs.
func (w *Worker) executeChain(ctx, hctx context.Context, ct client.ClaimedTask, claimed time.Time, rep reporters) {
	// Each task with the time it was handed over: one that waits behind
	// another of the same hand-over (a source answering more than asked)
	// has its lease running from its own hand-over, not from when the one
	// before it finished, so that stillHeld checks it once half of it
	// has passed.
	type handed struct {
		ct client.ClaimedTask
		at time.Time
	}
	next := []handed{{ct, claimed}}
	for len(next) > 0 {
		h := next[0]
		next = next[1:]
		more := w.execute(ctx, hctx, h.ct, h.at, rep)
		now := time.Now()
		for _, m := range more {
			next = append(next, handed{m, now})
		}
	}
}

// execute runs one claimed task's handler under heartbeats and reports the
// outcome; it returns the tasks an eager completion handed over. Once ctx
// (the worker's run) ends it asks for none.
func (w *Worker) execute(ctx, hctx context.Context, ct client.ClaimedTask, claimed time.Time, rep reporters) []client.ClaimedTask {
	log := taskLog{w.log, ct.ID, ct.Type, ct.Attempt}
	reg := w.handler(ct.Type)
	h := reg.h
	if h == nil {
		msg := fmt.Sprintf("no handler for type %s", ct.Type)
		log.get().Error("failing task: " + msg)
		w.report(log, "fail", func(ctx context.Context) error {
			return w.src.FailTask(ctx, ct.ID, ct.LeaseToken, msg, false)
		})
		return nil
	}
	if hctx.Err() != nil {
		// Past the shutdown timeout (a task an eager completion handed
		// over late, or one prefetched): its handler would start
		// cancelled and burn an attempt. Left to its lease.
		log.get().Info("not starting a task after the shutdown timeout")
		return nil
	}
	// hctx, not ctx: a prefetched task still starts once shutdown has
	// begun, and its check must not fail for that.
	claimed, ok := w.stillHeld(hctx, log, ct, claimed)
	if !ok {
		return nil
	}
	tctx, cancel := context.WithCancelCause(hctx) // the handler's; ctx is the worker's run
	defer cancel(nil)
	hb := w.heartbeat(rep.beats, log, ct, claimed, cancel)
	t := &Task{ID: ct.ID, Type: ct.Type, Payload: ct.Payload, Attempt: ct.Attempt, MaxAttempts: ct.MaxAttempts, RunID: ct.RunID, Step: ct.Step, Traceparent: ct.Traceparent}
	start := time.Now()
	sctx, span := w.span(tctx, reg.span, ct)
	raw, err := w.call(sctx, log, h, t)
	if reason := hb.stop(); reason != nil {
		endSpan(span, "the outcome is dropped: "+reason.Error())
		log.get().Info("dropping the handler's outcome", "reason", reason, "handler_err", err)
		return nil
	}
	if err == nil {
		endSpan(span, "")
		if w.log.Enabled(ctx, slog.LevelDebug) {
			log.get().Debug("task handled", "duration", time.Since(start))
		}
		c := client.Completion{ID: ct.ID, LeaseToken: ct.LeaseToken, Result: json.RawMessage(raw)}
		es, eager := w.src.(EagerSource)
		if !eager || w.cfg.NoEager || ctx.Err() != nil {
			err := w.report(log, "complete", func(ctx context.Context) error {
				if rep.plain != nil {
					_, err := rep.plain.complete(ctx, c)
					return err
				}
				return w.src.CompleteTask(ctx, ct.ID, ct.LeaseToken, c.Result)
			})
			w.failRefused(log, ct, err)
			return nil
		}
		// A retried report after one that committed is refused as
		// finished: a task it was handed is then lost to this worker
		// and handed out again when its lease ends.
		var next []client.ClaimedTask
		err := w.report(log, "complete", func(rctx context.Context) error {
			var err error
			if rep.eager != nil {
				next, err = rep.eager.complete(rctx, c)
				return err
			}
			next, err = es.CompleteTaskAndClaim(rctx, ct.ID, ct.LeaseToken, c.Result, *w.eagerNext())
			return err
		})
		w.failRefused(log, ct, err)
		return next
	}
	retryable := !IsNonRetryable(err)
	msg := errorText(err)
	endSpan(span, msg)
	log.get().Info("task attempt failed", "err", msg, "retryable", retryable, "duration", time.Since(start))
	w.report(log, "fail", func(ctx context.Context) error {
		return w.src.FailTask(ctx, ct.ID, ct.LeaseToken, msg, retryable)
	})
	return nil
}

// errorText is a failed attempt's error as reported: at most maxErrorLen
// bytes, never empty, UTF-8 without NUL (the server stores it as text and
// refuses NUL).
func errorText(err error) string {
	msg := strings.ToValidUTF8(strings.ReplaceAll(err.Error(), "\x00", "\uFFFD"), "\uFFFD")
	if msg == "" {
		msg = "handler failed"
	}
	if len(msg) > maxErrorLen {
		msg = strings.ToValidUTF8(msg[:maxErrorLen], "") + "…"
	}
	return msg
}

// stillHeld checks, before a task's handler starts, that a task claimed
// half a lease ago or more is still this worker's: a prefetched task's
// lease runs while it waits for a slot, and once it has run out another
// worker may hold the task, whose handler would then run twice. A
// heartbeat answers: the task is dropped, unrun, if it was taken, finished
// or cancelled, or if ctx (the handlers' context) has ended; on success
// its lease counts from the heartbeat. When the heartbeat fails for
// another reason (the server unreachable), the handler runs as before and
// its heartbeats decide, the lease still counting from the claim.
func (w *Worker) stillHeld(ctx context.Context, log taskLog, ct client.ClaimedTask, claimed time.Time) (time.Time, bool) {
	if time.Since(claimed) < w.cfg.Lease/2 {
		return claimed, true
	}
	sent := time.Now()
	hctx, cancel := context.WithTimeout(ctx, w.cfg.Lease/3)
	res, err := w.src.Heartbeat(hctx, ct.ID, ct.LeaseToken, w.cfg.Lease)
	cancel()
	switch reason := lostBy(res, err); {
	case reason != nil:
		log.get().Info("dropping a task that waited for a slot", "reason", reason)
		return claimed, false
	case err == nil:
		return sent, true
	case ctx.Err() != nil:
		return claimed, false // the handlers' context ended: it would not run
	}
	return claimed, true
}

// lostBy is why a heartbeat's answer says the task is no longer this
// worker's to run (cancelled, its lease taken, or finished), or nil.
func lostBy(res client.HeartbeatResult, err error) error {
	switch {
	case err == nil && res.CancelRequested:
		return ErrTaskCancelled
	case errors.Is(err, client.ErrLeaseLost):
		return err
	case errors.Is(err, client.ErrTaskFinished):
		// The server finished it (a final attempt whose lease ran out):
		// to the handler, the lease is lost.
		return fmt.Errorf("%w: %w", client.ErrLeaseLost, err)
	}
	return nil
}

// tracerName is the instrumentation scope of the worker's spans.
const tracerName = "github.com/ferryhq/ferry/worker"

// The options of a handler's span, made once rather than for each task:
// a child of the run's trace context, or a new root when it has none.
var (
	childSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	rootSpan  = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithNewRoot()}
)

// span starts the span of a task's handler: a child of the task's run's
// trace context when the server sent one, else a root (not a child of
// whatever span Run's context holds: a long-lived worker's tasks would all
// hang from it).
func (w *Worker) span(ctx context.Context, name string, ct client.ClaimedTask) (context.Context, trace.Span) {
	opts := rootSpan
	// Extracted apart from ctx: a malformed traceparent must not leave
	// Run's own span as the parent.
	var run trace.SpanContext
	if ct.Traceparent != "" {
		run = trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": ct.Traceparent}))
	}
	if run.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, run)
		opts = childSpan
	}
	ctx, span := w.tracer.Start(ctx, name, opts...)
	if span.IsRecording() { // the attributes cost nothing when no span is kept
		span.SetAttributes(
			attribute.String("ferry.task.id", ct.ID),
			attribute.String("ferry.task.type", ct.Type),
			attribute.Int("ferry.task.attempt", ct.Attempt),
		)
		if ct.RunID != "" {
			span.SetAttributes(attribute.String("ferry.run.id", ct.RunID), attribute.String("ferry.step.name", ct.Step))
		}
	}
	return ctx, span
}

// endSpan ends a handler's span once its outcome is decided: failed with
// msg (the attempt's error as reported, or why the outcome was dropped),
// or, with msg empty, done.
func endSpan(span trace.Span, msg string) {
	if msg != "" {
		span.SetStatus(codes.Error, msg)
	}
	span.End()
}

// call runs the handler and encodes its result, turning a panic in
// either (a result's MarshalJSON is the handler's code too) into a
// (retryable) error.
func (w *Worker) call(ctx context.Context, log taskLog, h HandlerFunc, t *Task) (raw []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			log.get().Error("handler panicked", "panic", p, "stack", string(debug.Stack()))
			raw, err = nil, fmt.Errorf("panic: %v", p)
		}
	}()
	res, err := h(ctx, t)
	if err != nil {
		return nil, err
	}
	if raw, err = jsonenc.Marshal(res); err != nil { // json.Marshal's bytes; validates a json.RawMessage too
		return nil, NonRetryable(fmt.Errorf("encode the handler's result: %w", err))
	}
	// What the server would refuse, refused here as the attempt's final
	// failure: sent, it was dropped as a refused report, the task went
	// back after its lease, and the handler ran again for nothing.
	switch {
	case !utf8.Valid(raw):
		return nil, NonRetryable(errors.New("the handler's result holds bytes that are not UTF-8: a task's result is JSON text"))
	case len(raw) > maxResult:
		return nil, NonRetryable(fmt.Errorf("the handler's result is %d bytes, more than a task's result may take (%d)", len(raw), maxResult))
	}
	return raw, nil
}

// maxResult is the most a handler's result may take: a completion's
// request body is at most client.MaxTaskBody, its result and the rest
// (the lease token, and with eager dispatch what it claims next, up to
// 100 types of 255 bytes) together.
const maxResult = client.MaxTaskBody - 32<<10

// refused says a report was refused for what it carries (its result: not
// JSON text, too large), not for the task's state: retrying it would be
// refused again, so the attempt is failed instead.
func refused(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && (ae.StatusCode == http.StatusBadRequest || ae.StatusCode == http.StatusRequestEntityTooLarge)
}

// taskLog is a task's logger, made when something is logged: With
// formats its attributes at once, for every task, and most log nothing.
type taskLog struct {
	base    *slog.Logger
	id, typ string
	attempt int
}

func (l taskLog) get() *slog.Logger {
	return l.base.With("task_id", l.id, "type", l.typ, "attempt", l.attempt)
}

// beat is a task's heartbeats: none runs until the first is due, so a
// handler that returns sooner (most do, by far) costs a timer, not a
// goroutine, a context and a channel.
type beat struct {
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	cancel  context.CancelFunc // ends the heartbeat loop, once it started
	done    chan struct{}      // closed when the loop has ended
	reason  error              // why the handler was cancelled; read after done
}

// stop ends the heartbeats and returns why the handler's outcome must be
// dropped (the task was cancelled or its lease lost), or nil.
func (b *beat) stop() error {
	b.mu.Lock()
	b.stopped = true
	b.timer.Stop()
	cancel, done := b.cancel, b.done
	b.mu.Unlock()
	if cancel == nil {
		return nil // the loop never started
	}
	cancel()
	<-done
	return b.reason
}

// heartbeat extends the lease every Lease/3 until stopped. When the task was
// cancelled or the lease is lost it cancels the handler (cancelHandler) and
// ends. A heartbeat that fails for another reason is retried; once no
// heartbeat succeeded for a whole lease, the lease is taken as lost.
func (w *Worker) heartbeat(run context.Context, log taskLog, ct client.ClaimedTask, claimed time.Time, cancelHandler context.CancelCauseFunc) *beat {
	b := &beat{}
	lease := w.cfg.Lease
	interval := lease / 3
	b.mu.Lock() // the timer may fire before b.timer is set
	defer b.mu.Unlock()
	b.timer = time.AfterFunc(interval, func() {
		b.mu.Lock()
		if b.stopped {
			b.mu.Unlock()
			return
		}
		ctx, cancel := context.WithCancel(run)
		b.cancel, b.done = cancel, make(chan struct{})
		b.mu.Unlock()
		defer close(b.done)
		w.beatLoop(ctx, log, ct, claimed, cancelHandler, b)
	})
	return b
}

// beatLoop sends a task's heartbeats, the first at once, until ctx ends or
// the handler is cancelled (b.reason).
func (w *Worker) beatLoop(ctx context.Context, log taskLog, ct client.ClaimedTask, claimed time.Time, cancelHandler context.CancelCauseFunc, b *beat) {
	lease := w.cfg.Lease
	interval := lease / 3
	// The lease is held until about lease after the claim, then until
	// lease after the last successful heartbeat was sent.
	validUntil := claimed.Add(lease)
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		sent := time.Now()
		cctx, ccancel := context.WithTimeout(ctx, interval)
		res, err := w.src.Heartbeat(cctx, ct.ID, ct.LeaseToken, lease)
		ccancel()
		if ctx.Err() != nil {
			return // stopped: the handler returned
		}
		switch reason := lostBy(res, err); {
		case reason != nil:
			b.reason = reason
		case err == nil:
			validUntil = sent.Add(lease)
		case !time.Now().Before(validUntil):
			b.reason = fmt.Errorf("%w: no heartbeat succeeded for %s (last error: %v)", client.ErrLeaseLost, lease, err)
		default:
			log.get().Warn("heartbeat failed; retrying", "err", err)
		}
		if b.reason != nil {
			log.get().Info("cancelling the handler", "reason", b.reason)
			cancelHandler(b.reason)
			return
		}
		next := interval
		if err != nil { // retry sooner, while the lease still holds
			next = max(min(interval, time.Until(validUntil)/2), 10*time.Millisecond)
		}
		if t == nil {
			t = time.NewTimer(next)
		} else {
			t.Reset(next)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// report sends a completion or failure, retrying transient failures
// (network errors, 5xx) with backoff on a fresh context: the outcome of a
// handler that finished during shutdown is still reported. It retries for
// as long as a lease lasts, at least reportAttempts times: the task is
// this worker's until then (heartbeats stopped with the handler), and a
// server restarting for a few seconds otherwise cost every completion
// reported meanwhile, and their handlers ran again after the lease.
func (w *Worker) report(log taskLog, what string, send func(ctx context.Context) error) error {
	w.reporting.Add(1)
	defer w.reporting.Add(-1)
	delay := claimBackoffMin
	start := time.Now()
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
		err := send(ctx)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, client.ErrLeaseLost), errors.Is(err, client.ErrTaskFinished):
			log.get().Info("report refused; the task moved on without this worker", "report", what, "err", err)
			return nil
		case what == "complete" && refused(err):
			return err // failRefused takes it from here
		case !transient(err) || (attempt >= reportAttempts && time.Since(start) >= w.cfg.Lease):
			log.get().Error("report failed; the task will be handed out again when its lease expires", "report", what, "err", err, "attempts", attempt)
			return err
		}
		d := jitter(delay)
		log.get().Warn("report failed; retrying", "report", what, "err", err, "retry_in", d)
		time.Sleep(d)
		delay = min(2*delay, claimBackoffMax)
	}
}

// failRefused fails, as final, a task whose completion the server refused
// for its result (err, from report): a result the server cannot take
// would be refused again on every attempt, the handler run again after
// each lease for nothing.
func (w *Worker) failRefused(log taskLog, ct client.ClaimedTask, err error) {
	if err == nil || !refused(err) {
		return
	}
	msg := errorText(fmt.Errorf("the server refused the handler's result: %w", err))
	log.get().Error("completion refused for its result; failing the task", "err", err)
	w.report(log, "fail", func(ctx context.Context) error {
		return w.src.FailTask(ctx, ct.ID, ct.LeaseToken, msg, false)
	})
}

// transient: worth retrying (no answer, or a server-side failure).
func transient(err error) bool {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae.StatusCode >= 500 || ae.StatusCode == 429 || ae.StatusCode == 408
	}
	return true
}
