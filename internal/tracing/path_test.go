package tracing_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ferryhq/ferry/internal/tracing"
)

// TestServerSpanKeepsTheCallbackTokenOut: a request's span records its
// path, but a webhook's without the callback token, its caller's
// credential; other paths as they are. (Found by an audit.)
func TestServerSpanKeepsTheCallbackTokenOut(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	h := tracing.New(tp).Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, path := range []string{"/wh/wh_SECRETTOKEN", "/api/v1/runs/r1"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, path, nil))
	}
	var paths []string
	for _, s := range exp.GetSpans() {
		for _, a := range s.Attributes {
			if a.Key == "url.path" {
				paths = append(paths, a.Value.AsString())
			}
		}
	}
	if got := strings.Join(paths, " "); got != "/wh/REDACTED /api/v1/runs/r1" {
		t.Errorf("url.path of the spans: %q, want the token replaced and the run's path kept", got)
	}
}
