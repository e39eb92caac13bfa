// Package sqlite opens Ferry's embedded default store: a SQLite file in WAL
// mode through the pure-Go modernc.org/sqlite driver. Writes go through one
// connection (SQLite has one writer; queueing in Go beats busy-waiting in the
// driver) and reads through a small pool.
//
// It imports internal/store and internal/store/sqlstore; nothing above them.
package sqlite

import (
	"database/sql"
	"fmt"
	"net/url"
	"strings"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

// Open opens (creating if needed) the SQLite database at path.
func Open(path string) (*sqlstore.Store, error) {
	if path == "" {
		return nil, fmt.Errorf("sqlite: empty path")
	}
	pragmas := []string{"busy_timeout(10000)", "journal_mode(WAL)", "synchronous(FULL)", "foreign_keys(1)"}
	q := url.Values{}
	for _, p := range pragmas {
		q.Add("_pragma", p)
	}
	base := "file:" + path + "?" + q.Encode()
	w, err := sql.Open("sqlite", base+"&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	if err := w.Ping(); err != nil {
		w.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	r, err := sql.Open("sqlite", base)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	r.SetMaxOpenConns(4)
	r.SetMaxIdleConns(4)
	return sqlstore.New(sqlstore.Dialect{
		Name:     "sqlite",
		IsUnique: func(err error) bool { return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed") },
	}, w, r), nil
}
