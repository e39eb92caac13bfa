package sqlite

import (
	"context"
	"database/sql"
	"encoding/binary"
	"log/slog"
	"os"
	"sync"
	"time"
)

// checkpoints copies the write-ahead log into the database file from a
// connection of the reader pool, off the writer's path. SQLite's automatic
// checkpoint runs inside the commit that takes the log past 1,000 pages,
// on the one writer, and every request of the groups behind that commit
// waited while it copied the pages and synced the file.
type checkpoints struct {
	shm    string
	r      *sql.DB
	stopCh chan struct{}
	wg     sync.WaitGroup
	// f is the -shm file, opened once and kept until the store's pools
	// are closed (close): closing any descriptor of a file drops every
	// POSIX lock the process holds on it, and SQLite's connections hold
	// theirs on the -shm for as long as they are open. A look that
	// opened and closed the file each time left the store without its
	// locks, and a second process on the database (a backup, a sqlite3
	// shell, another server) then broke it: commits failed, the file
	// could be corrupted and acknowledged writes lost.
	f *os.File
	// log is the store's logger.
	log func() *slog.Logger
}

const (
	// checkpointEvery is how often the log is looked at.
	checkpointEvery = 20 * time.Millisecond
	// checkpointFrames is how many pages written since the last
	// checkpoint make one: SQLite's own threshold.
	checkpointFrames = 1000
	// writerCheckpointFrames is the writer's own automatic checkpoint,
	// kept as a backstop should the background one fall behind.
	writerCheckpointFrames = 10000
)

// newCheckpoints makes the loop, started by start: log, the store's
// logger, is set in between.
func newCheckpoints(path string, r *sql.DB) *checkpoints {
	return &checkpoints{shm: path + "-shm", r: r, stopCh: make(chan struct{}), log: slog.Default}
}

func (c *checkpoints) start() {
	c.wg.Add(1)
	go c.loop()
}

func (c *checkpoints) loop() {
	defer c.wg.Done()
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	for {
		select {
		case <-c.stopCh:
			return
		case <-t.C:
		}
		if n, ok := c.pending(); !ok || n < checkpointFrames {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := c.r.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
			c.log().Warn("sqlite checkpoint failed", "err", err)
		}
		cancel()
	}
}

// pending is how many pages of the log are not yet in the database file,
// read from the wal-index header in the -shm file (sqlite.org/walformat:
// mxFrame at byte 16, the checkpoint's nBackfill at byte 96, in the
// host's byte order). A read racing a writer may be off; the next look
// corrects it.
func (c *checkpoints) pending() (int64, bool) {
	// SQLite makes a new -shm when every connection has closed and one
	// opens again: a descriptor of the old file would read a log that no
	// longer grows. Closing that one drops no lock that matters (locks
	// are the file's, and SQLite holds none on a file it unlinked).
	if c.f != nil {
		held, err1 := c.f.Stat()
		cur, err2 := os.Stat(c.shm)
		if err1 != nil || err2 != nil || !os.SameFile(held, cur) {
			c.close()
		}
	}
	if c.f == nil {
		f, err := os.Open(c.shm)
		if err != nil {
			return 0, false
		}
		c.f = f
	}
	var hdr [100]byte
	if _, err := c.f.ReadAt(hdr[:], 0); err != nil {
		return 0, false
	}
	mx := binary.NativeEndian.Uint32(hdr[16:])
	done := binary.NativeEndian.Uint32(hdr[96:])
	if done > mx {
		return 0, true
	}
	return int64(mx - done), true
}

func (c *checkpoints) stop() error {
	close(c.stopCh)
	c.wg.Wait()
	return nil
}

// close closes the -shm descriptor: only once the store's connections are
// closed (see f), when SQLite holds no lock on the file any more.
func (c *checkpoints) close() error {
	if c.f == nil {
		return nil
	}
	err := c.f.Close()
	c.f = nil
	return err
}
