// Package tracing owns Ferry's OpenTelemetry spans: the tracer provider
// built from the standard OTEL_* environment variables (none unless
// configured), the HTTP API's server spans, the spans of triggers and of
// HTTP steps' attempts (whose requests carry the run's trace context), and
// the spans of steps and runs, recorded from committed writes
// (store.Finished) so that only outcomes on disk are traced.
//
// A run's spans belong to the trace its trigger recorded in the run's
// trigger headers (Traceparent), so they join one trace across processes,
// nodes and restarts.
//
// It imports OpenTelemetry, store (for store.Finished and store.Run),
// status, httpwrap and httpstep (for RedactURL); it must not import
// runtime, api, cli or any storage backend: the runtime calls it through
// its own interface (runtime.Tracer).
package tracing
