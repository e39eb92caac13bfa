// Command river measures River, the job queue whose throughput is Ferry's
// `jobs` target, on this machine and database, the way `ferry bench
// --workload jobs` measures Ferry: N no-op jobs inserted first (batches of
// 1,000), then drained by 2,000 workers with River's own benchmark tuning
// (FetchCooldown 2 ms, FetchPollInterval 20 ms), timed from the first
// insert to the last completion committed. It prints one JSON line per
// repeat with the keys of Ferry's bench, so the two can be compared on
// the same host at the same time (the host's speed moves run to run).
//
// --database sqlite runs it on a new SQLite file through River's SQLite
// driver (one connection, the workaround that driver's documentation
// gives for its concurrent operations; WAL with every commit synced,
// Ferry's durability), else on the Postgres URL. That driver keeps times
// to the millisecond, so SQLite latencies move in 1 ms steps.
//
// It is a module of its own so that Ferry's go.mod never takes River,
// and it must not import Ferry: it measures the peer alone.
// `make bench-peers` runs it; it is not part of `make test`.
package main
