// Package metrics owns Ferry's Prometheus metrics: one registry per
// engine (so that several engines in one process, as in tests and
// `ferry bench --nodes`, keep theirs apart), the counters and histograms
// the store's commits, the runtime and the HTTP API feed, and the
// handler that serves them in the text exposition format.
//
// It imports the Prometheus client, store (for store.EventCount) and
// httpwrap; it must not import runtime, api, cli or any storage backend:
// they call it through their own interfaces (runtime.Observer) or plain
// functions.
package metrics
