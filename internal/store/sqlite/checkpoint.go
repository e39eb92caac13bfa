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

func startCheckpoints(path string, r *sql.DB) *checkpoints {
	c := &checkpoints{shm: path + "-shm", r: r, stopCh: make(chan struct{})}
	c.wg.Add(1)
	go c.loop()
	return c
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
			slog.Warn("sqlite checkpoint failed", "err", err)
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
	f, err := os.Open(c.shm)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var hdr [100]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
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
