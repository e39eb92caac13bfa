package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/testwait"
	"github.com/ferryhq/ferry/worker"
)

// TestHandlerSpans: with a server that traces, each task of a run is
// handed out (by a claim, and by the eager claim of the step before) with
// the run's trace context, and the worker's span of the handler is its
// child, in the run's trace; the handler's ctx carries that span. A
// standalone task's handler span has no parent, and a failed handler's
// span is an error.
func TestHandlerSpans(t *testing.T) {
	for _, name := range []string{"http", "embedded"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			serverExp := tracetest.NewInMemoryExporter()
			serverTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(serverExp))
			workerExp := tracetest.NewInMemoryExporter()
			workerTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(workerExp))
			t.Cleanup(func() { _ = serverTP.Shutdown(context.Background()); _ = workerTP.Shutdown(context.Background()) })
			srv := ferrytest.Start(t, func(c *ferry.Config) { c.TracerProvider = serverTP })
			c := client.New(srv.URL, srv.Key)
			var src worker.Source = c
			if name == "embedded" {
				src = srv.Engine
			}
			ctx := context.Background()
			if _, err := c.CreateWorkflow(ctx, []byte(thumbsWorkflow)); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			handled := map[string]trace.SpanContext{} // task type -> the handler's ctx span
			task := map[string]*worker.Task{}
			handle := func(ctx context.Context, tk *worker.Task) (any, error) {
				mu.Lock()
				defer mu.Unlock()
				handled[tk.Type] = trace.SpanContextFromContext(ctx)
				task[tk.Type] = tk
				switch tk.Type {
				case "solo.v1":
					return nil, worker.NonRetryable(errors.New("no good"))
				case "solo.odd.v1":
					return make(chan int), nil // no JSON for it
				}
				return map[string]string{"id": "x"}, nil
			}
			w := newWorker(t, src, worker.Config{Types: []string{"content.%", "solo.%"}, Concurrency: 1, TracerProvider: workerTP})
			for _, typ := range []string{"content.upload.v1", "content.thumbnail.v1", "solo.v1", "solo.odd.v1"} {
				w.Handle(typ, handle)
			}
			// Run inside a span of the application's: the tasks' spans
			// are not its children.
			runCtx, runSpan := workerTP.Tracer("app").Start(context.Background(), "worker main")
			runCtx, stop := context.WithCancel(runCtx)
			done := make(chan error, 1)
			go func() { done <- w.Run(runCtx) }()
			t.Cleanup(func() { stop(); <-done; runSpan.End() })
			res, _, err := c.Trigger(ctx, "thumbs", json.RawMessage(`{"f": "a.png"}`), "")
			if err != nil {
				t.Fatal(err)
			}
			testwait.Until(t, waitFor, "the run completes", func() bool {
				run, err := c.GetRun(ctx, res.RunID)
				return err == nil && run.Status == client.RunCompleted
			})
			var trig trace.SpanContext
			for _, s := range serverExp.GetSpans() {
				if s.Name == "ferry.trigger" {
					trig = s.SpanContext
				}
			}
			if !trig.IsValid() {
				t.Fatal("the server made no trigger span")
			}
			spans := map[string]tracetest.SpanStub{}
			for _, s := range workerExp.GetSpans() {
				spans[s.Name] = s
			}
			mu.Lock()
			for _, typ := range []string{"content.upload.v1", "content.thumbnail.v1"} {
				s, ok := spans["ferry.task "+typ]
				if !ok {
					t.Fatalf("no worker span for %s (spans: %v)", typ, workerExp.GetSpans())
				}
				if s.Parent.TraceID() != trig.TraceID() || s.Parent.SpanID() != trig.SpanID() || s.SpanKind != trace.SpanKindConsumer {
					t.Errorf("%s's span: parent %v/%v kind %v, want the run's trigger span %v/%v, consumer",
						typ, s.Parent.TraceID(), s.Parent.SpanID(), s.SpanKind, trig.TraceID(), trig.SpanID())
				}
				if !handled[typ].Equal(s.SpanContext) {
					t.Errorf("%s's handler ran in span %v, want its own %v", typ, handled[typ].SpanID(), s.SpanContext.SpanID())
				}
				want := "00-" + trig.TraceID().String() + "-" + trig.SpanID().String() + "-01"
				if task[typ].Traceparent != want {
					t.Errorf("%s handed over with traceparent %q, want %q", typ, task[typ].Traceparent, want)
				}
			}
			mu.Unlock()

			for typ, want := range map[string]string{"solo.v1": "no good", "solo.odd.v1": "encode the handler's result: json: unsupported type: chan int"} {
				tk, _, err := c.CreateTask(ctx, client.NewTask{Type: typ, Payload: json.RawMessage(`{}`)})
				if err != nil {
					t.Fatal(err)
				}
				testwait.Until(t, waitFor, typ+" fails", func() bool {
					got, err := c.GetTask(ctx, tk.ID)
					return err == nil && got.Status == client.TaskFailed
				})
				testwait.Until(t, waitFor, typ+"'s span", func() bool {
					for _, s := range workerExp.GetSpans() {
						if s.Name == "ferry.task "+typ {
							spans[s.Name] = s
							return true
						}
					}
					return false
				})
				s := spans["ferry.task "+typ]
				if s.Parent.IsValid() || s.Status.Code != codes.Error || s.Status.Description != want {
					t.Errorf("standalone %s's span: parent %v, status %v, want none (not Run's span), the error %q", typ, s.Parent.SpanID(), s.Status, want)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if task["solo.v1"].Traceparent != "" {
				t.Errorf("a standalone task handed over with traceparent %q", task["solo.v1"].Traceparent)
			}
		})
	}
}
