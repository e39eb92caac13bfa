package sqlite

import (
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

// Open opens (creating if needed) the SQLite database at path. The path may
// end in options: "ferry.db?synchronous=normal" trades the last commits
// before a power loss (never a process crash) for fewer disk syncs; the
// default is synchronous=full: nothing is answered before it is on disk.
func Open(path string) (*sqlstore.Store, error) {
	path, sync, err := parseOptions(path)
	if err != nil {
		return nil, err
	}
	return openSync(path, sync)
}

// openSync opens the store at path with its synchronous level (see
// parseOptions).
func openSync(path, sync string) (*sqlstore.Store, error) {
	w, r, err := openPools(path, "NORMAL")
	if err != nil {
		return nil, err
	}
	// The write-ahead log and the -shm file are beside the file SQLite
	// opened, not beside path as written: SQLite follows a symbolic link
	// to the database. Ferry syncs that log and reads that -shm file.
	file, err := mainFile(w)
	if err != nil {
		w.Close()
		r.Close()
		return nil, err
	}
	return openOn(file, w, r, syncerFor(file, sync)), nil
}

// mainFile is the database file SQLite opened, by its full path.
func mainFile(w *sql.DB) (string, error) {
	var file string
	if err := w.QueryRow(`SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file); err != nil {
		return "", fmt.Errorf("open sqlite: the database's file: %w", err)
	}
	if file == "" {
		return "", fmt.Errorf("open sqlite: the database has no file")
	}
	return file, nil
}

// syncerFor is what makes commits durable at a synchronous level: the WAL
// synced by Ferry for full (the default), nothing for normal.
func syncerFor(path, sync string) syncer {
	if sync == "NORMAL" {
		return nil
	}
	return &walFile{path: path + "-wal"}
}

// syncer makes every commit so far durable.
type syncer interface {
	sync() error
	close() error
}

// open opens the store; with wal nil, answers do not wait for the disk.
//
// Full durability is not SQLite's synchronous=FULL, which syncs the WAL
// inside every commit while the one writer waits: SQLite commits without
// syncing (NORMAL, which still syncs around checkpoints, and those run off
// the writer: see checkpoints), and the group
// writer has wal synced before it answers the requests of the groups
// committed so far, while it writes the next group
// (sqlstore.EnableGroupCommit).
func open(path string, wal syncer) (*sqlstore.Store, error) {
	w, r, err := openPools(path, "NORMAL")
	if err != nil {
		return nil, err
	}
	return openOn(path, w, r, wal), nil
}

// openOn makes the store on the pools openPools opened on path.
func openOn(path string, w, r *sql.DB, wal syncer) *sqlstore.Store {
	var closers []func() error
	var syncWAL func() error
	if wal != nil {
		closers, syncWAL = append(closers, wal.close), wal.sync
	}
	cp := newCheckpoints(path, r)
	closers = append(closers, cp.stop)
	st := sqlstore.New(sqlstore.Dialect{
		Name:     "sqlite",
		IsUnique: func(err error) bool { return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed") },
		// SQLite writes pages and compresses nothing: a run's row with
		// ten task steps in it costs the writer less than their step rows
		// did (three pairs: chain10 +2–20 % runs/s, fanout +18–21 %, the
		// machine's CPU −3–26 %). Twelve steps of a usual size and a
		// run's events stay within one 4 KB page.
		RunRowSteps: 12,
	}, w, r, closers...)
	st.AfterClose(cp.close)
	cp.log = st.Log
	cp.start()
	// SQLite has one writer: group many writers' requests into one
	// transaction, and one disk sync.
	st.EnableGroupCommit(GroupCommitMax, syncWAL)
	return st
}

// walFile syncs the database's write-ahead log. fsync on any descriptor of
// a file makes all of its written data durable, so this one, opened next
// to SQLite's own, covers every frame SQLite wrote before the call. Only the
// group writer's sync goroutine calls sync.
type walFile struct {
	path string
	f    *os.File
}

func (w *walFile) sync() error {
	// SQLite deletes the WAL when its last connection closes and makes a
	// new one after: a descriptor of the old file would sync nothing.
	cur, err := os.Stat(w.path)
	if err != nil {
		return fmt.Errorf("write-ahead log: %w", err)
	}
	if w.f != nil {
		if held, err := w.f.Stat(); err != nil || !os.SameFile(held, cur) {
			w.f.Close()
			w.f = nil
		}
	}
	if w.f == nil {
		f, err := os.OpenFile(w.path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("open write-ahead log: %w", err)
		}
		w.f = f
		// A new file's name is durable once its directory is synced.
		if d, err := os.Open(filepath.Dir(w.path)); err == nil {
			_ = d.Sync()
			d.Close()
		}
	}
	return w.f.Sync()
}

func (w *walFile) close() error {
	if w.f == nil {
		return nil
	}
	return w.f.Close()
}

// parseOptions splits "file.db?synchronous=normal" into the path and the
// synchronous level; unknown options are an error, never ignored.
func parseOptions(path string) (string, string, error) {
	file, query, ok := strings.Cut(path, "?")
	if !ok {
		return path, "", nil
	}
	vals, err := url.ParseQuery(query)
	if err != nil {
		return "", "", fmt.Errorf("sqlite options %q: %w", query, err)
	}
	sync := ""
	for k, v := range vals {
		switch k {
		case "synchronous":
			switch strings.ToLower(v[0]) {
			case "full":
				sync = "FULL"
			case "normal":
				sync = "NORMAL"
			default:
				return "", "", fmt.Errorf("sqlite option synchronous=%q: use full (default) or normal", v[0])
			}
		default:
			return "", "", fmt.Errorf("unknown sqlite option %q (known: synchronous)", k)
		}
	}
	return file, sync, nil
}

// uriPath escapes what a SQLite URI's path would read otherwise.
var uriPath = strings.NewReplacer("%", "%25", "#", "%23", "?", "%3f")

// GroupCommitMax is the most write requests committed together.
const GroupCommitMax = 128

// openPools opens the writer pool (one connection, BEGIN IMMEDIATE) and the
// reader pool, each through a statement-caching connector.
func openPools(path, sync string) (w, r *sql.DB, err error) {
	if path == "" {
		return nil, nil, fmt.Errorf("sqlite: empty path")
	}
	if sync == "" {
		sync = "FULL"
	}
	// temp_store(MEMORY): every request of a group runs inside its own
	// savepoint, so SQLite copies each page a request first touches into
	// a statement journal. On the default temp_store that journal spills
	// past 64 KiB into a temporary file, and most of the writer's system
	// calls were opening, writing and closing those files (chain10 +13–22 %
	// runs/s without them). The journal lives as long as one group and
	// holds at most the pages that group touches.
	pragmas := []string{"busy_timeout(10000)", "journal_mode(WAL)", "synchronous(" + sync + ")", "foreign_keys(1)", "temp_store(MEMORY)"}
	q := url.Values{}
	for _, p := range pragmas {
		q.Add("_pragma", p)
	}
	// A URI's path decodes %HH and ends at '#' ('?' cannot be in path:
	// parseOptions cut there): escaped, the file opened is the one named.
	base := "file:" + uriPath.Replace(path) + "?" + q.Encode()
	wc, err := newConnector(base+"&_txlock=immediate&_pragma=wal_autocheckpoint("+strconv.Itoa(writerCheckpointFrames)+")", stmtCacheSize)
	if err != nil {
		return nil, nil, fmt.Errorf("open sqlite: %w", err)
	}
	w = sql.OpenDB(wc)
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	if err := w.Ping(); err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	rc, err := newConnector(base, stmtCacheSize)
	if err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("open sqlite: %w", err)
	}
	r = sql.OpenDB(rc)
	r.SetMaxOpenConns(4)
	r.SetMaxIdleConns(4)
	return w, r, nil
}
