// Package engine is Ferry's pure decision core: given a workflow definition
// and the current state of a run's steps, it decides which steps start, which
// are skipped (cascade skip, false conditions), which fail template
// resolution, and what the run's status is. It performs no I/O, reads no
// clock and holds no state, so it can be tested exhaustively.
//
// It imports internal/spec, internal/expr and internal/status only; it must
// never import the store, runtime or api packages.
package engine
