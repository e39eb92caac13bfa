// Package storetest is the conformance suite every store.Store backend must
// pass. Backends call Run from their own tests with a function that opens a
// fresh, empty, migrated store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store {
//			s, err := sqlite.Open(filepath.Join(t.TempDir(), "ferry.db"))
//			...
//			t.Cleanup(func() { s.Close() })
//			return s
//		})
//	}
//
// Every subtest opens its own store and runs in parallel with the others.
// Time is never waited for: the store takes "now" as a parameter wherever
// time matters (leases, due times, event times), so the suite passes explicit
// instants, and concurrent tests synchronise on channels and WaitGroups.
//
// It is a non-test package (it imports testing) so the sqlite and postgres
// packages can share it; it imports internal/store, internal/status and
// go-cmp, never a backend (one test reaches the tables through the
// store's DB handle, to plant rows an older version wrote).
package storetest
