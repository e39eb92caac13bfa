// Package e2e holds Ferry's end-to-end tests: the seed's examples driven
// through the real REST API against an httptest upstream, on SQLite and on
// Postgres, plus the crash (SIGKILL) and two-node tests that run the real
// ferry binary. It has no non-test code besides this comment.
package e2e
