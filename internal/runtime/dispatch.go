package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ferryhq/ferry/internal/engine"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
)

// Run dispatches due work until ctx is cancelled, then waits for in-flight
// items to finish (their contexts are cancelled; they record nothing that a
// later claim would not redo). One Run at a time: a second while one runs
// returns ErrRunning (they would share one timer loop's state, and on
// Postgres one listener's announcements to the other servers).
func (r *Runtime) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	wakeDone := make(chan struct{})
	if n, ok := r.st.(store.Notifier); ok {
		wakeups := n.Wakeups(ctx)
		go func() {
			defer close(wakeDone)
			for range wakeups {
				// Another node may have changed the task-type
				// registry (store.Committed.Registry).
				r.types.Clear()
				r.Nudge()
				r.tasksReady()
			}
		}()
	} else {
		close(wakeDone)
	}
	timersDone := make(chan struct{})
	go func() {
		defer close(timersDone)
		r.runTimers(ctx)
	}()
	lastSweep := r.clk.Now()
	for {
		if err := ctx.Err(); err != nil {
			r.wg.Wait()
			<-timersDone
			// Its end (on Postgres, the node's goodbye) before Run's: a
			// Run started after this one returns begins after it.
			<-wakeDone
			return nil
		}
		free := cap(r.sem) - len(r.sem)
		claimed := 0
		if free > 0 {
			// Timers are fired above; only HTTP attempts need a lease.
			items, err := r.st.Claim(ctx, r.clk.Now(), r.cfg.Lease, free, store.KindHTTP)
			if err != nil && ctx.Err() == nil {
				r.log.Error("claim failed", "err", err)
			}
			claimed = len(items)
			for _, it := range items {
				r.sem <- struct{}{}
				r.wg.Add(1)
				go func(it *store.QueueItem) {
					defer func() {
						<-r.sem
						r.wg.Done()
						select {
						case r.freed <- struct{}{}:
						default:
						}
					}()
					r.process(ctx, it)
				}(it)
			}
		}
		if now := r.clk.Now(); now.Sub(lastSweep) > time.Minute {
			lastSweep = now
			r.failExhaustedLeases(ctx)
			if n, err := r.st.Sweep(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("sweep failed", "err", err)
			} else if n > 0 {
				r.log.Info("swept orphaned queue items", "count", n)
			}
		}
		if free == 0 || (claimed > 0 && claimed == free) {
			// More may be due: go round again once a slot frees up (or a
			// commit queues work, or a short tick passes).
			r.planned.Store(math.MaxInt64)
			t := r.clk.NewTimer(saturatedTick)
			select {
			case <-ctx.Done():
			case <-r.wake:
			case <-r.freed:
			case <-t.C():
			}
			t.Stop()
			continue
		}
		r.sleepUntilDue(ctx)
	}
}

func (r *Runtime) sleepUntilDue(ctx context.Context) {
	// Deciding: every commit that queues something wakes us until the
	// plan is set, so an item committed after NextDue read is not missed.
	r.planned.Store(math.MaxInt64)
	wait := r.cfg.SafetyTick
	next, ok, err := r.st.NextDue(ctx, time.Time{}, store.KindHTTP)
	if err != nil && ctx.Err() == nil {
		r.log.Warn("next due failed", "err", err)
	}
	if ok {
		if d := next.Sub(r.clk.Now()); d < wait {
			wait = d
		}
	}
	if wait <= 0 {
		return
	}
	r.planned.Store(r.clk.Now().Add(wait).UnixNano())
	t := r.clk.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-r.wake:
	case <-t.C():
	}
}

func (r *Runtime) process(ctx context.Context, it *store.QueueItem) {
	var err error
	switch it.Kind {
	case store.KindHTTP:
		err = r.runHTTP(ctx, it)
	default:
		err = fmt.Errorf("unknown queue item kind %q", it.Kind)
	}
	switch {
	case err == nil, ctx.Err() != nil:
	case errors.Is(err, store.ErrLeaseLost):
		r.log.Info("queue item taken over elsewhere", "item", it.ID, "run_id", it.RunID, "step", it.Step)
	default:
		r.log.Error("queue item failed", "item", it.ID, "kind", it.Kind, "run_id", it.RunID, "step", it.Step, "err", err)
	}
}

// timerTx completes a sleep or a webhook wait whose time came.
//
// applied says the timer changed its step: a wait's timeout whose
// callback came first, or a timer of a run that ended, changes nothing.
func (r *Runtime) timerTx(ctx context.Context, tx store.RunTx, it *store.QueueItem, from, to, event, msg string, of *offer) (applied bool, err error) {
	now := tx.Now()
	s := tx.Step(it.Step)
	ch := &changes{now: now, runID: it.RunID, offer: of}
	if s != nil && s.Status == from && !status.RunTerminal(tx.Run().Status) {
		s.Status, s.Error, s.FinishedAt = to, msg, &now
		ch.touch(s)
		ch.events = append(ch.events, store.NewEvent{Type: event, Step: s.Name})
		applied = true
	}
	return applied, r.advance(ctx, tx, ch)
}

// expireTx ends a run that reached max_duration; applied false: the run
// had already ended.
func (r *Runtime) expireTx(ctx context.Context, tx store.RunTx) (applied bool, err error) {
	now := tx.Now()
	run := tx.Run()
	if status.RunTerminal(run.Status) {
		return false, nil
	}
	ch := &changes{now: now, runID: run.ID, finished: true, stopped: true}
	for _, s := range tx.Steps() {
		if !status.StepTerminal(s.Status) {
			s.Status, s.Error, s.FinishedAt = status.StepCancelled, "run exceeded max_duration", &now
			ch.touch(s)
		}
	}
	run.Status, run.Error, run.FinishedAt = status.RunTimeout, "run exceeded max_duration", &now
	ch.events = append(ch.events, store.NewEvent{Type: "run_timeout"})
	return true, r.flush(ctx, tx, run, ch)
}

// pastExpiry says whether run, live, is at or past its expires_at at now:
// its expiry is due but not applied yet (a timer backlog, a restart after
// downtime). What would record a step's outcome then drops it, as it is
// dropped once the expiry has ended the run, so that no outcome counts
// for arriving before the expiry's timer rather than before the deadline.
func pastExpiry(run *store.Run, now time.Time) bool {
	return !status.RunTerminal(run.Status) && !run.ExpiresAt.IsZero() && !now.Before(run.ExpiresAt)
}

// saturatedTick bounds how long the dispatcher waits while every
// processing slot is busy with HTTP attempts.
const saturatedTick = 10 * time.Millisecond

func (r *Runtime) track(runID string, id int64, cancel context.CancelFunc) func() {
	r.mu.Lock()
	m := r.inflt[runID]
	if m == nil {
		m = map[int64]context.CancelFunc{}
		r.inflt[runID] = m
	}
	m[id] = cancel
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(m, id)
		if len(m) == 0 {
			delete(r.inflt, runID)
		}
		r.mu.Unlock()
	}
}

// runHTTP executes one attempt outside any transaction, renewing the lease
// until its outcome is recorded, fenced by the lease token so a stale
// executor can never record twice.
func (r *Runtime) runHTTP(ctx context.Context, it *store.QueueItem) error {
	// Tracked before the run is read, so that a cancel (or expiry) cannot
	// fall between the two: one committed before the read is seen by it,
	// and one committed after it aborts the attempt (abortRun runs once
	// the end is committed). Tracked after the read, a cancel committed in
	// between found nothing to abort, and the request went out after the
	// cancel was acknowledged.
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	untrack := r.track(it.RunID, it.ID, cancel)
	defer untrack()
	run, steps, err := r.st.GetRun(ctx, it.RunID)
	if err != nil {
		return err
	}
	var st *store.StepRun
	for _, s := range steps {
		if s.Name == it.Step {
			st = s
		}
	}
	if st == nil || st.Status != status.StepRunning || status.RunTerminal(run.Status) {
		return r.st.InRun(ctx, it.RunID, r.clk.Now(), func(tx store.RunTx) error { return tx.Dequeue(it.ID, it.LeaseToken) })
	}
	def, err := r.Definition(ctx, run.WorkflowID, run.Version)
	if err != nil {
		return err
	}
	spec := def.Step(it.Step)
	var req engine.HTTPRequest
	if err := json.Unmarshal(st.Request, &req); err != nil {
		return fmt.Errorf("decode stored request: %w", err)
	}
	if err := r.holdLease(ctx, it); err != nil {
		return err
	}
	renewDone := make(chan struct{})
	go r.renew(actx, cancel, it, renewDone)
	// The lease is renewed until the outcome is recorded, not only while
	// the request is in flight: the recording waits for the run's lock,
	// which another step's outcome may hold, and a lease that ran out
	// meanwhile let another node send the attempt again.
	defer func() {
		cancel()
		<-renewDone
	}()
	var res httpstep.Result
	if err := actx.Err(); err != nil {
		// Aborted before it started (the run ended after it was read):
		// nothing is sent.
		res.Err = err
	} else {
		headers, traced := r.cfg.Tracer.HTTPAttempt(run, it.Step, it.Attempt, req.Method, req.URL, req.Headers)
		res = r.cfg.HTTP.Do(actx, httpstep.Request{
			URL: req.URL, Method: req.Method, Headers: headers, Body: req.Body,
			Timeout: spec.Timeout, RunID: it.RunID, Step: it.Step, Attempt: it.Attempt,
		})
		traced(res.StatusCode, res.Err)
	}
	if ctx.Err() != nil {
		// Shutting down: leave the item leased; it is retried after the
		// lease, with the same attempt number.
		return ctx.Err()
	}
	if actx.Err() != nil {
		// Cut short: the run was cancelled, or the lease lost.
		r.cfg.Observer.HTTPAttempt("cancelled", res.Duration)
	} else {
		r.cfg.Observer.HTTPAttempt(attemptOutcome(res), res.Duration)
	}
	of := r.newOffer()
	err = r.st.InRun(ctx, it.RunID, r.clk.Now(), func(tx store.RunTx) error {
		if err := tx.Dequeue(it.ID, it.LeaseToken); err != nil {
			return err
		}
		// The clock was read before the run's lock was taken: another
		// outcome may have been recorded since, later (store.RunTx.Now).
		now := tx.Now()
		s := tx.Step(it.Step)
		if s == nil || s.Status != status.StepRunning || status.RunTerminal(tx.Run().Status) || pastExpiry(tx.Run(), now) {
			// Past the run's expiry, the outcome is dropped as it is once
			// the expiry is applied (pastExpiry).
			return nil
		}
		ch := &changes{now: now, runID: it.RunID, offer: of}
		ch.touch(s)
		s.Attempt = it.Attempt
		durMS := res.Duration.Milliseconds()
		s.DurationMS = &durMS
		if res.Retryable && it.Attempt <= spec.Retries {
			delay := httpstep.Backoff(it.Attempt, res.RetryAfter, jitter)
			s.Error = attemptError(res)
			// The last attempt's, as its error and duration are: an
			// earlier attempt's code beside a network error told of a
			// response this attempt never had.
			s.StatusCode = nil
			if code := answered(res); code != 0 {
				s.StatusCode = &code
			}
			ch.queue = append(ch.queue, store.QueueItem{Kind: store.KindHTTP, Step: s.Name, Attempt: it.Attempt + 1, DueAt: now.Add(delay)})
			ch.events = append(ch.events, store.NewEvent{Type: "step_retrying", Step: s.Name, Data: map[string]any{"attempt": it.Attempt, "error": s.Error, "retry_in_ms": delay.Milliseconds()}})
			return r.flush(ctx, tx, tx.Run(), ch)
		}
		s.FinishedAt = &now
		s.Error = ""
		s.StatusCode = nil
		if code := answered(res); code != 0 {
			s.StatusCode = &code
			// A body that broke off is kept as what came of it, marked
			// truncated: never parsed as JSON.
			s.Body, s.Headers, s.Truncated = res.Body, res.Headers, res.Truncated || res.Err != nil
		}
		if res.Err == nil && res.StatusCode >= 200 && res.StatusCode < 300 {
			s.Status = status.StepSuccess
			ch.events = append(ch.events, store.NewEvent{Type: "step_succeeded", Step: s.Name, Data: map[string]any{"status_code": res.StatusCode, "attempt": it.Attempt}})
		} else {
			s.Status = status.StepFailed
			s.Error = attemptError(res)
			ch.events = append(ch.events, store.NewEvent{Type: "step_failed", Step: s.Name, Data: map[string]any{"status": s.Status, "status_code": s.StatusCode, "error": s.Error, "attempt": it.Attempt}})
		}
		return r.advance(ctx, tx, ch)
	})
	of.settle(err)
	return err
}

// attemptOutcome is an attempt's status class for metrics ("2xx" …
// "5xx"), or "error" when no response came.
func attemptOutcome(res httpstep.Result) string {
	// By the status the step records: a response whose body broke off
	// counts by its status, but a 2xx's, which is no answer (answered).
	code := answered(res)
	if code < 100 || code > 599 {
		return "error"
	}
	return [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}[code/100-1]
}

// answered is the status code an attempt's outcome records, 0 for none.
// A 2xx whose body broke off is no answer: its attempt ended in a network
// error (workflow-format.md: a final network error has no status code),
// and a condition on status_code == 200 must not take it for a success.
// Any other status stands, its body as what came of it.
func answered(res httpstep.Result) int {
	if res.Err != nil && res.StatusCode >= 200 && res.StatusCode <= 299 {
		return 0
	}
	return res.StatusCode
}

func attemptError(res httpstep.Result) string {
	if res.Err != nil {
		return res.Err.Error()
	}
	if res.StatusCode < 200 || res.StatusCode >= 300 {
		return fmt.Sprintf("HTTP %d", res.StatusCode)
	}
	return ""
}

// holdLease makes sure, before an attempt's request is sent, that its
// lease is still this executor's. The lease runs from the claim, and the
// renewals start with the request: a process stalled between the two for
// most of a lease (starved of CPU, paused) would otherwise send a request
// whose lease another node had meanwhile taken, and the attempt would
// run twice (seen under load, the two requests 0.4 s apart with a 2 s
// lease). With less than half the lease left, it is extended first,
// fenced by its token: that fails if another executor took the item, and
// restarts the lease's full length for the request. A lease with more
// left costs nothing.
func (r *Runtime) holdLease(ctx context.Context, it *store.QueueItem) error {
	now := r.clk.Now()
	if it.LeaseUntil.Sub(now) >= r.cfg.Lease/2 {
		return nil
	}
	until := now.Add(r.cfg.Lease)
	if err := r.st.ExtendLease(ctx, it.ID, it.LeaseToken, until); err != nil {
		return err
	}
	it.LeaseUntil = until
	return nil
}

// renew extends the lease at a third of its length; losing it (the run was
// cancelled or finished on another node) aborts the request.
func (r *Runtime) renew(ctx context.Context, abort context.CancelFunc, it *store.QueueItem, done chan<- struct{}) {
	defer close(done)
	every := r.cfg.Lease / 3
	for {
		t := r.clk.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		err := r.st.ExtendLease(ctx, it.ID, it.LeaseToken, r.clk.Now().Add(r.cfg.Lease))
		if errors.Is(err, store.ErrLeaseLost) {
			abort()
			return
		}
	}
}
