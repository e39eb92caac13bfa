package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ErrConfig is a tracing configuration FromEnv cannot honour.
var ErrConfig = errors.New("tracing configuration")

// FromEnv builds the tracer provider the standard OpenTelemetry
// environment variables describe, and the function that flushes and stops
// it. Tracing is off (a no-op provider) unless OTEL_TRACES_EXPORTER is
// "otlp" (then to http://localhost:4318) or an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none turn it off. Spans go over OTLP/HTTP with
// protobuf, the exporter reading the OTEL_EXPORTER_OTLP_* variables
// (endpoint, headers, timeout, compression, certificates); the sampler
// (OTEL_TRACES_SAMPLER, default parent-based always-on), the batch
// processor (OTEL_BSP_*) and the resource (OTEL_SERVICE_NAME, default
// "ferry"; OTEL_RESOURCE_ATTRIBUTES) follow theirs. Other exporters and
// protocols are refused (ErrConfig) rather than ignored.
func FromEnv(ctx context.Context, version string) (trace.TracerProvider, func(context.Context) error, error) {
	off := func(context.Context) error { return nil }
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return noop.NewTracerProvider(), off, nil
	}
	exporter := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")))
	endpoint := strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")) != "" || strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) != ""
	if exporter == "" && endpoint {
		exporter = "otlp"
	}
	switch exporter {
	case "", "none":
		return noop.NewTracerProvider(), off, nil
	case "otlp":
	default:
		return nil, nil, fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%q: Ferry exports spans with otlp (or none)", ErrConfig, exporter)
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := strings.TrimSpace(os.Getenv(k)); p != "" {
			if p != "http/protobuf" {
				return nil, nil, fmt.Errorf("%w: %s=%q: Ferry sends OTLP over http/protobuf", ErrConfig, k, p)
			}
			break // the traces' own setting wins
		}
	}
	if err := checkSampler(); err != nil {
		return nil, nil, err
	}
	var opts []otlptracehttp.Option
	if !endpoint {
		// The exporter's own default is https: a collector on the host
		// listens in plain HTTP.
		opts = append(opts, otlptracehttp.WithEndpointURL("http://localhost:4318/v1/traces"))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: otlp exporter: %w", ErrConfig, err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", "ferry")}
	if version != "" {
		attrs = append(attrs, attribute.String("service.version", version))
	}
	// Later detectors win: the environment's service name over "ferry".
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		// (A malformed OTEL_RESOURCE_ATTRIBUTES gives a partial resource,
		// which the SDK itself would use: so does Ferry.)
		return nil, nil, fmt.Errorf("%w: resource: %w", ErrConfig, err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}

// checkSampler refuses an OTEL_TRACES_SAMPLER the SDK does not take, or a
// ratio that is not one, as a bad exporter or protocol is refused: the SDK
// itself wrote a warning through Go's standard log (outside Ferry's log
// format) and sampled every trace, a far higher load than the ratio asked
// for.
func checkSampler() error {
	sampler := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")))
	switch sampler {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
		return nil
	case "traceidratio", "parentbased_traceidratio":
		arg := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
		if arg == "" {
			return nil
		}
		if v, err := strconv.ParseFloat(arg, 64); err != nil || !(v >= 0 && v <= 1) {
			return fmt.Errorf("%w: OTEL_TRACES_SAMPLER_ARG=%q: a ratio from 0 to 1", ErrConfig, arg)
		}
		return nil
	}
	return fmt.Errorf("%w: OTEL_TRACES_SAMPLER=%q: use always_on, always_off, traceidratio or their parentbased_ forms", ErrConfig, sampler)
}
