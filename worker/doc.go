// Package worker runs Go handlers for Ferry's durable inbox: typed tasks that
// Ferry does not execute itself but hands to workers that pull them.
//
// A Worker owns the loop every worker needs: it long-polls for tasks of its
// types (never holding more than Config.Concurrency at once), runs the
// handler registered for each task's type, heartbeats while the handler
// runs, and reports the outcome:
//
//	c := client.New("http://127.0.0.1:8080", os.Getenv("FERRY_API_KEY"))
//	w := worker.New(c, worker.Config{Types: []string{"billing.%"}, Concurrency: 16, Lease: 30 * time.Second})
//	w.Handle("billing.invoice.v1", func(ctx context.Context, t *worker.Task) (any, error) {
//		var in struct{ OrderID int `json:"order_id"` }
//		if err := t.Decode(&in); err != nil {
//			return nil, worker.NonRetryable(err) // a bad payload will not get better
//		}
//		return map[string]any{"invoice": 42}, nil // the task's result (a workflow step's body)
//	})
//	err := w.Run(ctx) // until ctx ends, then a graceful shutdown
//
// The source of tasks is a Source: a *client.Client talks to a server over
// HTTP, and a *ferry.Engine serves an embedded worker in the same process.
// Over HTTP the completions of handlers that finish while 32 reports (for
// a worker of many handlers, fewer) are in flight go together in one
// request (BatchSource; Config.NoBatch turns that off), each still
// answered and retried on its own.
//
// Outcomes:
//   - A handler returning a value completes the task with it (JSON-encoded).
//   - A handler returning an error fails the attempt: the task is retried
//     with backoff while attempts remain, unless the error is wrapped with
//     NonRetryable, which fails the task at once.
//   - A panic is recovered and fails the attempt (retryable) with the panic's
//     message.
//   - A task whose type has no handler (claimed through a prefix in
//     Config.Types) fails at once, not retryable.
//
// The handler's context is cancelled when the task is cancelled
// (context.Cause is ErrTaskCancelled) or its lease is lost (the cause
// matches client.ErrLeaseLost; also when no heartbeat got through for a
// whole lease), both learnt from heartbeats sent every Lease/3. The worker
// then drops whatever the handler returns: the server would refuse it
// anyway.
//
// Each handler runs in an OpenTelemetry span of its own ("ferry.task
// <type>", from Config.TracerProvider, by default the global provider):
// while the server traces, a run's task comes with the run's trace
// context (Task.Traceparent) and the span is its child, so what the
// handler traces joins the run's trace.
//
// When Run's context ends the worker stops claiming at once, lets in-flight
// handlers finish for up to Config.ShutdownTimeout (only then is their
// context cancelled, with cause ErrShutdown), reports their outcomes and
// returns.
package worker
