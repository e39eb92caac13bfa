package tracing_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/ferryhq/ferry/internal/tracing"
)

// clearEnv unsets the variables FromEnv reads, for the test.
func clearEnv(t *testing.T) {
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"} {
		t.Setenv(k, "")
	}
}

// TestFromEnvOffUnlessConfigured: without an exporter or an endpoint, or
// with tracing disabled, the provider is a no-op.
func TestFromEnvOffUnlessConfigured(t *testing.T) {
	for _, env := range []map[string]string{
		{},
		{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
		{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
	} {
		clearEnv(t)
		for k, v := range env {
			t.Setenv(k, v)
		}
		tp, stop, err := tracing.FromEnv(t.Context(), "")
		if err != nil {
			t.Fatalf("%v: %v", env, err)
		}
		if _, ok := tp.(noop.TracerProvider); !ok {
			t.Errorf("%v: provider %T, want a no-op", env, tp)
		}
		if tracing.New(tp).Enabled() {
			t.Errorf("%v: a tracer of the no-op provider is enabled", env)
		}
		if err := stop(t.Context()); err != nil {
			t.Errorf("%v: stop: %v", env, err)
		}
	}
}

// TestFromEnvRefusesWhatItCannotHonour: exporters other than otlp,
// protocols other than http/protobuf and samplers the SDK does not take
// are errors, not silently ignored.
func TestFromEnvRefusesWhatItCannotHonour(t *testing.T) {
	for _, env := range []map[string]string{
		{"OTEL_TRACES_EXPORTER": "console"},
		{"OTEL_TRACES_EXPORTER": "otlp,console"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
		// Samplers the SDK does not take, and ratios that are none: the
		// SDK logged them through Go's log and sampled every trace.
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_SAMPLER": "jaeger_remote"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_SAMPLER": "sometimes"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "10%"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
	} {
		clearEnv(t)
		for k, v := range env {
			t.Setenv(k, v)
		}
		if _, _, err := tracing.FromEnv(t.Context(), ""); !errors.Is(err, tracing.ErrConfig) {
			t.Errorf("%v: err = %v, want ErrConfig", env, err)
		}
	}
}

// TestFromEnvExportsOverOTLPHTTP: with an endpoint, spans reach it as
// OTLP/HTTP protobuf when the provider stops, under the service name the
// environment gives (ferry by default).
func TestFromEnvExportsOverOTLPHTTP(t *testing.T) {
	for _, name := range []string{"", "orders-ferry"} {
		clearEnv(t)
		var mu sync.Mutex
		var got []*coltrace.ExportTraceServiceRequest
		collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			req := &coltrace.ExportTraceServiceRequest{}
			if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
				t.Errorf("export to %s as %q, want /v1/traces as protobuf", r.URL.Path, r.Header.Get("Content-Type"))
			} else if err := proto.Unmarshal(body, req); err != nil {
				t.Errorf("export body: %v", err)
			}
			mu.Lock()
			got = append(got, req)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/x-protobuf")
		}))
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
		if name != "" {
			t.Setenv("OTEL_SERVICE_NAME", name)
		}
		tp, stop, err := tracing.FromEnv(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		_, span := tp.Tracer("test").Start(context.Background(), "exported")
		span.End()
		if err := stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		collector.Close()
		want := name
		if want == "" {
			want = "ferry"
		}
		mu.Lock()
		var spans []string
		var service string
		for _, req := range got {
			for _, rs := range req.ResourceSpans {
				for _, a := range rs.GetResource().GetAttributes() {
					if a.Key == "service.name" {
						service = a.GetValue().GetStringValue()
					}
				}
				for _, ss := range rs.ScopeSpans {
					for _, s := range ss.Spans {
						spans = append(spans, s.Name)
					}
				}
			}
		}
		mu.Unlock()
		if len(spans) != 1 || spans[0] != "exported" || service != want {
			t.Errorf("the collector got spans %v of service %q, want [exported] of %q", spans, service, want)
		}
	}
}
