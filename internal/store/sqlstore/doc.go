// Package sqlstore is the SQL implementation of store.Store shared by the
// SQLite and Postgres backends. The two differ only in a Dialect (placeholder
// style, row locking, SKIP LOCKED, error classification) and their embedded
// migrations; everything else is one code path, so both backends behave the
// same and one conformance suite covers both. Transactions record their
// writes as a changeset and write it set-wise at the end (changes.go), so a
// batch of many runs costs a few statements.
//
// What the store wrote last it keeps, so that the next transaction on the
// same rows need not read them: SQLite's single writer caches the runs
// and leased tasks it committed (runcache.go); Postgres, whose rows other
// nodes write too, caches runs by row version (versioncache.go) and the
// tasks it leased (taskcache.go), and decides a report batch or a fire
// transaction on them without locking reads, writing each row only at
// the version it was decided on (optimistic.go).
//
// Claims walk the pending tasks of each of their types (tasks.go); the
// types a prefix stands for are kept in memory (typecache.go).
//
// It imports internal/store, internal/jsonenc and the standard library; it
// must not import the engine, runtime or api packages, nor a database
// driver (the sqlite and postgres packages bring those; only its own tests
// open SQLite directly, to drive the single writer).
package sqlstore
