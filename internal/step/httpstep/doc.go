// Package httpstep owns the execution of a single attempt of an HTTP step:
// building the outbound request (method, headers, body and Ferry's
// identity headers), sending it through an egress-guarded transport,
// reading a bounded response, and classifying the outcome as retryable or
// not. It also owns the retry backoff computation (Backoff).
//
// It does not schedule retries, persist attempts, or interpret response
// bodies; the engine does that with the Result returned by Executor.Do.
//
// Import rules: httpstep must not import any github.com/ferryhq/ferry/internal/...
// package other than internal/netguard (for the egress policy and its
// DeniedError). In particular it must not import the engine, storage or
// other step packages.
package httpstep
