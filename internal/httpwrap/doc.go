// Package httpwrap owns what the HTTP middlewares (metrics, tracing)
// share: a ResponseWriter that remembers the status code written; and the
// deadline on a request's body (BodyDeadline).
//
// It imports only the standard library; it must not import any other
// package of Ferry's.
package httpwrap
