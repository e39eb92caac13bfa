// Package api owns Ferry's HTTP surface: the REST API under /api/v1 (with
// bearer-key auth and {"data": ...} envelopes), webhook callbacks at
// /wh/{token}, /healthz, and the OpenAPI document that describes them.
//
// It imports runtime, spec, store, status and httpwrap; it must not import
// cli or any storage backend package.
package api
