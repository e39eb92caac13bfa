// Package runtime is Ferry's imperative shell around the pure engine: it
// triggers runs, applies the engine's decisions in one transaction per event
// (under the run's lock), and runs the dispatcher that claims due queue items
// (HTTP attempts, sleep wake-ups, webhook timeouts, run expiry), executes
// them and records their outcome. It sleeps until the earliest due item and
// is woken at once by local enqueues and by other nodes (Postgres NOTIFY); a
// slow safety-net tick covers lost wake-ups.
//
// It imports the engine, spec, expr, store, clock, status and step packages;
// it must not import api, cli or web.
package runtime
