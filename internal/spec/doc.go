// Package spec owns workflow definitions: parsing JSON or YAML into a
// Workflow, strict validation that reports every problem at once with a JSON
// path and a machine-readable code, normalisation (defaults) and the content
// fingerprint that identifies a version.
//
// It may import internal/expr (to check templates and conditions),
// golang.org/x/net/http/httpguts (header names and values) and the
// standard library; it must not import the store, engine, runtime or api.
package spec
