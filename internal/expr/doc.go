// Package expr owns the small expression languages found in workflow steps:
// {{ path }} templates (in URLs, header values and JSON bodies) and the
// boolean conditions of a step's "if". It parses them, reports syntax errors
// with byte positions, lists the paths they reference (so definitions can be
// checked before anything runs) and evaluates them against a read-only Scope
// holding the trigger payload and the results of finished steps.
//
// Templates resolve strictly: a reference that cannot be resolved is a
// *ResolveError, because sending a request with a hole in it is worse than
// failing the step. Conditions resolve leniently: anything missing is null,
// so a condition about a step that timed out simply evaluates to false.
//
// Numbers: callers should decode JSON with UseNumber, but every integer type,
// float32/float64 and json.Number are accepted everywhere and compare by
// value (200 == 200.0).
//
// This package is a leaf: it must import nothing from internal/ and nothing
// outside the standard library, so every other package can depend on it.
package expr
