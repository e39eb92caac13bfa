// Package bench holds Ferry's benchmark workloads (jobs, chain10, fanout,
// sleep), run against an embedded engine with in-process no-op task handlers
// through the worker SDK, on SQLite or Postgres. `ferry bench` and
// `make bench` drive it; results are JSON lines with stable keys.
//
// It imports package ferry, worker and client, internal/store for the
// result queries and internal/store/postgres for its defaults (reported in
// settings); nothing imports it but the CLI.
package bench
