// Package runtime is Ferry's imperative shell around the pure engine: it
// triggers runs, applies the engine's decisions transactionally under the
// run's lock (reports and triggers that arrive together share one
// transaction, each still answered on its own: batch.go), and runs two
// loops: the dispatcher claims due HTTP attempts, executes them and records
// their outcome (dispatch.go), and the timer loop fires due timers (sleep
// wake-ups, webhook timeouts, run expiry) in several transactions at once
// (timers.go). Tasks a write creates are leased in that write to claims
// long-polling on this node (handoff.go). Each loop sleeps until its
// earliest due item and is woken after
// commits that queue earlier work, locally or from other nodes (Postgres
// NOTIFY); a slow safety-net tick covers lost wake-ups.
//
// It imports the engine, spec, expr, store, clock, status, step and jsonenc
// packages; it must not import api, cli or web.
package runtime
