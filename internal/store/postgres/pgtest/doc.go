// Package pgtest gives tests a private, empty Postgres schema.
//
// DSN creates a uniquely named schema (ferry_t_<random>) on the local test
// server and returns a DSN whose search_path selects it, so every test (and
// every subtest of the conformance suite) works on its own tables and can run
// in parallel with the others. The schema is dropped with CASCADE when the
// test ends.
//
// The server is postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
// unless the FERRY_TEST_POSTGRES environment variable names another one. When
// the server cannot be reached the test is skipped with a message, except
// when CI is set: a missing Postgres must fail CI, never skip silently.
//
// It is a non-test package so that tests in several packages can share it;
// it imports pgx directly and nothing from Ferry.
package pgtest
