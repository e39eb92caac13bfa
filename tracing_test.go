package ferry_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/testwait"
)

// TestTracing: a run triggered over the API with a caller's traceparent,
// an HTTP step then a task step, and the spans it makes on each database:
// the API request's server span (the caller's child) and the trigger's
// under it, the HTTP attempt's client span whose context the step's
// request carries, and a span for each step and for the run, once each,
// over their times, in the caller's trace. A run triggered through the Go
// API without one joins the trace of its trigger's span.
func TestTracing(t *testing.T) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			testTracing(t, startOn(t, db, func(c *ferry.Config) { c.TracerProvider = tp }), exp)
		})
	}
}

func testTracing(t *testing.T, srv *ferrytest.Server, exp *tracetest.InMemoryExporter) {
	ctx := context.Background()
	var mu sync.Mutex
	var received []string // the traceparent of each request the step sent
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received = append(received, r.Header.Get("Traceparent"))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(target.Close)
	c := client.New(srv.URL, srv.Key)
	def := fmt.Sprintf(`{"name": "traced", "tasks": {
		"call": {"url": %q, "method": "POST"},
		"work": {"needs": ["call"], "task": {"type": "tracing.work.v1"}}}}`, target.URL)
	if _, _, err := c.ApplyWorkflow(ctx, "traced", []byte(def)); err != nil {
		t.Fatal(err)
	}
	// work claims the run's task through the Go API, checks the trace
	// context it was handed with (want), and completes it.
	work := func(runID, want string) {
		t.Helper()
		got, err := srv.Engine.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"tracing.work.v1"}, WorkerID: "w", Wait: 20 * time.Second})
		if err != nil || len(got) != 1 {
			t.Fatalf("claim: %+v %v", got, err)
		}
		if got[0].Traceparent != want {
			t.Errorf("the task was handed out with traceparent %q, want %q (the run's)", got[0].Traceparent, want)
		}
		if err := srv.Engine.CompleteTask(ctx, got[0].ID, got[0].LeaseToken, nil); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, 10*time.Second, "the run completes", func() bool {
			r, err := c.GetRun(ctx, runID)
			return err == nil && r.Status == client.RunCompleted
		})
	}

	caller := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{8, 7, 6, 5, 4, 3, 2, 1}, TraceFlags: trace.FlagsSampled,
	})
	req, err := http.NewRequest("POST", srv.URL+"/api/v1/workflows/traced/trigger", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+srv.Key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+caller.TraceID().String()+"-"+caller.SpanID().String()+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var runID string
	if _, err := fmt.Fscanf(resp.Body, `{"data":{"run_id":%q`, &runID); err != nil {
		t.Fatalf("trigger answered %d: %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	work(runID, "00-"+caller.TraceID().String()+"-"+caller.SpanID().String()+"-01")
	run, _, err := srv.Engine.Store().GetRun(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}

	spans := map[string][]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() == caller.TraceID() {
			spans[s.Name] = append(spans[s.Name], s)
		}
	}
	one := func(name string) tracetest.SpanStub {
		t.Helper()
		if len(spans[name]) != 1 {
			t.Fatalf("%d spans %q in the caller's trace, want 1 (all: %v)", len(spans[name]), name, names(exp))
		}
		return spans[name][0]
	}
	server := one("POST /api/v1/workflows/{id}/trigger")
	if server.Parent.SpanID() != caller.SpanID() || server.SpanKind != trace.SpanKindServer {
		t.Errorf("the trigger request's span: parent %v kind %v, want the caller's span, server", server.Parent.SpanID(), server.SpanKind)
	}
	wantAttr(t, server, "http.response.status_code", attribute.IntValue(201))
	if tr := one("ferry.trigger"); tr.Parent.SpanID() != server.SpanContext.SpanID() {
		t.Errorf("ferry.trigger's parent %v, want the request's span %v", tr.Parent.SpanID(), server.SpanContext.SpanID())
	}
	attempt := one("POST")
	if attempt.SpanKind != trace.SpanKindClient || attempt.Parent.SpanID() != caller.SpanID() {
		t.Errorf("the attempt's span: kind %v parent %v, want client, the caller's span (recorded with the run)", attempt.SpanKind, attempt.Parent.SpanID())
	}
	wantAttr(t, attempt, "http.response.status_code", attribute.IntValue(204))
	wantAttr(t, attempt, "ferry.step.name", attribute.StringValue("call"))
	mu.Lock()
	want := "00-" + caller.TraceID().String() + "-" + attempt.SpanContext.SpanID().String() + "-01"
	if len(received) != 1 || received[0] != want {
		t.Errorf("the step's request carried traceparent %q, want %q (the attempt's span)", received, want)
	}
	mu.Unlock()
	for _, step := range []string{"call", "work"} {
		s := one("ferry.step " + step)
		if s.Parent.SpanID() != caller.SpanID() || s.Status.Code == codes.Error {
			t.Errorf("step %s's span: parent %v status %v, want the caller's span, not an error", step, s.Parent.SpanID(), s.Status)
		}
		wantAttr(t, s, "ferry.run.id", attribute.StringValue(runID))
		wantAttr(t, s, "ferry.status", attribute.StringValue("success"))
		if !s.StartTime.Before(s.EndTime) {
			t.Errorf("step %s's span from %v to %v", step, s.StartTime, s.EndTime)
		}
	}
	r := one("ferry.run")
	if !r.StartTime.Equal(run.StartedAt) || run.FinishedAt == nil || !r.EndTime.Equal(*run.FinishedAt) {
		t.Errorf("the run's span from %v to %v, want the run's %v to %v", r.StartTime, r.EndTime, run.StartedAt, run.FinishedAt)
	}
	wantAttr(t, r, "ferry.status", attribute.StringValue("completed"))
	if tp := run.TriggerHeaders["Traceparent"]; !strings.Contains(tp, caller.SpanID().String()) {
		t.Errorf("the run recorded traceparent %q, want the caller's", tp)
	}

	// Through the Go API, with no trace context: the trigger's span is
	// recorded with the run, and its steps are its children.
	exp.Reset()
	id, err := srv.Engine.Trigger(ctx, "traced", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	var trig tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "ferry.trigger" {
			trig = s
		}
	}
	work(id, "00-"+trig.SpanContext.TraceID().String()+"-"+trig.SpanContext.SpanID().String()+"-01")
	byName := map[string]int{}
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() == trig.SpanContext.TraceID() && s.Parent.SpanID() == trig.SpanContext.SpanID() {
			byName[s.Name]++
		}
	}
	if byName["ferry.step call"] != 1 || byName["ferry.step work"] != 1 || byName["ferry.run"] != 1 || byName["POST"] != 1 {
		t.Errorf("children of the Go API trigger's span %v, want each step's, the attempt's and the run's once (all: %v)", byName, names(exp))
	}

	// A batch: one trigger span, recorded with each of its runs.
	exp.Reset()
	batch, err := srv.Engine.TriggerBatch(ctx, "traced", []ferry.TriggerInput{{}, {}})
	if err != nil || len(batch) != 2 {
		t.Fatalf("TriggerBatch: %v %v", batch, err)
	}
	var spanIDs []string
	for _, s := range exp.GetSpans() {
		if s.Name == "ferry.trigger" {
			spanIDs = append(spanIDs, s.SpanContext.SpanID().String())
		}
	}
	if len(spanIDs) != 1 {
		t.Fatalf("%d trigger spans for a batch, want 1", len(spanIDs))
	}
	for _, b := range batch {
		r, _, err := srv.Engine.Store().GetRun(ctx, b.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if tp := r.TriggerHeaders["Traceparent"]; !strings.Contains(tp, spanIDs[0]) {
			t.Errorf("run %s of the batch recorded traceparent %q, want the batch's trigger span %s", b.RunID, tp, spanIDs[0])
		}
	}
}

func names(exp *tracetest.InMemoryExporter) []string {
	var out []string
	for _, s := range exp.GetSpans() {
		out = append(out, s.Name)
	}
	return out
}

func wantAttr(t *testing.T, s tracetest.SpanStub, key string, want attribute.Value) {
	t.Helper()
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			if a.Value != want {
				t.Errorf("span %q: %s = %v, want %v", s.Name, key, a.Value.Emit(), want.Emit())
			}
			return
		}
	}
	t.Errorf("span %q has no %s", s.Name, key)
}

// TestTracingKeepsQuerySecretsOut: an HTTP step whose URL carries a
// secret in its query fails with a network error; neither the attempt's
// span (its status, its exception event), the step's span nor the step's
// stored error shows the secret, which operations.md promises is
// REDACTED. (Found by an audit: the client's error text named the whole
// URL.)
func TestTracingKeepsQuerySecretsOut(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	srv := ferrytest.Start(t, func(c *ferry.Config) { c.TracerProvider = tp })
	refused := httptest.NewServer(http.NotFoundHandler())
	addr := refused.Listener.Addr().String()
	refused.Close() // nobody listens there now: connection refused
	ctx := context.Background()
	c := client.New(srv.URL, srv.Key)
	def := fmt.Sprintf(`{"name": "leak", "tasks": {"call": {"url": "http://%s/hook?api_key={{trigger.body.key}}", "retries": 0}}}`, addr)
	if _, _, err := c.ApplyWorkflow(ctx, "leak", []byte(def)); err != nil {
		t.Fatal(err)
	}
	id, err := srv.Engine.Trigger(ctx, "leak", []byte(`{"key": "s3cr3t-value"}`), "")
	if err != nil {
		t.Fatal(err)
	}
	var run *client.Run
	testwait.Until(t, 10*time.Second, "the run ends", func() bool {
		r, err := c.GetRun(ctx, id)
		run = r
		return err == nil && r.Status != client.RunRunning
	})
	if len(run.Tasks) != 1 {
		t.Fatalf("run %+v, want one step", run)
	}
	if s := run.Tasks[0]; s.Status != "failed" || strings.Contains(s.Error, "s3cr3t") || !strings.Contains(s.Error, "api_key=REDACTED") {
		t.Errorf("step %s, error %q: want failed, the URL's query value REDACTED", s.Status, s.Error)
	}
	testwait.Until(t, 10*time.Second, "the run's spans", func() bool { return len(exp.GetSpans()) >= 3 })
	for _, s := range exp.GetSpans() {
		if strings.Contains(s.Status.Description, "s3cr3t") {
			t.Errorf("span %q: status %q shows the secret", s.Name, s.Status.Description)
		}
		for _, a := range s.Attributes {
			if strings.Contains(a.Value.Emit(), "s3cr3t") {
				t.Errorf("span %q: attribute %s %q shows the secret", s.Name, a.Key, a.Value.Emit())
			}
		}
		for _, ev := range s.Events {
			for _, a := range ev.Attributes {
				if strings.Contains(a.Value.Emit(), "s3cr3t") {
					t.Errorf("span %q: event %s attribute %s shows the secret", s.Name, ev.Name, a.Key)
				}
			}
		}
	}
}

// TestTracingUnmatchedRequests: a request no route takes has a span named
// by its method alone and no http.route, whichever catch-all answers it.
// Those the pattern "/" answers (a path outside /api/ no route serves, a
// method a route does not take) were named "/" with http.route "/", a
// route Ferry does not have.
func TestTracingUnmatchedRequests(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	srv := ferrytest.Start(t, func(c *ferry.Config) { c.TracerProvider = tp })
	sendEach(t, srv, "GET /nope", "POST /healthz", "GET /api/v1/nope")
	var server []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.SpanKind == trace.SpanKindServer {
			server = append(server, s)
		}
	}
	if len(server) != 3 {
		t.Fatalf("%d server spans, want 3 (all: %v)", len(server), names(exp))
	}
	for _, s := range server {
		if s.Name != "GET" && s.Name != "POST" {
			t.Errorf("the span of an unmatched request is named %q, want its method", s.Name)
		}
		for _, a := range s.Attributes {
			if a.Key == "http.route" {
				t.Errorf("span %q has http.route %q; no route took it", s.Name, a.Value.AsString())
			}
		}
	}
}
