// Package store owns Ferry's persistence seam: the Store interface, the
// records it reads and writes, and the errors callers branch on. The two
// implementations live in store/sqlite and store/postgres (sharing the SQL in
// store/sqlstore) and must both pass store/storetest.
//
// It imports only the standard library and internal/status; it must not
// import the engine, runtime or api packages.
package store
