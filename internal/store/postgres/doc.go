// Package postgres opens Ferry's Postgres store through pgx. Several Ferry
// servers may share one database: runs are serialised with row locks, the
// queue is claimed with FOR UPDATE SKIP LOCKED, and LISTEN/NOTIFY tells the
// other nodes what a commit made ready (ready.go), so that they wake only
// what it concerns.
//
// It imports internal/store and internal/store/sqlstore; nothing above them.
package postgres
