package tracing

import (
	"context"
	"crypto/sha256"
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ferryhq/ferry/internal/httpwrap"
	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
)

// ScopeName is the instrumentation scope of Ferry's spans.
const ScopeName = "github.com/ferryhq/ferry"

// Header names a run's trace context is recorded under among its trigger
// headers: canonical, as the HTTP API records a request's headers.
const (
	HeaderTraceparent = "Traceparent"
	HeaderTracestate  = "Tracestate"
)

// Span attributes of Ferry's own (the others follow OpenTelemetry's
// semantic conventions for HTTP).
const (
	AttrRunID           = "ferry.run.id"
	AttrWorkflowID      = "ferry.workflow.id"
	AttrWorkflowVersion = "ferry.workflow.version"
	AttrWorkflow        = "ferry.workflow"
	AttrRuns            = "ferry.runs"
	AttrStep            = "ferry.step.name"
	AttrStepType        = "ferry.step.type"
	AttrStatus          = "ferry.status"
	AttrAttempt         = "ferry.step.attempt"
)

// Tracer makes Ferry's spans. The zero value and New(nil) trace nothing
// and cost nothing beyond a check.
type Tracer struct {
	t    trace.Tracer
	prop propagation.TextMapPropagator
}

// New traces with tp; nil, or a no-op provider, traces nothing.
func New(tp trace.TracerProvider) *Tracer {
	if tp == nil {
		return &Tracer{}
	}
	if _, ok := tp.(noop.TracerProvider); ok {
		return &Tracer{}
	}
	// W3C trace context only: a caller's baggage, recorded among a run's
	// trigger headers, is not sent on to the endpoints its HTTP steps call.
	return &Tracer{t: tp.Tracer(ScopeName), prop: propagation.TraceContext{}}
}

// Enabled tells whether spans are made.
func (t *Tracer) Enabled() bool { return t != nil && t.t != nil }

func nothing(error) {}

// Middleware makes a server span of each request next serves, a child of
// the trace context its headers carry, named by the route its ServeMux
// matched ("POST /api/workflows/{id}/trigger").
func (t *Tracer) Middleware(next http.Handler) http.Handler {
	if !t.Enabled() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := t.t.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("url.path", httpwrap.RedactPath(r.URL.Path)),
		))
		sw := httpwrap.NewStatusWriter(w)
		r2 := r.WithContext(ctx)
		defer func() {
			// The mux set the pattern on the request it was given: the
			// middlewares outside this one (metrics) read it from theirs.
			r.Pattern = r2.Pattern
			code := sw.Code
			if p := recover(); p != nil {
				if !sw.Written {
					code = http.StatusInternalServerError
				}
				end(span, r2.Pattern, r.Method, code)
				panic(p)
			}
			end(span, r2.Pattern, r.Method, code)
		}()
		next.ServeHTTP(sw, r2)
	})
}

// end names a request's span by its route, or by its method alone when
// no route took it: no pattern matched, or a catch-all answered (the
// API's "/api/" and "/" give JSON 404s and 405s), whose pattern names no
// route.
func end(span trace.Span, route, method string, code int) {
	if route != "" && route != "/api/" && route != "/" {
		span.SetName(route)
		span.SetAttributes(attribute.String("http.route", route))
	} else {
		span.SetName(method)
	}
	span.SetAttributes(attribute.Int("http.response.status_code", code))
	if code >= 500 {
		span.SetStatus(codes.Error, http.StatusText(code))
	}
	span.End()
}

// Trigger starts the span of a trigger of runs runs of workflow (an id or
// a name) and returns its context, and the function that ends it.
func (t *Tracer) Trigger(ctx context.Context, workflow string, runs int) (context.Context, func(error)) {
	if !t.Enabled() {
		return ctx, nothing
	}
	ctx, span := t.t.Start(ctx, "ferry.trigger", trace.WithAttributes(
		attribute.String(AttrWorkflow, workflow), attribute.Int(AttrRuns, runs)))
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// Headers returns a run's trigger headers h with ctx's trace context
// recorded (Traceparent, and Tracestate when there is one), unless h
// already carries a valid traceparent (the caller's, which then wins) or
// ctx has no valid span. h is not changed: a copy is returned, or h
// itself. A malformed traceparent of the caller's is replaced, with its
// tracestate.
func (t *Tracer) Headers(ctx context.Context, h map[string]string) map[string]string {
	if !t.Enabled() || !trace.SpanContextFromContext(ctx).IsValid() {
		return h
	}
	if t.carried(h) {
		return h
	}
	return t.with(ctx, h)
}

// with is a copy of h with ctx's trace context in place of any h holds,
// under canonical keys.
func (t *Tracer) with(ctx context.Context, h map[string]string) map[string]string {
	out := make(map[string]string, len(h)+2)
	for k, v := range h {
		if !strings.EqualFold(k, HeaderTraceparent) && !strings.EqualFold(k, HeaderTracestate) {
			out[k] = v
		}
	}
	c := propagation.MapCarrier{}
	t.prop.Inject(ctx, c) // traceparent, and tracestate when there is one
	for k, v := range c {
		out[http.CanonicalHeaderKey(k)] = v
	}
	return out
}

// carried tells whether h holds a valid trace context.
func (t *Tracer) carried(h map[string]string) bool {
	if _, ok := lookup(h, HeaderTraceparent); !ok {
		return false
	}
	return trace.SpanContextFromContext(t.prop.Extract(context.Background(), headerCarrier(h))).IsValid()
}

// lookup finds key in h whatever its case: the HTTP API records headers
// canonically, a Go caller may not.
func lookup(h map[string]string, key string) (string, bool) {
	if v, ok := h[key]; ok {
		return v, true
	}
	for k, v := range h {
		if strings.EqualFold(k, key) {
			return v, true
		}
	}
	return "", false
}

// headerCarrier reads a run's trigger headers whatever their keys' case.
type headerCarrier map[string]string

func (c headerCarrier) Get(key string) string { v, _ := lookup(c, key); return v }
func (c headerCarrier) Set(string, string)    {}
func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, strings.ToLower(k))
	}
	return keys
}

// runContext is the context a run's spans are children of: the trace
// context its trigger headers carry, or, for a run triggered while
// tracing was off, one derived from its id, so that its spans still share
// a trace.
func (t *Tracer) runContext(runID string, headers map[string]string) context.Context {
	ctx := t.prop.Extract(context.Background(), headerCarrier(headers))
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	sum := sha256.Sum256([]byte("ferry run " + runID))
	var tid trace.TraceID
	var sid trace.SpanID
	copy(tid[:], sum[:16])
	copy(sid[:], sum[16:24])
	return trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true,
	}))
}

// TaskParent is the W3C traceparent of a run's trace context (see
// runContext), handed to workers with the run's tasks so that their spans
// join the run's trace as children of what its steps' spans are children
// of. Empty when tracing is off. A run's tracestate is not handed on: the
// worker is a party of its own.
func (t *Tracer) TaskParent(runID string, headers map[string]string) string {
	if !t.Enabled() {
		return ""
	}
	c := propagation.MapCarrier{}
	t.prop.Inject(t.runContext(runID, headers), c)
	return c.Get("traceparent")
}

// HTTPAttempt starts the client span of an HTTP step's attempt, a child of
// the run's trace context, and returns the request's headers with that
// span's context added (a copy: headers, the stored request's, is not
// changed), and the function that ends the span with the response's
// status code (0 when none came) and the attempt's error. A traceparent
// the step's own headers set is left as it is.
func (t *Tracer) HTTPAttempt(run *store.Run, step string, attempt int, method, url string, headers map[string]string) (map[string]string, func(code int, err error)) {
	if !t.Enabled() {
		return headers, func(int, error) {}
	}
	ctx := t.runContext(run.ID, run.TriggerHeaders)
	ctx, span := t.t.Start(ctx, method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("http.request.method", method),
		attribute.String("url.full", httpstep.RedactURL(url)),
		attribute.String(AttrRunID, run.ID),
		attribute.String(AttrWorkflowID, run.WorkflowID),
		attribute.String(AttrStep, step),
		attribute.Int(AttrAttempt, attempt),
	))
	done := func(code int, err error) {
		if code != 0 {
			span.SetAttributes(attribute.Int("http.response.status_code", code))
		}
		switch {
		case err != nil:
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		case code >= 400:
			span.SetStatus(codes.Error, "HTTP "+strconv.Itoa(code))
		}
		span.End()
	}
	if v, ok := lookup(headers, HeaderTraceparent); ok && v != "" {
		return headers, done // the step's own
	}
	return t.with(ctx, headers), done
}

// Finished records the span of each step and run a committed write
// ended (store.Store.OnFinished), from its start to its end: "ferry.step
// <name>" and "ferry.run", children of the run's trace context. A step
// that never started (skipped) is a span of no length at its end.
func (t *Tracer) Finished(fs []store.Finished) {
	if !t.Enabled() {
		return
	}
	for i := range fs {
		f := &fs[i]
		start := f.StartedAt
		if start.IsZero() || start.After(f.FinishedAt) {
			start = f.FinishedAt
		}
		name := "ferry.run"
		attrs := []attribute.KeyValue{
			attribute.String(AttrRunID, f.RunID),
			attribute.String(AttrWorkflowID, f.WorkflowID),
			attribute.Int(AttrWorkflowVersion, f.Version),
			attribute.String(AttrStatus, f.Status),
		}
		// A cancellation is asked for, not an error.
		failed := f.Status == status.RunFailed || f.Status == status.RunTimeout
		if f.Step != "" {
			name = "ferry.step " + f.Step
			attrs = append(attrs, attribute.String(AttrStep, f.Step), attribute.String(AttrStepType, f.Type), attribute.Int(AttrAttempt, f.Attempt))
			failed = status.StepFailure(f.Status) && f.Status != status.StepCancelled
		}
		_, span := t.t.Start(t.runContext(f.RunID, f.TriggerHeaders), name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
		if failed {
			msg := f.Error
			if msg == "" {
				msg = f.Status
			}
			span.SetStatus(codes.Error, msg)
		}
		span.End(trace.WithTimestamp(f.FinishedAt))
	}
}
