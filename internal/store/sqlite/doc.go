// Package sqlite opens Ferry's embedded default store: a SQLite file in WAL
// mode through the pure-Go modernc.org/sqlite driver. Writes go through one
// connection (SQLite has one writer; queueing in Go beats busy-waiting in the
// driver) and reads through a small pool. Both pools cache prepared
// statements per connection, see stmtcache.go.
//
// It imports internal/store and internal/store/sqlstore; nothing above them.
package sqlite
