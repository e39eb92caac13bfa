package runtime

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// Task errors callers branch on.
var (
	// ErrStaleLease: the lease token is not the task's current one (the
	// lease expired and the task was claimed again, or the attempt was
	// failed and retried). The holder of a finished task gets ErrTaskFinished.
	ErrStaleLease = errors.New("stale lease token")
	// ErrTaskFinished: the task already succeeded, failed or was cancelled.
	ErrTaskFinished = errors.New("task already finished")
	// ErrInvalidTask: a request to create a task is malformed.
	ErrInvalidTask = errors.New("invalid task")
)

// Task defaults, following the durable-inbox design: attempt² × base delay
// with up to 10% jitter.
const (
	DefaultTaskMaxAttempts = 5
	DefaultTaskRetryDelay  = time.Minute
	MaxTaskRetryDelay      = 24 * time.Hour
	MaxClaimWait           = 60 * time.Second
)

// MaxRunAt is the latest run_at a task may have: the end of the year 9999
// in UTC. An API time is RFC 3339, four digits of year, so a later one
// could not be shown (9999-12-31 with a negative offset is one); far
// later, past the int64 microseconds the stores keep, it would wrap into
// the past and be due at once.
var MaxRunAt = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)

// taskSignal is one wake-up of the waiting claims: ch is closed when it
// happens, after at and next are set.
type taskSignal struct {
	ch chan struct{}
	// at, when not zero, says the tasks become claimable only then (all
	// scheduled ahead): a claim then waits until at, not reading now, if
	// they may be of its types (types; nil: any).
	at    time.Time
	types []string
	// next is the signal after this one, which such a claim waits on:
	// not the current one, which may have passed a wake-up by.
	next *taskSignal
}

// matchesAny tells whether a claim of patterns may take a task of one of
// types (none given: any).
func matchesAny(patterns, types []string) bool {
	if len(types) == 0 {
		return true
	}
	return slices.ContainsFunc(types, func(t string) bool { return matchesType(patterns, t) })
}

// tasksReady wakes every waiting claim: tasks may have become claimable.
func (r *Runtime) tasksReady() { r.tasksReadyAt(time.Time{}, nil) }

// tasksReadyAt wakes every waiting claim for tasks of types (nil: any)
// claimable from at (zero: now, or not known).
func (r *Runtime) tasksReadyAt(at time.Time, types []string) {
	r.taskMu.Lock()
	old := r.taskSig
	r.taskSig = &taskSignal{ch: make(chan struct{})}
	old.at, old.types, old.next = at, types, r.taskSig
	close(old.ch)
	r.taskMu.Unlock()
}

func (r *Runtime) taskSignal() *taskSignal {
	r.taskMu.Lock()
	defer r.taskMu.Unlock()
	return r.taskSig
}

// NewTask is a standalone task to create.
type NewTask struct {
	Type           string
	Payload        json.RawMessage
	Priority       *int
	RunAt          *time.Time
	IdempotencyKey string
	MaxAttempts    int
	RetryDelay     time.Duration
}

// CreateTask records a standalone intent; a repeated idempotency key returns
// the first task and created=false.
func (r *Runtime) CreateTask(ctx context.Context, nt NewTask) (*store.Task, bool, error) {
	if !spec.ValidTaskType(nt.Type) {
		return nil, false, fmt.Errorf("type %q must be a versioned name like billing.invoice.v1: %w", nt.Type, ErrInvalidTask)
	}
	if nt.MaxAttempts < 0 || nt.MaxAttempts > 100 {
		return nil, false, fmt.Errorf("max_attempts must be from 1 to 100: %w", ErrInvalidTask)
	}
	if nt.RunAt != nil && nt.RunAt.After(MaxRunAt) {
		return nil, false, fmt.Errorf("run_at must be no later than 9999-12-31T23:59:59.999999Z: %w", ErrInvalidTask)
	}
	now := r.clk.Now()
	t := &store.Task{
		ID: uuid.Must(uuid.NewV7()).String(), Type: nt.Type, Payload: nt.Payload, Status: status.TaskPending,
		Priority: spec.DefaultTaskPriority, RunAt: now, IdempotencyKey: nt.IdempotencyKey,
		MaxAttempts: nt.MaxAttempts, RetryDelay: nt.RetryDelay,
	}
	if len(t.Payload) == 0 || string(t.Payload) == "null" {
		t.Payload = json.RawMessage("{}")
	}
	if nt.Priority != nil {
		t.Priority = *nt.Priority
	}
	if nt.RunAt != nil && nt.RunAt.After(now) {
		t.RunAt = *nt.RunAt
	}
	return r.st.CreateTask(ctx, t, now)
}

// TaskDefaults resolves a task's effective max attempts and retry delay: the
// task's own, else its type's registry entry, else the defaults.
func (r *Runtime) TaskDefaults(ctx context.Context, t *store.Task) (maxAttempts int, delay time.Duration) {
	maxAttempts, delay = t.MaxAttempts, t.RetryDelay
	if maxAttempts == 0 || delay == 0 {
		if tt := r.taskType(ctx, t.Type); tt != nil {
			if maxAttempts == 0 {
				maxAttempts = tt.MaxAttempts
			}
			if delay == 0 {
				delay = tt.RetryDelay
			}
		}
	}
	if maxAttempts == 0 {
		maxAttempts = DefaultTaskMaxAttempts
	}
	if delay == 0 {
		delay = DefaultTaskRetryDelay
	}
	return maxAttempts, delay
}

// typeCacheTTL bounds how stale a node's view of the task-type registry may
// be: changes made through this node apply at once, and on Postgres other
// nodes drop their entries when its notification reaches them
// (store.Committed.Registry); this is for a notification that is lost.
const typeCacheTTL = time.Second

type cachedType struct {
	tt *store.TaskType // nil: no registry entry
	at time.Time
}

// taskType reads a registry entry through a short cache: defaults are
// needed for every claimed task, and a query each was a large share of a
// claim's cost.
func (r *Runtime) taskType(ctx context.Context, typ string) *store.TaskType {
	now := r.clk.Now()
	if v, ok := r.types.Load(typ); ok {
		if c := v.(cachedType); now.Sub(c.at) < typeCacheTTL && c.at.Sub(now) < typeCacheTTL {
			return c.tt
		}
	}
	tt, err := r.st.GetTaskType(ctx, typ)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			return nil // transient: do not cache
		}
		tt = nil
	}
	r.types.Store(typ, cachedType{tt: tt, at: now})
	return tt
}

// TaskBackoff is the delay before the next attempt after attempt failed:
// base × attempt², plus up to 10% jitter, capped.
func TaskBackoff(attempt int, base time.Duration, rnd func() float64) time.Duration {
	// Compared before multiplying: a product past the int64 range wraps,
	// and may wrap to a small positive delay.
	sq := time.Duration(attempt * attempt)
	d := MaxTaskRetryDelay
	switch {
	case sq <= 0 || base <= 0:
		d = 0
	case base <= MaxTaskRetryDelay/sq:
		d = base * sq
	}
	return d + time.Duration(float64(d)*0.1*rnd())
}

// MaxClaimTypes bounds the types and prefixes one claim lists (each is a
// condition of the claim's statement); MaxWorkerIDLen a worker's id.
const (
	MaxClaimTypes  = 100
	MaxWorkerIDLen = 255
)

// ClaimRequest asks for work for a worker.
type ClaimRequest struct {
	Types    []string // exact types or prefixes ending in %
	WorkerID string
	Lease    time.Duration
	Max      int
	Wait     time.Duration // long-poll up to this long when nothing is ready
}

// FieldError names the request field a claim got wrong (its JSON name).
type FieldError struct{ Path, Msg string }

func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

// CheckClaim validates a claim as the API states it and fills defaults
// (lease 30s, max 1, worker "anonymous").
func CheckClaim(req *ClaimRequest) *FieldError {
	if len(req.Types) == 0 {
		return &FieldError{"types", `types must list at least one type or prefix ("billing.%")`}
	}
	if len(req.Types) > MaxClaimTypes {
		return &FieldError{"types", fmt.Sprintf("types lists %d types or prefixes, more than %d", len(req.Types), MaxClaimTypes)}
	}
	for i, t := range req.Types {
		switch {
		case t == "" || strings.Contains(strings.TrimSuffix(t, "%"), "%"):
			return &FieldError{fmt.Sprintf("types[%d]", i), fmt.Sprintf("%q: use an exact type or a prefix ending in %%", t)}
		case len(t) > spec.MaxTaskTypeLen+1 || !spec.CleanText(t):
			return &FieldError{fmt.Sprintf("types[%d]", i), fmt.Sprintf("a type (at most %d bytes), or a prefix with its %%, is UTF-8 text without NUL", spec.MaxTaskTypeLen)}
		}
	}
	if len(req.WorkerID) > MaxWorkerIDLen || !spec.CleanText(req.WorkerID) {
		return &FieldError{"worker_id", fmt.Sprintf("worker_id must be UTF-8 text without NUL of at most %d bytes", MaxWorkerIDLen)}
	}
	if req.Lease == 0 {
		req.Lease = 30 * time.Second
	}
	if req.Max == 0 {
		req.Max = 1
	}
	switch {
	case req.Lease < time.Second || req.Lease > time.Hour:
		return &FieldError{"lease_seconds", "lease_seconds must be from 1 to 3600"}
	case req.Max < 1 || req.Max > 100:
		return &FieldError{"max", "max must be from 1 to 100"}
	case req.Wait < 0 || req.Wait > MaxClaimWait:
		return &FieldError{"wait_seconds", "wait_seconds must be from 0 to 60"}
	}
	if req.WorkerID == "" {
		req.WorkerID = "anonymous"
	}
	return nil
}

// ClaimTasks leases ready tasks, waiting up to req.Wait for some to become
// ready: a write on this node hands the tasks it creates to the waiting
// claim directly (handoff.go); a new task elsewhere wakes the wait at once
// (Postgres NOTIFY), and a task whose run_at or lease end comes due wakes
// it on time.
func (r *Runtime) ClaimTasks(ctx context.Context, req ClaimRequest) ([]*store.Task, error) {
	return r.claimTasks(ctx, req, 3)
}

// claimTasks is ClaimTasks claiming again at once, up to again times, when
// tasks it failed (their final attempt's lease ran out) took candidates'
// places: bounded, should failing them keep failing.
func (r *Runtime) claimTasks(ctx context.Context, req ClaimRequest, again int) ([]*store.Task, error) {
	if req.Max <= 0 {
		req.Max = 1
	}
	if req.Lease <= 0 {
		req.Lease = 30 * time.Second
	}
	wait := min(req.Wait, MaxClaimWait)
	deadline := r.clk.Now().Add(wait)
	for {
		sig := r.taskSignal()
		now := r.clk.Now()
		c, err := r.st.ClaimOrNext(ctx, store.ClaimTasks{Patterns: req.Types, WorkerID: req.WorkerID, Lease: req.Lease, Max: req.Max, Now: now, Exhausted: r.exhaustedFn})
		if err != nil {
			return nil, err
		}
		for _, t := range c.Exhausted {
			r.failExhausted(ctx, t, now)
		}
		got := r.dropExhausted(ctx, c)
		if len(c.Exhausted) > 0 && len(got.Tasks) < req.Max && again > 0 {
			// Tasks it failed took candidates' places: what else is ready
			// is claimed at once, not after a wait.
			r.handedOut(ctx, got.Tasks, got.Since)
			rest := req
			rest.Max, rest.Wait = req.Max-len(got.Tasks), r.waitLeft(deadline, len(got.Tasks) > 0)
			more, err := r.claimTasks(ctx, rest, again-1)
			if err != nil {
				if len(got.Tasks) > 0 {
					return got.Tasks, nil // the claim's own tasks are handed out
				}
				return nil, err
			}
			return append(got.Tasks, more...), nil
		}
		if len(got.Tasks) > 0 || !now.Before(deadline) {
			r.handedOut(ctx, got.Tasks, got.Since)
			return got.Tasks, nil
		}
		// Writes may hand tasks to the claim from here on: the sooner,
		// the fewer triggers find no claim waiting.
		w := r.waiting.wait(req, deadline)
		sleep := deadline.Sub(now)
		next, ok := c.Next, c.NextOK
		if !c.NextRead {
			// The store claimed without its read (the claim before got
			// all it asked for), or claimed only exhausted tasks: when
			// the next one is due was not read.
			if next, ok, err = r.st.NextTaskDue(ctx, req.Types, now); err != nil {
				ok = false
			}
		}
		if ok {
			if d := next.Sub(now); d < sleep {
				sleep = max(d, time.Millisecond)
			}
		}
		wake := now.Add(sleep)
		t := r.clk.NewTimer(sleep)
		var stop error
	waiting:
		for {
			select {
			case <-ctx.Done():
				stop = ctx.Err()
			case <-r.draining:
				stop = errDraining
			case <-w.ready:
			case <-sig.ch:
				if at := sig.at; !at.IsZero() && at.After(r.clk.Now()) {
					// Tasks scheduled ahead (a retry's backoff, a run_at)
					// are claimable only from at: wait until then, if they
					// may be of this claim's types, without a read now.
					// Every retry woke every waiting claim to read and
					// find nothing. The timer is replaced only for an
					// earlier moment: a stream of such commits must not
					// keep putting it off.
					if at.Before(wake) && matchesAny(req.Types, sig.types) {
						wake = at
						t.Stop()
						t = r.clk.NewTimer(at.Sub(r.clk.Now()))
					}
					sig = sig.next
					continue waiting
				}
			case <-t.C():
			}
			break
		}
		t.Stop()
		if got := r.waiting.leave(w); len(got) > 0 {
			if stop != nil && stop != errDraining {
				// Handed over as the caller went away.
				r.ReleaseTasks(context.WithoutCancel(ctx), got)
				return nil, stop
			}
			r.handedOut(ctx, got, nil)
			return got, nil
		}
		switch {
		case stop == errDraining:
			return nil, nil
		case stop != nil:
			return nil, stop
		}
	}
}

// errDraining ends a waiting claim when the server stops.
var errDraining = errors.New("draining")

// Drain ends every waiting claim with an empty answer, so a server can shut
// down without holding workers' long-polls open.
func (r *Runtime) Drain() { r.drainOnce.Do(func() { close(r.draining) }) }

// ReleaseTasks hands back claimed tasks that never reached their worker (it
// hung up during the long-poll): they become pending again and the attempt
// is not counted.
func (r *Runtime) ReleaseTasks(ctx context.Context, ts []*store.Task) {
	r.release(ctx, ts, "the claiming worker disconnected before receiving the task")
}

// release makes tasks leased with the given tokens pending again, the
// attempt not counted; a task that is gone or leased anew is left alone.
func (r *Runtime) release(ctx context.Context, ts []*store.Task, reason string) {
	for _, t := range ts {
		err := r.st.InTask(ctx, t.ID, r.clk.Now(), func(tx store.TaskTx) error {
			k := tx.Task()
			if k.Status != status.TaskLeased || k.LeaseToken != t.LeaseToken {
				return nil
			}
			k.Status, k.Attempt, k.LeaseToken, k.LeaseUntil, k.LeasedBy = status.TaskPending, k.Attempt-1, "", nil, ""
			if err := tx.UpdateTask(k); err != nil {
				return err
			}
			return tx.AppendTask(store.NewEvent{Type: "released", Data: map[string]any{"reason": reason}})
		})
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			r.log.Warn("releasing undelivered task failed", "task_id", t.ID, "err", err)
		}
	}
}

// exhausted says, for a claim, whether a task whose lease ran out was on
// its final attempt, or a pending task already attempted has made its
// last (its type's max_attempts lowered while it waited for a retry)
// (store.ClaimTasks.Exhausted).
//
// It is asked inside the claim's write transaction (on SQLite, on the one
// writer), so it reads no registry: a task's own max_attempts, else its
// type's as cached. A type not cached yet (the first claim of it since the
// server started, or since the registry changed) answers yes: the claim
// leaves the task as it is, failExhausted reads the registry and fails it
// only if that was its final attempt, and the claim that follows at once
// (claimTasks) leases it if not. Answering no leased it on a guess, and a
// task on its final attempt was then failed by dropExhausted with a claim
// of an attempt beyond its max_attempts recorded, for a worker that never
// got it (a restarted server's first claim of a type whose worker had
// died with it).
func (r *Runtime) exhausted(t *store.Task) bool {
	maxAttempts := t.MaxAttempts
	if maxAttempts == 0 {
		v, ok := r.types.Load(t.Type)
		if !ok {
			return true
		}
		if tt := v.(cachedType).tt; tt != nil && tt.MaxAttempts > 0 {
			maxAttempts = tt.MaxAttempts
		} else {
			maxAttempts = DefaultTaskMaxAttempts
		}
	}
	return t.Attempt >= maxAttempts
}

// waitLeft is what is left of a claim's wait until deadline: none when
// it already has tasks to answer with.
func (r *Runtime) waitLeft(deadline time.Time, answered bool) time.Duration {
	if answered {
		return 0
	}
	return max(deadline.Sub(r.clk.Now()), 0)
}

// failExhausted fails a task whose final attempt's lease ran out, as it
// was when listed (its attempt and token unchanged): a lease_expired event
// and the failure, which for a workflow step advances its run. A task
// reported, reclaimed or released meanwhile is left alone. A pending task
// (a retry that has no attempt left since its type's max_attempts was
// lowered) fails at the attempt it made, with that attempt's error: as
// its report would have failed it under the new limit.
func (r *Runtime) failExhausted(ctx context.Context, t *store.Task, now time.Time) {
	if maxAttempts, _ := r.TaskDefaults(ctx, t); t.Attempt < maxAttempts {
		return // judged on a stale registry entry: the next claim takes it over
	}
	err := r.st.InTask(ctx, t.ID, now, func(tx store.TaskTx) error {
		k := tx.Task()
		if t.Status == status.TaskPending {
			if k.Status != status.TaskPending || k.Attempt != t.Attempt || k.RunAt.After(now) {
				return nil
			}
			msg := k.LastError
			if msg == "" { // released after its last attempt's lease ran out
				msg = "lease expired on the final attempt; the worker never reported"
			}
			return r.finishTask(ctx, tx, status.TaskFailed, nil, msg, nil, nil)
		}
		if k.Status != status.TaskLeased || k.LeaseToken != t.LeaseToken || k.LeaseUntil == nil || k.LeaseUntil.After(now) {
			return nil
		}
		if err := tx.AppendTask(store.NewEvent{Type: "lease_expired", Data: map[string]any{"attempt": k.Attempt}}); err != nil {
			return err
		}
		return r.finishTask(ctx, tx, status.TaskFailed, nil, "lease expired on the final attempt; the worker never reported", nil, nil)
	})
	if err != nil && ctx.Err() == nil {
		r.log.Warn("failing exhausted task", "task_id", t.ID, "err", err)
	}
}

// dropExhausted fails tasks reclaimed after their final attempt's lease ran
// out (a worker crashed on every attempt) instead of handing them out again.
// The claim leaves those it knows are (store.ClaimTasks.Exhausted); this
// catches one whose type's max_attempts changed in between.
func (r *Runtime) dropExhausted(ctx context.Context, c store.Claim) store.Claim {
	out := store.Claim{Tasks: c.Tasks[:0]}
	since := len(c.Since) == len(c.Tasks)
	if since {
		out.Since = c.Since[:0]
	}
	for i, t := range c.Tasks {
		maxAttempts, _ := r.TaskDefaults(ctx, t)
		if t.Attempt <= maxAttempts {
			out.Tasks = append(out.Tasks, t)
			if since {
				out.Since = append(out.Since, c.Since[i])
			}
			continue
		}
		err := r.st.InTask(ctx, t.ID, r.clk.Now(), func(tx store.TaskTx) error {
			k := tx.Task()
			if k.LeaseToken != t.LeaseToken {
				return nil
			}
			return r.finishTask(ctx, tx, status.TaskFailed, nil, "lease expired on the final attempt; the worker never reported", nil, nil)
		})
		if err != nil {
			r.log.Error("failing exhausted task", "task_id", t.ID, "err", err)
		}
	}
	return out
}

// failExhaustedLeases fails tasks whose final attempt's lease ran out, so a
// workflow step does not stay running when no worker comes to reclaim it.
// Tasks with attempts left are left alone: the next claim takes them over.
func (r *Runtime) failExhaustedLeases(ctx context.Context) {
	now := r.clk.Now()
	ts, err := r.st.ExpiredTaskLeases(ctx, now, DefaultTaskMaxAttempts, 500)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("listing expired task leases failed", "err", err)
		}
		return
	}
	for _, t := range ts {
		r.failExhausted(ctx, t, now) // which checks the limit again: the registry may have changed since the store read it
	}
}

// HeartbeatResult is what a heartbeat tells the worker.
type HeartbeatResult struct {
	LeaseUntil      time.Time
	CancelRequested bool
}

// Heartbeat extends a lease and reports whether cancellation was requested.
func (r *Runtime) Heartbeat(ctx context.Context, id, token string, lease time.Duration) (HeartbeatResult, error) {
	if lease <= 0 {
		lease = 30 * time.Second
	}
	var res HeartbeatResult
	now := r.clk.Now()
	err := r.st.InTask(ctx, id, now, func(tx store.TaskTx) error {
		t := tx.Task()
		if t.LeaseToken == "" || t.LeaseToken != token {
			return fmt.Errorf("task %s: %w", id, ErrStaleLease)
		}
		if t.Status == status.TaskCancelled {
			res = HeartbeatResult{LeaseUntil: derefTime(t.LeaseUntil), CancelRequested: true}
			return nil
		}
		if t.Status != status.TaskLeased {
			return fmt.Errorf("task %s is %s: %w", id, t.Status, ErrTaskFinished)
		}
		// At the stores' microsecond: the answer and the event say what
		// a read of the task says (a lease_seconds of 100.0000007 would
		// carry 700ns the store drops).
		until := now.Add(lease).Truncate(time.Microsecond)
		t.LeaseUntil = &until
		if err := tx.UpdateTask(t); err != nil {
			return err
		}
		res = HeartbeatResult{LeaseUntil: until, CancelRequested: t.CancelRequested}
		return tx.AppendTask(store.NewEvent{Type: "heartbeat", Data: map[string]any{"lease_until": until.UTC(), "extended_by_seconds": lease.Seconds()}})
	})
	return res, err
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// CompleteTask records a task's result; for a workflow step it becomes the
// step's body and the run advances in the same transaction.
func (r *Runtime) CompleteTask(ctx context.Context, id, token string, result json.RawMessage) (*store.Task, error) {
	if len(result) == 0 {
		result = json.RawMessage("null")
	}
	return r.reportTask(ctx, id, token, func(tx store.TaskTx, of *offer) error {
		return r.finishTask(ctx, tx, status.TaskSucceeded, result, "", nil, of)
	})
}

// CompleteTaskAndClaim completes a task like CompleteTask and, in the same
// transaction, leases to the same worker up to next.Max of the tasks the
// completion starts (the run's next steps) whose types next.Types match:
// eager dispatch. The worker goes on without a claim round trip and the
// step-to-step hand-off is one commit. Tasks handed out this way skip the
// queue's priority order; the rest are left for any claim.
func (r *Runtime) CompleteTaskAndClaim(ctx context.Context, id, token string, result json.RawMessage, next ClaimRequest) (*store.Task, []*store.Task, error) {
	if len(result) == 0 {
		result = json.RawMessage("null")
	}
	if next.Lease <= 0 {
		next.Lease = 30 * time.Second
	}
	e := &eagerClaim{req: next}
	out, err := r.reportTask(ctx, id, token, func(tx store.TaskTx, of *offer) error {
		e.taken = e.taken[:0] // a retried batch starts over
		return r.finishTask(ctx, tx, status.TaskSucceeded, result, "", e, of)
	})
	if err != nil {
		return nil, nil, err
	}
	// A task the same commit cancelled (a later report of the batch ended
	// its run) is not handed over; the store marks it so.
	e.taken = slices.DeleteFunc(e.taken, func(t *store.Task) bool { return t.Status != status.TaskLeased })
	r.handedOut(ctx, e.taken, nil)
	return out, e.taken, nil
}

// eagerClaim is a completing worker's request for the tasks its completion
// starts.
type eagerClaim struct {
	req   ClaimRequest
	taken []*store.Task
}

// take leases t to the worker if it matches and there is room: the store
// writes it leased, with its claimed event.
func (r *Runtime) take(ctx context.Context, e *eagerClaim, t *store.Task, now time.Time) {
	if len(e.taken) >= e.req.Max || !matchesType(e.req.Types, t.Type) || t.RunAt.After(now) {
		return
	}
	if tt := r.taskType(ctx, t.Type); tt != nil && !tt.Enabled {
		return
	}
	until := now.Add(e.req.Lease).Truncate(time.Microsecond) // as stored (see Heartbeat)
	t.Status, t.Attempt, t.LeasedBy, t.LeaseToken, t.LeaseUntil = status.TaskLeased, 1, e.req.WorkerID, newLeaseToken(), &until
	e.taken = append(e.taken, t)
}

func newLeaseToken() string { return rand.Text() }

// matchesType applies claim patterns: exact types, or prefixes ending in %.
func matchesType(patterns []string, typ string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "%"); ok {
			if strings.HasPrefix(typ, prefix) {
				return true
			}
		} else if p == typ {
			return true
		}
	}
	return false
}

// FailTask records a failed attempt: retried with backoff while attempts
// remain and the error is retryable, else the task fails.
func (r *Runtime) FailTask(ctx context.Context, id, token, msg string, retryable bool) (*store.Task, error) {
	if msg == "" {
		msg = "worker reported failure"
	}
	return r.reportTask(ctx, id, token, func(tx store.TaskTx, of *offer) error {
		t := tx.Task()
		maxAttempts, base := r.TaskDefaults(ctx, t)
		if !retryable || t.Attempt >= maxAttempts {
			return r.finishTask(ctx, tx, status.TaskFailed, nil, msg, nil, of)
		}
		delay := TaskBackoff(t.Attempt, base, jitter)
		// Microseconds, as stored, so the task returned equals the task read back.
		t.Status, t.LastError, t.RunAt = status.TaskPending, msg, tx.Now().Add(delay).Truncate(time.Microsecond)
		t.LeaseToken, t.LeaseUntil, t.LeasedBy = "", nil, ""
		if err := tx.UpdateTask(t); err != nil {
			return err
		}
		if run := tx.Run(); run != nil {
			if s := run.Step(t.Step); s != nil && s.Status == status.StepRunning {
				s.Attempt, s.Error = t.Attempt, msg
				if err := run.UpdateStep(s); err != nil {
					return err
				}
				if err := run.Append(store.NewEvent{Type: "step_retrying", Step: s.Name, Data: map[string]any{"attempt": t.Attempt, "error": msg, "retry_in_ms": delay.Milliseconds()}}); err != nil {
					return err
				}
			}
		}
		return tx.AppendTask(store.NewEvent{Type: "retried", Data: map[string]any{"attempt": t.Attempt, "error": msg, "retry_in_ms": delay.Milliseconds(), "run_at": t.RunAt.UTC()}})
	})
}

// finishTask moves a task to a terminal status and, for a workflow step,
// records the step's outcome and advances the run.
func (r *Runtime) finishTask(ctx context.Context, tx store.TaskTx, final string, result json.RawMessage, msg string, eager *eagerClaim, of *offer) error {
	now := tx.Now()
	t := tx.Task()
	t.Status, t.Result, t.LastError, t.FinishedAt = final, result, msg, &now
	if final != status.TaskCancelled {
		// The token is kept: a repeated report from the worker that held
		// the lease is told ErrTaskFinished, while others get ErrStaleLease.
		t.LeaseUntil = nil
	}
	if err := tx.UpdateTask(t); err != nil {
		return err
	}
	if err := tx.AppendTask(store.NewEvent{Type: final, Data: store.EventJSON(taskEndedData(t.Attempt, msg))}); err != nil {
		return err
	}
	run := tx.Run()
	if run == nil {
		return nil
	}
	s := run.Step(t.Step)
	if s == nil || s.Status != status.StepRunning || status.RunTerminal(run.Run().Status) {
		return nil
	}
	// The run's times are the run's transaction's: not before its last
	// write (store.RunTx.Now), which a batch's clock may be.
	now = run.Now()
	ch := &changes{now: now, runID: run.Run().ID, eager: eager, offer: of}
	ch.touch(s)
	s.Attempt, s.FinishedAt = t.Attempt, &now
	switch final {
	case status.TaskSucceeded:
		s.Status, s.Body, s.Error = status.StepSuccess, result, ""
		ch.events = append(ch.events, store.NewEvent{Type: "step_succeeded", Step: s.Name, Data: store.EventJSON(attemptRef(t.Attempt, t.ID))})
	case status.TaskCancelled:
		s.Status, s.Error = status.StepCancelled, msg
		ch.events = append(ch.events, store.NewEvent{Type: "step_failed", Step: s.Name, Data: map[string]any{"status": s.Status, "error": msg, "task_id": t.ID}})
	default:
		s.Status, s.Error = status.StepFailed, msg
		ch.events = append(ch.events, store.NewEvent{Type: "step_failed", Step: s.Name, Data: map[string]any{"status": s.Status, "error": msg, "task_id": t.ID, "attempt": t.Attempt}})
	}
	return r.advance(ctx, run, ch)
}

// CancelTask cancels a task cooperatively: a pending task is never handed
// out; a leased one is marked cancelled and its worker learns it at the next
// heartbeat (its later report is refused).
func (r *Runtime) CancelTask(ctx context.Context, id string) (*store.Task, error) {
	var out *store.Task
	err := r.st.InTask(ctx, id, r.clk.Now(), func(tx store.TaskTx) error {
		t := tx.Task()
		if status.TaskTerminal(t.Status) {
			return fmt.Errorf("task %s is %s: %w", id, t.Status, ErrTaskFinished)
		}
		t.CancelRequested = true
		if err := r.finishTask(ctx, tx, status.TaskCancelled, nil, "task cancelled", nil, nil); err != nil {
			return err
		}
		out = tx.Task()
		return nil
	})
	return out, err
}

// TaskTypesChanged drops the cached registry and wakes waiting claims: a
// type may have been enabled.
func (r *Runtime) TaskTypesChanged() {
	r.types.Clear()
	r.tasksReady()
}
