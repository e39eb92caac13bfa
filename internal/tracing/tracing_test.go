package tracing_test

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/tracing"
)

// TestHeadersRecordsTheTraceContextOnce: a run's trigger headers get ctx's
// traceparent in a copy; headers that carry one, in any case, keep it;
// with no span in ctx, or tracing off, they are returned as they are.
func TestHeadersRecordsTheTraceContextOnce(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	tr := tracing.New(tp)
	ctx, span := tp.Tracer("test").Start(context.Background(), "trigger")
	defer span.End()
	want := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01"

	h := map[string]string{"X-Request-Id": "r1"}
	got := tr.Headers(ctx, h)
	if got["Traceparent"] != want || got["X-Request-Id"] != "r1" || len(h) != 1 {
		t.Errorf("Headers = %v (the caller's map now %v), want X-Request-Id and Traceparent %q in a copy", got, h, want)
	}
	if got := tr.Headers(ctx, nil); got["Traceparent"] != want {
		t.Errorf("Headers(nil) = %v, want Traceparent %q", got, want)
	}
	own := map[string]string{"traceparent": "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01"}
	if got := tr.Headers(ctx, own); len(got) != 1 || got["traceparent"] != own["traceparent"] {
		t.Errorf("Headers of headers with their own traceparent = %v, want them unchanged", got)
	}
	if got := tr.Headers(context.Background(), h); len(got) != 1 {
		t.Errorf("Headers without a span = %v, want h unchanged", got)
	}
	if got := tracing.New(nil).Headers(ctx, h); len(got) != 1 {
		t.Errorf("Headers with tracing off = %v, want h unchanged", got)
	}
}

// TestHTTPAttemptHeadersAndURL: an attempt's request gets the attempt
// span's traceparent, in place of no trace context, but a step's own
// traceparent is kept; the span's url.full holds no credentials or query
// values; a run's malformed traceparent is replaced at its trigger.
func TestHTTPAttemptHeadersAndURL(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tr := tracing.New(tp)
	run := &store.Run{ID: "r1", WorkflowID: "wf", TriggerHeaders: map[string]string{"Baggage": "user=alice", "X-A": "1"}}

	h := map[string]string{"Content-Type": "application/json"}
	got, end := tr.HTTPAttempt(run, "call", 1, "POST", "https://bob:secret@api.example.com/pay?token=abc&x=1", h)
	end(502, nil)
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	want := "00-" + s.SpanContext.TraceID().String() + "-" + s.SpanContext.SpanID().String() + "-01"
	if got["Traceparent"] != want || got["Content-Type"] != "application/json" || len(h) != 1 || got["Baggage"] != "" {
		t.Errorf("the attempt's headers %v (the step's now %v), want the step's, Traceparent %q, no baggage", got, h, want)
	}
	for _, a := range s.Attributes {
		if a.Key == "url.full" {
			if u := a.Value.AsString(); strings.Contains(u, "secret") || strings.Contains(u, "abc") || !strings.Contains(u, "api.example.com/pay") {
				t.Errorf("url.full = %q, want the URL without its password or query values", u)
			}
		}
	}
	if s.Status.Code != codes.Error {
		t.Errorf("a 502's span status %v, want an error", s.Status)
	}

	own := map[string]string{"traceparent": "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01"}
	if got, end := tr.HTTPAttempt(run, "call", 2, "GET", "https://api.example.com/", own); len(got) != 1 || got["traceparent"] != own["traceparent"] {
		t.Errorf("a step's own traceparent: headers %v, want them as they are", got)
	} else {
		end(200, nil)
	}

	ctx, span := tp.Tracer("test").Start(context.Background(), "trigger")
	defer span.End()
	bad := map[string]string{"traceparent": "garbage", "Tracestate": "a=b"}
	if got := tr.Headers(ctx, bad); len(got) != 1 || !strings.Contains(got["Traceparent"], span.SpanContext().SpanID().String()) {
		t.Errorf("Headers of a malformed traceparent = %v, want it replaced by the trigger's", got)
	}
}

// TestTaskParentIsTheRunsTraceContext: a run's tasks are handed out with
// the traceparent its trigger headers carry (whatever its key's case, and
// without the tracestate), and a run without one with the trace derived
// from its id, the one its step spans join; nothing while tracing is off.
func TestTaskParentIsTheRunsTraceContext(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr := tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	caller := "00-0102030405060708090a0b0c0d0e0f10-0807060504030201-01"
	if got := tr.TaskParent("r1", map[string]string{"traceparent": caller, "Tracestate": "a=b"}); got != caller {
		t.Errorf("TaskParent of a run triggered with %q = %q", caller, got)
	}
	got := tr.TaskParent("r2", nil)
	tr.Finished([]store.Finished{{RunID: "r2", Step: "work", Status: "success"}})
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	p := spans[0].Parent
	if want := "00-" + p.TraceID().String() + "-" + p.SpanID().String() + "-01"; got != want {
		t.Errorf("TaskParent of a run with no trace context = %q, want %q (its step spans' parent)", got, want)
	}
	if again := tr.TaskParent("r2", nil); again != got {
		t.Errorf("TaskParent of the same run %q then %q", got, again)
	}
	if got := tracing.New(nil).TaskParent("r1", map[string]string{"Traceparent": caller}); got != "" {
		t.Errorf("TaskParent with tracing off = %q, want none", got)
	}
}
