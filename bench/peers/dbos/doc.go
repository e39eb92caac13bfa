// Command dbos measures DBOS Transact Go, the durable-workflow peer whose
// figures the performance issue's chain10, fanout and sleep targets are
// ratios to, on this machine and database, the workloads shaped as
// `ferry bench` shapes Ferry's: `jobs` (one no-op step a workflow),
// `chain10` (ten sequential no-op steps), `fanout` (a step, eight steps
// at once with dbos.Go, a step) and `sleep` (a durable one-second sleep,
// then a no-op step). Every workflow is enqueued at once, from 64
// goroutines, on one queue polled every 10 ms (the setting); the
// span runs from the first workflow's creation to the last one's
// completion as DBOS records them. `handoff_ms` is a step's start after
// the previous step's end inside the workflow, `lateness_ms` the sleep's
// return after the second it was asked for. It prints one JSON line per
// run with the keys of Ferry's bench, so the two can be compared in the
// same minutes (the host's speed moves from one phase to another).
//
// It is a module of its own so that Ferry's go.mod never takes DBOS, and
// it must not import Ferry: it measures the peer alone. `make bench-dbos`
// runs it; it is not part of `make test`.
package main
