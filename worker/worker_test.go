package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/testwait"
	"github.com/ferryhq/ferry/worker"
)

// Both sources satisfy the interface.
var (
	_ worker.Source = (*client.Client)(nil)
	_ worker.Source = (*ferry.Engine)(nil)
)

// producer creates and inspects tasks: *client.Client and *ferry.Engine.
type producer interface {
	CreateTask(ctx context.Context, nt client.NewTask) (*client.Task, bool, error)
	GetTask(ctx context.Context, id string) (*client.Task, error)
	CancelTask(ctx context.Context, id string) (*client.Task, error)
}

// env is one engine; src is what the worker under test pulls from.
type env struct {
	srv  *ferrytest.Server
	c    *client.Client // HTTP, for what the engine has no method for (events, workflows)
	src  worker.Source
	prod producer
}

// eachSource runs fn against a real HTTP server through the client and
// against the embedded engine directly.
func eachSource(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, name := range []string{"http", "embedded"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := ferrytest.Start(t)
			e := &env{srv: srv, c: client.New(srv.URL, srv.Key)}
			if name == "http" {
				e.src, e.prod = e.c, e.c
			} else {
				e.src, e.prod = srv.Engine, srv.Engine
			}
			fn(t, e)
		})
	}
}

const waitFor = 30 * time.Second // deadline of every wait

func (e *env) create(t *testing.T, typ, payload string, mods ...func(*client.NewTask)) string {
	t.Helper()
	nt := client.NewTask{Type: typ, Payload: json.RawMessage(payload)}
	for _, m := range mods {
		m(&nt)
	}
	task, created, err := e.prod.CreateTask(context.Background(), nt)
	if err != nil || !created {
		t.Fatalf("create %s: created=%v err=%v", typ, created, err)
	}
	return task.ID
}

func (e *env) get(t *testing.T, id string) *client.Task {
	t.Helper()
	task, err := e.prod.GetTask(context.Background(), id)
	if err != nil {
		t.Fatalf("get task %s: %v", id, err)
	}
	return task
}

// waitTask polls the task until cond holds.
func (e *env) waitTask(t *testing.T, id string, what string, cond func(*client.Task) bool) *client.Task {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		task := e.get(t, id)
		if cond(task) {
			return task
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s: timed out waiting for %s; task: %s", id, what, task.Raw)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
}

func status(s string) func(*client.Task) bool {
	return func(t *client.Task) bool { return t.Status == s }
}

func (e *env) events(t *testing.T, id string) []client.TaskEvent {
	t.Helper()
	evs, err := e.c.TaskEvents(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func countEvents(evs []client.TaskEvent, typ string) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// running is a worker's Run in the background.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

// start runs w until the test ends (or stop is called).
func start(t *testing.T, w *worker.Worker) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run's context and waits for it to return.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(waitFor):
		t.Fatal("Run did not return after its context was cancelled")
		return nil
	}
}

func newWorker(t *testing.T, src worker.Source, cfg worker.Config) *worker.Worker {
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	if cfg.PollWait == 0 {
		cfg.PollWait = 5 * time.Second
	}
	return worker.New(src, cfg)
}

// recv waits for a value on ch.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

func retryFast(nt *client.NewTask) { nt.RetryDelay = 50 * time.Millisecond }

// ---- tests ----

func TestCompletesWithResults(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		w := newWorker(t, e.src, worker.Config{Concurrency: 4, Lease: 5 * time.Second})
		w.Handle("test.double.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			var in struct{ N int }
			if err := task.Decode(&in); err != nil {
				return nil, worker.NonRetryable(err)
			}
			if task.Attempt != 1 || task.MaxAttempts != 5 || task.Type != "test.double.v1" || task.RunID != "" {
				return nil, fmt.Errorf("unexpected task %+v", task)
			}
			return map[string]any{"n": in.N * 2, "id": task.ID}, nil
		})
		ids := make([]string, 20)
		for i := range ids {
			ids[i] = e.create(t, "test.double.v1", fmt.Sprintf(`{"n": %d}`, i))
		}
		start(t, w)
		for i, id := range ids {
			task := e.waitTask(t, id, "success", status(client.TaskSucceeded))
			var res struct {
				N  int
				ID string
			}
			if err := json.Unmarshal(task.Result, &res); err != nil || res.N != 2*i || res.ID != id || task.Attempt != 1 {
				t.Fatalf("task %d: result %s attempt %d (%v)", i, task.Result, task.Attempt, err)
			}
			evs := e.events(t, id)
			if countEvents(evs, "claimed") != 1 || countEvents(evs, "succeeded") != 1 {
				t.Fatalf("task %d events: %+v", i, evs)
			}
		}
	})
}

func TestConcurrencyBound(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		const n, tasks = 3, 12
		var cur, peak atomic.Int32
		started := make(chan string, tasks)
		release := make(chan struct{})
		w := newWorker(t, e.src, worker.Config{Concurrency: n, Lease: 5 * time.Second})
		w.Handle("test.block.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			c := cur.Add(1)
			defer cur.Add(-1)
			for {
				p := peak.Load()
				if c <= p || peak.CompareAndSwap(p, c) {
					break
				}
			}
			started <- task.ID
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return map[string]bool{"ok": true}, nil
		})
		ids := make([]string, tasks)
		for i := range ids {
			ids[i] = e.create(t, "test.block.v1", `{}`)
		}
		start(t, w)
		for range n {
			recv(t, started, "a handler to start")
		}
		// Every slot is taken and every handler blocked: the worker must hold
		// exactly n leases, however long it waits.
		leased := 0
		for _, id := range ids {
			if e.get(t, id).Status == client.TaskLeased {
				leased++
			}
		}
		if leased != n || peak.Load() != n {
			t.Fatalf("with %d slots busy: %d tasks leased, peak concurrency %d", n, leased, peak.Load())
		}
		// Let the rest through one at a time.
		for range tasks - n {
			release <- struct{}{}
			recv(t, started, "the next handler to start")
		}
		close(release)
		for _, id := range ids {
			e.waitTask(t, id, "success", status(client.TaskSucceeded))
		}
		if p := peak.Load(); p != n {
			t.Fatalf("peak concurrency %d, want %d", p, n)
		}
	})
}

func TestErrorIsRetriedThenSucceeds(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		var calls atomic.Int32
		w := newWorker(t, e.src, worker.Config{Lease: 5 * time.Second})
		w.Handle("test.flaky.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			calls.Add(1)
			if task.Attempt < 3 {
				return nil, fmt.Errorf("upstream unavailable (attempt %d)", task.Attempt)
			}
			return map[string]int{"attempt": task.Attempt}, nil
		})
		id := e.create(t, "test.flaky.v1", `{}`, retryFast)
		start(t, w)
		task := e.waitTask(t, id, "success", status(client.TaskSucceeded))
		if task.Attempt != 3 || string(task.Result) != `{"attempt":3}` || calls.Load() != 3 {
			t.Fatalf("task %s, handler calls %d", task.Raw, calls.Load())
		}
		evs := e.events(t, id)
		if countEvents(evs, "retried") != 2 || countEvents(evs, "succeeded") != 1 {
			t.Fatalf("events: %+v", evs)
		}
		for _, ev := range evs {
			if ev.Type == "retried" && !strings.Contains(string(ev.Data), "upstream unavailable") {
				t.Fatalf("retried event without the handler's error: %s", ev.Data)
			}
		}
	})
}

func TestNonRetryableFailsAtOnce(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		w := newWorker(t, e.src, worker.Config{Lease: 5 * time.Second})
		w.Handle("test.bad.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			return nil, fmt.Errorf("validate: %w", worker.NonRetryable(errors.New("payload lacks an id")))
		})
		id := e.create(t, "test.bad.v1", `{}`, retryFast)
		start(t, w)
		task := e.waitTask(t, id, "failure", status(client.TaskFailed))
		if task.Attempt != 1 || task.LastError != "validate: payload lacks an id" {
			t.Fatalf("task %s", task.Raw)
		}
		if evs := e.events(t, id); countEvents(evs, "retried") != 0 || countEvents(evs, "failed") != 1 {
			t.Fatalf("events: %+v", evs)
		}
	})
}

func TestPanicFailsTheAttempt(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		w := newWorker(t, e.src, worker.Config{Lease: 5 * time.Second})
		w.Handle("test.panic.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			if task.Attempt == 1 {
				panic("boom")
			}
			return "recovered", nil
		})
		id := e.create(t, "test.panic.v1", `{}`, retryFast)
		start(t, w)
		task := e.waitTask(t, id, "success", status(client.TaskSucceeded))
		if task.Attempt != 2 || string(task.Result) != `"recovered"` {
			t.Fatalf("task %s", task.Raw)
		}
		evs := e.events(t, id)
		var retried []client.TaskEvent
		for _, ev := range evs {
			if ev.Type == "retried" {
				retried = append(retried, ev)
			}
		}
		if len(retried) != 1 || !strings.Contains(string(retried[0].Data), "panic: boom") {
			t.Fatalf("events: %+v", evs)
		}
	})
}

func TestNoHandlerForClaimedType(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		w := newWorker(t, e.src, worker.Config{Types: []string{"test.%"}, Lease: 5 * time.Second})
		w.Handle("test.known.v1", func(ctx context.Context, task *worker.Task) (any, error) { return nil, nil })
		unknown := e.create(t, "test.unknown.v1", `{}`, retryFast)
		known := e.create(t, "test.known.v1", `{}`)
		start(t, w)
		task := e.waitTask(t, unknown, "failure", status(client.TaskFailed))
		if task.Attempt != 1 || task.LastError != "no handler for type test.unknown.v1" {
			t.Fatalf("task %s", task.Raw)
		}
		if task := e.waitTask(t, known, "success", status(client.TaskSucceeded)); task.Result != nil {
			t.Fatalf("nil result recorded as %s", task.Result)
		}
	})
}

// spy wraps a source: it counts reports and can inject failures.
type spy struct {
	worker.Source
	completes, fails atomic.Int32
	claimErrs        atomic.Int32 // fail this many claims
	completeErrs     chan error   // each value is returned by one CompleteTask instead of forwarding
	// heartbeat: 0 forwards, 1 answers success without forwarding (the
	// worker believes its lease is held), 2 fails as a network error would.
	heartbeat atomic.Int32
	beats     atomic.Int32  // heartbeats forwarded and accepted
	claiming  chan struct{} // gets a value (if there is room) as a claim is forwarded
}

func newSpy(src worker.Source) *spy {
	return &spy{Source: src, completeErrs: make(chan error, 10), claiming: make(chan struct{}, 1)}
}

func (s *spy) ClaimTasks(ctx context.Context, req client.ClaimRequest) ([]client.ClaimedTask, error) {
	for {
		n := s.claimErrs.Load()
		if n <= 0 {
			break
		}
		if s.claimErrs.CompareAndSwap(n, n-1) {
			return nil, errors.New("dial tcp: connection refused")
		}
	}
	select {
	case s.claiming <- struct{}{}:
	default:
	}
	return s.Source.ClaimTasks(ctx, req)
}

func (s *spy) Heartbeat(ctx context.Context, id, token string, lease time.Duration) (client.HeartbeatResult, error) {
	switch s.heartbeat.Load() {
	case 1:
		return client.HeartbeatResult{LeaseUntil: time.Now().Add(lease)}, nil
	case 2:
		return client.HeartbeatResult{}, errors.New("read tcp: connection reset by peer")
	}
	res, err := s.Source.Heartbeat(ctx, id, token, lease)
	if err == nil {
		s.beats.Add(1)
	}
	return res, err
}

func (s *spy) CompleteTask(ctx context.Context, id, token string, result any) error {
	s.completes.Add(1)
	select {
	case err := <-s.completeErrs:
		return err
	default:
	}
	return s.Source.CompleteTask(ctx, id, token, result)
}

func (s *spy) FailTask(ctx context.Context, id, token, msg string, retryable bool) error {
	s.fails.Add(1)
	return s.Source.FailTask(ctx, id, token, msg, retryable)
}

func TestCancelStopsTheHandler(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		sp := newSpy(e.src)
		started := make(chan string, 1)
		causes := make(chan error, 1)
		w := newWorker(t, sp, worker.Config{Lease: 1500 * time.Millisecond})
		w.Handle("test.long.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			started <- task.ID
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return "finished anyway", nil // must not be reported
		})
		id := e.create(t, "test.long.v1", `{}`)
		r := start(t, w)
		recv(t, started, "the handler to start")
		if _, err := e.prod.CancelTask(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		// Heartbeats every 0.5s carry the cancellation to the handler.
		if cause := recv(t, causes, "the handler's context to be cancelled"); !errors.Is(cause, worker.ErrTaskCancelled) {
			t.Fatalf("cause = %v", cause)
		}
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		if sp.completes.Load() != 0 || sp.fails.Load() != 0 {
			t.Fatalf("reports after cancellation: %d completes, %d fails", sp.completes.Load(), sp.fails.Load())
		}
		task := e.get(t, id)
		if task.Status != client.TaskCancelled || !task.CancelRequested || task.Result != nil {
			t.Fatalf("task %s", task.Raw)
		}
	})
}

// The lease expires while the worker believes it holds it (its heartbeats
// are lost); another claimer takes the task; the worker's next heartbeat is
// refused as stale and its handler is cancelled.
func TestLeaseLostStopsTheHandler(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		sp := newSpy(e.src)
		started := make(chan string, 1)
		causes := make(chan error, 1)
		w := newWorker(t, sp, worker.Config{Lease: 1500 * time.Millisecond})
		w.Handle("test.long.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			started <- task.ID
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return "too late", nil
		})
		id := e.create(t, "test.long.v1", `{}`)
		r := start(t, w)
		recv(t, started, "the handler to start")
		sp.heartbeat.Store(1)
		// The lease runs out 1.5s after the last real heartbeat; then this
		// long-poll takes the task over.
		ctx := context.Background()
		got, err := e.src.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"test.long.v1"}, WorkerID: "usurper", Lease: time.Minute, Max: 1, Wait: 20 * time.Second})
		if err != nil || len(got) != 1 || got[0].ID != id || got[0].Attempt != 2 {
			t.Fatalf("takeover claim: %+v, %v", got, err)
		}
		sp.heartbeat.Store(0)
		cause := recv(t, causes, "the handler's context to be cancelled")
		if !errors.Is(cause, client.ErrLeaseLost) {
			t.Fatalf("cause = %v", cause)
		}
		var ae *client.APIError
		if !errors.As(cause, &ae) || ae.Code != client.CodeStaleLease {
			t.Fatalf("cause %v is not the server's stale_lease refusal", cause)
		}
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		if sp.completes.Load() != 0 || sp.fails.Load() != 0 {
			t.Fatalf("reports after the lease was lost: %d completes, %d fails", sp.completes.Load(), sp.fails.Load())
		}
		// The usurper still holds the task and completes it.
		if err := e.src.CompleteTask(ctx, id, got[0].LeaseToken, map[string]string{"by": "usurper"}); err != nil {
			t.Fatal(err)
		}
		task := e.get(t, id)
		if task.Status != client.TaskSucceeded || string(task.Result) != `{"by":"usurper"}` || task.Attempt != 2 {
			t.Fatalf("task %s", task.Raw)
		}
		if evs := e.events(t, id); countEvents(evs, "lease_expired") != 1 || countEvents(evs, "succeeded") != 1 {
			t.Fatalf("events %+v", evs)
		}
	})
}

// Heartbeats that cannot reach the server for a whole lease: the worker
// gives the lease up on its own.
func TestUnreachableHeartbeatsLoseTheLease(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		sp := newSpy(e.src)
		started := make(chan string, 1)
		causes := make(chan error, 1)
		w := newWorker(t, sp, worker.Config{Lease: 1500 * time.Millisecond})
		w.Handle("test.long.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			started <- task.ID
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil, ctx.Err()
		})
		e.create(t, "test.long.v1", `{}`)
		r := start(t, w)
		recv(t, started, "the handler to start")
		sp.heartbeat.Store(2)
		if cause := recv(t, causes, "the handler's context to be cancelled"); !errors.Is(cause, client.ErrLeaseLost) {
			t.Fatalf("cause = %v", cause)
		}
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		if sp.completes.Load() != 0 || sp.fails.Load() != 0 {
			t.Fatalf("reports after the lease was lost: %d completes, %d fails", sp.completes.Load(), sp.fails.Load())
		}
	})
}

func TestHeartbeatsKeepALongTask(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		sp := newSpy(e.src)
		release := make(chan struct{})
		w := newWorker(t, sp, worker.Config{Lease: 1500 * time.Millisecond})
		w.Handle("test.long.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			select {
			case <-release:
				return "done", nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		})
		id := e.create(t, "test.long.v1", `{}`)
		start(t, w)
		// Outlive two leases' worth of heartbeats.
		e.waitTask(t, id, "heartbeats", func(*client.Task) bool { return sp.beats.Load() >= 6 })
		close(release)
		task := e.waitTask(t, id, "success", status(client.TaskSucceeded))
		if task.Attempt != 1 {
			t.Fatalf("task %s", task.Raw)
		}
		if evs := e.events(t, id); countEvents(evs, "heartbeat") < 6 || countEvents(evs, "lease_expired") != 0 {
			t.Fatalf("events %+v", evs)
		}
	})
}

func TestGracefulShutdownWaitsForHandlers(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		started := make(chan string, 1)
		release := make(chan struct{})
		ctxErr := make(chan error, 1)
		w := newWorker(t, e.src, worker.Config{Lease: 5 * time.Second, ShutdownTimeout: time.Minute})
		w.Handle("test.slow.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			started <- task.ID
			<-release
			ctxErr <- ctx.Err()
			return map[string]string{"finished": task.ID}, nil
		})
		id := e.create(t, "test.slow.v1", `{}`)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		recv(t, started, "the handler to start")
		cancel()
		// Claiming stops at once: a task created now stays pending.
		later := e.create(t, "test.slow.v1", `{}`)
		select {
		case err := <-done:
			t.Fatalf("Run returned %v while a handler was running", err)
		default:
		}
		close(release)
		if err := recv(t, ctxErr, "the handler to return"); err != nil {
			t.Fatalf("the handler's context ended (%v) before the shutdown timeout", err)
		}
		if err := recv(t, done, "Run to return"); err != nil {
			t.Fatal(err)
		}
		// Run returned after reporting.
		task := e.get(t, id)
		if task.Status != client.TaskSucceeded || string(task.Result) != fmt.Sprintf(`{"finished":%q}`, id) {
			t.Fatalf("task %s", task.Raw)
		}
		if task := e.get(t, later); task.Status != client.TaskPending || task.Attempt != 0 {
			t.Fatalf("task created during shutdown: %s", task.Raw)
		}
	})
}

func TestShutdownTimeoutCancelsHandlers(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		started := make(chan string, 1)
		causes := make(chan error, 1)
		w := newWorker(t, e.src, worker.Config{Lease: 5 * time.Second, ShutdownTimeout: 300 * time.Millisecond})
		w.Handle("test.stuck.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			started <- task.ID
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil, fmt.Errorf("interrupted: %w", context.Cause(ctx))
		})
		id := e.create(t, "test.stuck.v1", `{}`)
		r := start(t, w)
		recv(t, started, "the handler to start")
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		if cause := recv(t, causes, "the handler's cause"); !errors.Is(cause, worker.ErrShutdown) {
			t.Fatalf("cause = %v", cause)
		}
		// The interrupted attempt was reported as a retryable failure.
		task := e.get(t, id)
		if task.Status != client.TaskPending || task.Attempt != 1 || !strings.Contains(task.LastError, "shutdown timeout") {
			t.Fatalf("task %s", task.Raw)
		}
	})
}

func TestIdleShutdownIsImmediate(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		sp := newSpy(e.src)
		w := newWorker(t, sp, worker.Config{PollWait: time.Minute})
		w.Handle("test.none.v1", func(ctx context.Context, task *worker.Task) (any, error) { return nil, nil })
		r := start(t, w)
		// Stop during the long-poll: it is abandoned, not waited out.
		recv(t, sp.claiming, "the long-poll to start")
		begin := time.Now()
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(begin); d > 5*time.Second {
			t.Fatalf("Run took %s to return from an idle long-poll", d)
		}
	})
}

func TestClaimErrorsBackOff(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		sp := newSpy(e.src)
		sp.claimErrs.Store(4)
		w := newWorker(t, sp, worker.Config{})
		w.Handle("test.echo.v1", func(ctx context.Context, task *worker.Task) (any, error) { return task.Payload, nil })
		id := e.create(t, "test.echo.v1", `{"x": 1}`)
		start(t, w)
		task := e.waitTask(t, id, "success", status(client.TaskSucceeded))
		if string(task.Result) != `{"x":1}` || sp.claimErrs.Load() != 0 {
			t.Fatalf("task %s; claim errors left %d", task.Raw, sp.claimErrs.Load())
		}
	})
}

func TestReportRetriesTransientErrors(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		sp := newSpy(e.src)
		sp.completeErrs <- &client.APIError{StatusCode: http.StatusBadGateway, Message: "bad gateway"}
		sp.completeErrs <- errors.New("connection reset by peer")
		w := newWorker(t, sp, worker.Config{Lease: 5 * time.Second})
		w.Handle("test.echo.v1", func(ctx context.Context, task *worker.Task) (any, error) { return "ok", nil })
		id := e.create(t, "test.echo.v1", `{}`)
		start(t, w)
		task := e.waitTask(t, id, "success", status(client.TaskSucceeded))
		if string(task.Result) != `"ok"` || sp.completes.Load() != 3 {
			t.Fatalf("task %s after %d complete calls", task.Raw, sp.completes.Load())
		}
	})
}

func TestReportStopsOnRefusal(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		sp := newSpy(e.src)
		sp.completeErrs <- &client.APIError{StatusCode: http.StatusConflict, Code: client.CodeStaleLease, Message: "stale lease token"}
		w := newWorker(t, sp, worker.Config{Lease: 5 * time.Second})
		handled := make(chan string, 1)
		w.Handle("test.echo.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			handled <- task.ID
			return "ok", nil
		})
		id := e.create(t, "test.echo.v1", `{}`)
		r := start(t, w)
		recv(t, handled, "the handler to run")
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		if n := sp.completes.Load(); n != 1 {
			t.Fatalf("a refused report was sent %d times", n)
		}
		if task := e.get(t, id); task.Status != client.TaskLeased {
			t.Fatalf("task %s", task.Raw)
		}
	})
}

const thumbsWorkflow = `{"name": "thumbs", "tasks": {
	"upload": {"task": {"type": "content.upload.v1", "payload": {"f": "{{trigger.body.f}}"}}},
	"resize": {"needs": ["upload"], "task": {"type": "content.thumbnail.v1", "payload": {"id": "{{tasks.upload.body.id}}"}}, "retries": 4}}}`

func TestWorkflowTaskSteps(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		if _, err := e.c.CreateWorkflow(ctx, []byte(thumbsWorkflow)); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		seen := map[string]*worker.Task{}
		w := newWorker(t, e.src, worker.Config{Types: []string{"content.%"}, Concurrency: 2, Lease: 5 * time.Second})
		w.Handle("content.upload.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			mu.Lock()
			seen[task.Step] = task
			mu.Unlock()
			var in struct{ F string }
			if err := task.Decode(&in); err != nil {
				return nil, worker.NonRetryable(err)
			}
			return map[string]string{"id": "up-" + in.F}, nil
		})
		w.Handle("content.thumbnail.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			mu.Lock()
			seen[task.Step] = task
			mu.Unlock()
			var in struct{ ID string }
			if err := task.Decode(&in); err != nil {
				return nil, worker.NonRetryable(err)
			}
			return map[string]any{"thumb": in.ID + "-small", "width": 128}, nil
		})
		start(t, w)
		res, _, err := e.c.Trigger(ctx, "thumbs", json.RawMessage(`{"f": "cat.png"}`), "")
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(waitFor)
		var run *client.Run
		for {
			if run, err = e.c.GetRun(ctx, res.RunID); err != nil {
				t.Fatal(err)
			}
			if run.Terminal() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("run did not finish: %s", run.Raw)
			}
			time.Sleep(10 * time.Millisecond) // polling interval
		}
		if run.Status != client.RunCompleted {
			t.Fatalf("run %s", run.Raw)
		}
		resize := run.Task("resize")
		if resize == nil || resize.Status != client.StepSuccess || string(resize.Body) != `{"thumb":"up-cat.png-small","width":128}` {
			t.Fatalf("tasks.resize = %+v (run %s)", resize, run.Raw)
		}
		if up := run.Task("upload"); up == nil || string(up.Body) != `{"id":"up-cat.png"}` {
			t.Fatalf("tasks.upload = %+v", up)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != 2 || seen["upload"].RunID != res.RunID || seen["resize"].RunID != res.RunID ||
			string(seen["resize"].Payload) != `{"id":"up-cat.png"}` || seen["resize"].MaxAttempts != 5 {
			t.Fatalf("handlers saw %+v / %+v", seen["upload"], seen["resize"])
		}
	})
}

func TestRunRejectsUnusableConfig(t *testing.T) {
	srv := ferrytest.Start(t)
	ctx := context.Background()
	if err := worker.New(srv.Engine, worker.Config{}).Run(ctx); err == nil || !strings.Contains(err.Error(), "nothing to claim") {
		t.Fatalf("no types: %v", err)
	}
	if err := worker.New(srv.Engine, worker.Config{Types: []string{"a.%.b"}}).Run(ctx); err == nil {
		t.Fatal("a % inside a type was accepted")
	}
	if err := worker.New(srv.Engine, worker.Config{Types: []string{"a.b.v1"}, Lease: time.Millisecond}).Run(ctx); err == nil {
		t.Fatal("a lease under a second was accepted")
	}
	// Every claim would be refused (lease_seconds is 1 to 3600): the
	// worker would claim in vain until stopped.
	if err := worker.New(srv.Engine, worker.Config{Types: []string{"a.b.v1"}, Lease: 2 * time.Hour}).Run(ctx); err == nil {
		t.Fatal("a lease over an hour was accepted")
	}
	many := make([]string, 101)
	for i := range many {
		many[i] = fmt.Sprintf("t%d.v1", i)
	}
	if err := worker.New(srv.Engine, worker.Config{Types: many}).Run(ctx); err == nil {
		t.Fatal("101 types were accepted")
	}
	if err := worker.New(srv.Engine, worker.Config{Types: []string{"a.b.v1"}, WorkerID: strings.Repeat("w", 256)}).Run(ctx); err == nil {
		t.Fatal("a 256-byte worker id was accepted")
	}
}

func TestNonRetryable(t *testing.T) {
	base := errors.New("bad input")
	err := fmt.Errorf("step: %w", worker.NonRetryable(base))
	if !worker.IsNonRetryable(err) || !errors.Is(err, base) || err.Error() != "step: bad input" {
		t.Fatalf("wrapped: %v", err)
	}
	if worker.IsNonRetryable(base) || worker.IsNonRetryable(nil) || worker.NonRetryable(nil) != nil {
		t.Fatal("plain errors are retryable")
	}
}

func TestDecode(t *testing.T) {
	var v struct{ A int }
	if err := (&worker.Task{Payload: json.RawMessage(`{"a": 3}`)}).Decode(&v); err != nil || v.A != 3 {
		t.Fatalf("decode: %v %+v", err, v)
	}
	if err := (&worker.Task{}).Decode(&v); err != nil {
		t.Fatalf("empty payload: %v", err)
	}
	if err := (&worker.Task{ID: "x", Type: "a.b.v1", Payload: json.RawMessage(`[1]`)}).Decode(&v); err == nil || !strings.Contains(err.Error(), "a.b.v1") {
		t.Fatalf("mismatch: %v", err)
	}
}

// Cancelling a run cancels its task steps: the worker holding one learns it
// from its heartbeat.
func TestRunCancelStopsTaskStep(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		if _, err := e.c.CreateWorkflow(ctx, []byte(thumbsWorkflow)); err != nil {
			t.Fatal(err)
		}
		sp := newSpy(e.src)
		started := make(chan *worker.Task, 1)
		causes := make(chan error, 1)
		w := newWorker(t, sp, worker.Config{Lease: 1500 * time.Millisecond})
		w.Handle("content.upload.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			started <- task
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return map[string]string{"id": "late"}, nil
		})
		r := start(t, w)
		res, _, err := e.c.Trigger(ctx, "thumbs", json.RawMessage(`{"f": "dog.png"}`), "")
		if err != nil {
			t.Fatal(err)
		}
		task := recv(t, started, "the upload handler to start")
		if task.RunID != res.RunID || task.Step != "upload" {
			t.Fatalf("task %+v", task)
		}
		if _, err := e.c.CancelRun(ctx, res.RunID); err != nil {
			t.Fatal(err)
		}
		if cause := recv(t, causes, "the handler's context to be cancelled"); !errors.Is(cause, worker.ErrTaskCancelled) {
			t.Fatalf("cause = %v", cause)
		}
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		if got := e.get(t, task.ID); got.Status != client.TaskCancelled || got.Result != nil {
			t.Fatalf("task %s", got.Raw)
		}
		if sp.completes.Load() != 0 || sp.fails.Load() != 0 {
			t.Fatal("the cancelled step's result was reported")
		}
	})
}

func TestUnencodableResultFails(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		w := newWorker(t, e.src, worker.Config{Lease: 5 * time.Second})
		w.Handle("test.chan.v1", func(ctx context.Context, task *worker.Task) (any, error) { return make(chan int), nil })
		id := e.create(t, "test.chan.v1", `{}`, retryFast)
		start(t, w)
		task := e.waitTask(t, id, "failure", status(client.TaskFailed))
		if task.Attempt != 1 || !strings.Contains(task.LastError, "encode the handler's result") {
			t.Fatalf("task %s", task.Raw)
		}
	})
}

// TestEagerChain: completing a step hands the worker the run's next step
// (eager dispatch), so every step after the first is claimed by the
// completion itself; with NoEager every step goes through a claim.
func TestEagerChain(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		def := []byte(`{"name": "chain3", "tasks": {
			"s1": {"task": {"type": "chain.step.v1"}},
			"s2": {"needs": ["s1"], "task": {"type": "chain.step.v1", "payload": {"prev": "{{tasks.s1.body.step}}"}}},
			"s3": {"needs": ["s2"], "task": {"type": "chain.step.v1", "payload": {"prev": "{{tasks.s2.body.step}}"}}}}}`)
		if _, err := e.c.CreateWorkflow(ctx, def); err != nil {
			t.Fatal(err)
		}
		for _, eager := range []bool{true, false} {
			w := newWorker(t, e.src, worker.Config{Concurrency: 1, Lease: 5 * time.Second, NoEager: !eager})
			seen := make(chan [2]string, 8) // step<prev, task id
			w.Handle("chain.step.v1", func(ctx context.Context, task *worker.Task) (any, error) {
				var in struct{ Prev string }
				if err := task.Decode(&in); err != nil {
					return nil, worker.NonRetryable(err)
				}
				seen <- [2]string{task.Step + "<" + in.Prev, task.ID}
				return map[string]any{"step": task.Step}, nil
			})
			r := start(t, w)
			if _, _, err := e.c.Trigger(ctx, "chain3", json.RawMessage(`{}`), ""); err != nil {
				t.Fatal(err)
			}
			for i, want := range []string{"s1<", "s2<s1", "s3<s2"} {
				got := recv(t, seen, want)
				if got[0] != want {
					t.Fatalf("eager=%v: handled %s, want %s", eager, got[0], want)
				}
				k := e.waitTask(t, got[1], "succeeded", status("succeeded"))
				handed := false
				for _, ev := range e.events(t, k.ID) {
					if ev.Type == "claimed" && strings.Contains(string(ev.Data), `"eager":true`) {
						handed = true
					}
				}
				if wantHanded := eager && i > 0; handed != wantHanded {
					t.Errorf("eager=%v: step %s handed over by the completion = %v, want %v", eager, k.Step, handed, wantHanded)
				}
			}
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// endlessChain is a source whose every completion hands over one more task.
type endlessChain struct {
	mu       sync.Mutex
	n        int
	stopped  atomic.Bool
	afterCut atomic.Int64 // eager completions asked for after stop
	first    chan struct{}
}

func (s *endlessChain) next() client.ClaimedTask {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return client.ClaimedTask{ID: fmt.Sprintf("t%d", s.n), Type: "chain.endless.v1", Attempt: 1, MaxAttempts: 1, LeaseToken: "tok", LeaseUntil: time.Now().Add(time.Minute)}
}

func (s *endlessChain) ClaimTasks(ctx context.Context, req client.ClaimRequest) ([]client.ClaimedTask, error) {
	select {
	case <-s.first:
		<-ctx.Done() // one task only; then long-poll until stopped
		return nil, ctx.Err()
	default:
		close(s.first)
		return []client.ClaimedTask{s.next()}, nil
	}
}

func (s *endlessChain) Heartbeat(context.Context, string, string, time.Duration) (client.HeartbeatResult, error) {
	return client.HeartbeatResult{LeaseUntil: time.Now().Add(time.Minute)}, nil
}
func (s *endlessChain) CompleteTask(context.Context, string, string, any) error      { return nil }
func (s *endlessChain) FailTask(context.Context, string, string, string, bool) error { return nil }
func (s *endlessChain) CompleteTaskAndClaim(context.Context, string, string, any, client.ClaimRequest) ([]client.ClaimedTask, error) {
	if s.stopped.Load() {
		s.afterCut.Add(1)
	}
	return []client.ClaimedTask{s.next()}, nil
}

// TestEagerStopsAtShutdown: once Run's context ends, completions stop
// asking for more work, so a chain that would never end lets the worker
// stop at once instead of at the shutdown timeout.
func TestEagerStopsAtShutdown(t *testing.T) {
	src := &endlessChain{first: make(chan struct{})}
	w := newWorker(t, src, worker.Config{Types: []string{"chain.%"}, Concurrency: 1, Lease: 5 * time.Second, ShutdownTimeout: time.Minute})
	handled := make(chan struct{}, 1)
	w.Handle("chain.endless.v1", func(ctx context.Context, task *worker.Task) (any, error) {
		select {
		case handled <- struct{}{}:
		default:
		}
		return nil, nil
	})
	r := start(t, w)
	for range 3 { // the chain is running eagerly
		recv(t, handled, "an eager task")
	}
	// Cancel first, then mark the source: completions that ask after the
	// mark are counted, and since the worker checks its context before
	// asking, at most the one that checked before the cancel may.
	began := time.Now()
	r.cancel()
	src.stopped.Store(true)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("Run took %s to stop with an endless eager chain (shutdown timeout 1m)", took)
	}
	if n := src.afterCut.Load(); n > 1 {
		t.Errorf("%d eager completions asked for more work after the stop, want at most the one in flight", n)
	}
}

// poolSource hands out up to Max of a fixed pool of tasks per claim and
// records each claim's Max.
type poolSource struct {
	endlessChain
	mu2  sync.Mutex
	left int
	maxs []int
}

func (s *poolSource) ClaimTasks(ctx context.Context, req client.ClaimRequest) ([]client.ClaimedTask, error) {
	s.mu2.Lock()
	s.maxs = append(s.maxs, req.Max)
	n := min(req.Max, s.left)
	s.left -= n
	s.mu2.Unlock()
	if n == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	out := make([]client.ClaimedTask, n)
	for i := range out {
		out[i] = s.next()
	}
	return out, nil
}

// TestPrefetch: a claim asks for Prefetch tasks beyond the free slots; the
// extra ones wait for a slot, so no more than Concurrency run at once.
func TestPrefetch(t *testing.T) {
	src := &poolSource{left: 4}
	w := newWorker(t, src, worker.Config{Types: []string{"chain.%"}, Concurrency: 1, Prefetch: 3, Lease: 5 * time.Second, NoEager: true})
	var running, most atomic.Int64
	handled := make(chan struct{}, 8)
	w.Handle("chain.endless.v1", func(ctx context.Context, task *worker.Task) (any, error) {
		n := running.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		running.Add(-1)
		handled <- struct{}{}
		return nil, nil
	})
	start(t, w)
	for i := range 4 {
		recv(t, handled, fmt.Sprintf("task %d", i+1))
	}
	src.mu2.Lock()
	first := src.maxs[0]
	src.mu2.Unlock()
	if first != 4 {
		t.Errorf("first claim asked for %d, want 4 (1 free slot + prefetch 3)", first)
	}
	if m := most.Load(); m != 1 {
		t.Errorf("%d handlers ran at once, want at most Concurrency (1)", m)
	}
}

// lostWatch reports the tasks whose heartbeat found the lease lost.
type lostWatch struct {
	worker.Source
	lost chan string
}

func (s *lostWatch) Heartbeat(ctx context.Context, id, token string, lease time.Duration) (client.HeartbeatResult, error) {
	res, err := s.Source.Heartbeat(ctx, id, token, lease)
	if errors.Is(err, client.ErrLeaseLost) {
		s.lost <- id
	}
	return res, err
}

// TestStalePrefetchedTaskIsNotRun: a prefetched task that waited for its
// slot until its lease ran out, and that another worker took meanwhile,
// is dropped without running its handler when its slot frees up (the
// task would otherwise run twice), also once the worker has begun to
// shut down (prefetched tasks still start then).
func TestStalePrefetchedTaskIsNotRun(t *testing.T) {
	for _, shutdown := range []bool{false, true} {
		t.Run(map[bool]string{false: "running", true: "shutting down"}[shutdown], func(t *testing.T) {
			stalePrefetched(t, shutdown)
		})
	}
}

func stalePrefetched(t *testing.T, shutdown bool) {
	eachSource(t, func(t *testing.T, e *env) {
		src := &lostWatch{Source: e.src, lost: make(chan string, 16)}
		w := newWorker(t, src, worker.Config{Types: []string{"test.stale.v1"}, Concurrency: 1, Prefetch: 1, Lease: time.Second, NoEager: true})
		first := e.create(t, "test.stale.v1", `{"n": 1}`)
		second := e.create(t, "test.stale.v1", `{"n": 2}`)
		started := make(chan string, 4)
		release := make(chan struct{})
		w.Handle("test.stale.v1", func(ctx context.Context, task *worker.Task) (any, error) {
			started <- task.ID
			if task.ID == first {
				<-release
			}
			return "done", nil
		})
		run := start(t, w)
		if got := recv(t, started, "the first handler"); got != first {
			t.Fatalf("first handler ran task %s, want %s", got, first)
		}
		// The second task waits in the worker's buffer; once its lease
		// has run out another worker takes it.
		deadline := time.Now().Add(waitFor)
		for {
			got, err := e.src.ClaimTasks(context.Background(), client.ClaimRequest{Types: []string{"test.stale.v1"}, WorkerID: "thief", Lease: time.Minute, Max: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 1 {
				if got[0].ID != second {
					t.Fatalf("the thief took %s, want the prefetched %s", got[0].ID, second)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the prefetched task's lease never ran out")
			}
			time.Sleep(50 * time.Millisecond) // polling interval
		}
		stopped := make(chan error, 1)
		if shutdown {
			go func() { stopped <- run.stop(t) }()
		}
		close(release)
		select {
		case got := <-src.lost:
			if got != second {
				t.Fatalf("lease lost for %s, want %s", got, second)
			}
		case id := <-started:
			t.Fatalf("handler ran task %s after its lease was taken", id)
		case <-time.After(waitFor):
			t.Fatal("timed out waiting for the stale task's heartbeat")
		}
		e.waitTask(t, first, "success", status(client.TaskSucceeded))
		if shutdown {
			if err := recv(t, stopped, "the worker's shutdown"); err != nil {
				t.Fatalf("Run: %v", err)
			}
		}
		select {
		case id := <-started:
			t.Fatalf("handler ran task %s after its lease was taken", id)
		default:
		}
	})
}

// pathCounter counts a client's requests by method and path pattern;
// hold, if set, is called before a request goes out.
type pathCounter struct {
	mu    sync.Mutex
	n     map[string]int
	inner http.RoundTripper
	hold  func(key string)
}

func (p *pathCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	key := r.Method + " " + r.URL.Path
	if strings.HasPrefix(r.URL.Path, "/api/v1/tasks/") && strings.HasSuffix(r.URL.Path, "/complete") && r.URL.Path != "/api/v1/tasks/complete" {
		key = r.Method + " /api/v1/tasks/{id}/complete"
	}
	p.mu.Lock()
	p.n[key]++
	p.mu.Unlock()
	if p.hold != nil {
		p.hold(key)
	}
	return p.inner.RoundTrip(r)
}

func (p *pathCounter) count(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[key]
}

// maxInFlight is worker.maxReportsInFlight, the completion requests a
// worker sends at once before completions queue and go together.
const maxInFlight = 32

// TestBatchedCompletions: over HTTP, completions of handlers that finish
// together go in shared requests once maxInFlight are in flight, each task
// stored with its own result; with NoBatch each goes alone.
func TestBatchedCompletions(t *testing.T) {
	for _, noBatch := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoBatch=%v", noBatch), func(t *testing.T) {
			t.Parallel()
			srv := ferrytest.Start(t)
			pc := &pathCounter{n: map[string]int{}, inner: client.NewTransport()}
			c := client.New(srv.URL, srv.Key, client.WithHTTPClient(&http.Client{Transport: pc}))
			e := &env{srv: srv, c: c, src: c, prod: c}
			const n, slots = maxInFlight + 64, maxInFlight + 64
			ids := make([]string, n)
			for i := range ids {
				ids[i] = e.create(t, "test.batch.v1", fmt.Sprintf(`{"n": %d}`, i))
			}
			// The handlers wait until all slots are busy, then return at
			// once, and the first completion requests are held until all
			// have returned: maxInFlight reports go alone, the other 64
			// pile up behind them and leave together.
			var running, returned atomic.Int32
			gate := make(chan struct{})
			var once sync.Once
			pc.hold = func(key string) {
				deadline := time.Now().Add(waitFor)
				for strings.HasSuffix(key, "/complete") && returned.Load() < n && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond) // polling a counter the handlers move
				}
			}
			w := newWorker(t, c, worker.Config{Concurrency: slots, Lease: 10 * time.Second, NoBatch: noBatch})
			w.Handle("test.batch.v1", func(ctx context.Context, task *worker.Task) (any, error) {
				defer returned.Add(1)
				if running.Add(1) >= slots {
					once.Do(func() { close(gate) })
				}
				select {
				case <-gate:
				case <-time.After(waitFor):
				}
				var in struct{ N int }
				if err := task.Decode(&in); err != nil {
					return nil, worker.NonRetryable(err)
				}
				return map[string]int{"n": in.N}, nil
			})
			start(t, w)
			for i, id := range ids {
				task := e.waitTask(t, id, "success", status(client.TaskSucceeded))
				if string(task.Result) != fmt.Sprintf(`{"n":%d}`, i) {
					t.Fatalf("task %d result %s", i, task.Result)
				}
			}
			batched, alone := pc.count("POST /api/v1/tasks/complete"), pc.count("POST /api/v1/tasks/{id}/complete")
			if noBatch {
				if batched != 0 || alone != n {
					t.Fatalf("NoBatch: %d batched requests, %d alone for %d tasks", batched, alone, n)
				}
				return
			}
			t.Logf("%d batched requests for %d tasks", batched, n)
			// ≈33 in the usual run; the bound leaves room for reports
			// descheduled past the held requests on a busy machine.
			if alone != 0 || batched > n-16 {
				t.Fatalf("%d batched requests, %d alone for %d tasks", batched, alone, n)
			}
		})
	}
}

// TestNilRawMessageResultRecordsNull: a nil json.RawMessage given to
// CompleteTask records null, as an untyped nil does, through the client
// and the embedded engine alike (both refused it as "not valid JSON",
// though the client's doc says nil records null).
func TestNilRawMessageResultRecordsNull(t *testing.T) {
	eachSource(t, func(t *testing.T, e *env) {
		k := e.create(t, "test.raw.v1", `{}`)
		got, err := e.src.ClaimTasks(t.Context(), client.ClaimRequest{Types: []string{"test.raw.v1"}, WorkerID: "w", Lease: 5 * time.Second, Max: 1})
		if err != nil || len(got) != 1 {
			t.Fatalf("claim: %d tasks, %v", len(got), err)
		}
		if err := e.src.CompleteTask(t.Context(), got[0].ID, got[0].LeaseToken, json.RawMessage(nil)); err != nil {
			t.Fatalf("CompleteTask with a nil json.RawMessage: %v", err)
		}
		task := e.waitTask(t, k, "success", status(client.TaskSucceeded))
		if task.Result != nil || task.Attempt != 1 {
			t.Fatalf("result %s at attempt %d, want null at 1", task.Result, task.Attempt)
		}
	})
}

// TestRunReturnsWhenTheKeyIsRefused: a worker whose API key the server
// refuses (401) stops and Run returns an error saying so, with the
// APIError inside; it backed off and logged warnings for ever while it
// looked up to whoever supervised it.
func TestRunReturnsWhenTheKeyIsRefused(t *testing.T) {
	srv := ferrytest.Start(t)
	w := newWorker(t, client.New(srv.URL, "fry_not_a_key"), worker.Config{Types: []string{"test.%"}, Lease: 5 * time.Second})
	w.Handle("test.x.v1", func(ctx context.Context, task *worker.Task) (any, error) { return nil, nil })
	ran := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { ran <- w.Run(ctx) }()
	select {
	case err := <-ran:
		if !client.HasCode(err, client.CodeUnauthorized) || !strings.Contains(err.Error(), "refused the API key") {
			t.Fatalf("Run: %v, want the refused key's 401", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Run went on with a key the server refuses")
	}
}

// TestShutdownErrorSaysReportsWereNotDelivered: when the shutdown
// deadline passes while a finished task's outcome is still being sent
// (the server unreachable), Run's error says so; it said the handler had
// ignored its cancelled context, which it had not.
func TestShutdownErrorSaysReportsWereNotDelivered(t *testing.T) {
	srv := ferrytest.Start(t)
	c := client.New(srv.URL, srv.Key)
	sp := newSpy(c)
	for range cap(sp.completeErrs) {
		sp.completeErrs <- errors.New("dial tcp: connection refused")
	}
	// A lease of 6 s: the report retries past the shutdown deadline and
	// its grace (5.1 s), then gives up (five attempts and the lease's
	// time), in the background.
	// Its log goes nowhere: the abandoned report outlives the test.
	w := newWorker(t, sp, worker.Config{Types: []string{"test.%"}, Lease: 6 * time.Second, ShutdownTimeout: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	w.Handle("test.x.v1", func(ctx context.Context, task *worker.Task) (any, error) { return nil, nil })
	if _, _, err := c.CreateTask(context.Background(), client.NewTask{Type: "test.x.v1"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	testwait.Until(t, waitFor, "the first report to fail", func() bool { return sp.completes.Load() > 0 })
	cancel()
	err := recv(t, ran, "Run")
	if err == nil || !strings.Contains(err.Error(), "could not be reported") || strings.Contains(err.Error(), "still running") {
		t.Errorf("Run: %v, want an error saying the outcome could not be reported", err)
	}
}
