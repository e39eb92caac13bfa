package sqlite

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/testwait"
)

// TestCheckpointPendingReadsTheLog: pending reads from the wal-index what
// SQLite itself reports: the pages written since the last checkpoint,
// none once a checkpoint has copied them.
func TestCheckpointPendingReadsTheLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.db")
	w, r, err := openPools(path, "NORMAL")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(); r.Close() })
	if _, err := w.Exec(`CREATE TABLE pad (x BLOB)`); err != nil {
		t.Fatal(err)
	}
	for range 300 { // a page each at least, fewer than the writer's own threshold
		if _, err := w.Exec(`INSERT INTO pad VALUES (?)`, []byte(strings.Repeat("x", 4000))); err != nil {
			t.Fatal(err)
		}
	}
	c := &checkpoints{shm: path + "-shm"}
	defer c.close()
	before, ok := c.pending()
	if !ok || before < 300 {
		t.Fatalf("pending after 300 pages written = %d, %v; want at least 300", before, ok)
	}
	var busy, log, done int64
	if err := r.QueryRow(`PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &log, &done); err != nil {
		t.Fatal(err)
	}
	if busy != 0 || log != before || done != log {
		t.Fatalf("checkpoint = busy %d, log %d, checkpointed %d; want 0, %d (what pending read), all", busy, log, done, before)
	}
	if after, ok := c.pending(); !ok || after != 0 {
		t.Fatalf("pending after the checkpoint = %d, %v; want 0", after, ok)
	}
}

// TestCheckpointsOffTheWriter: a store copies the log into the database
// once it holds checkpointFrames pages, from its reader pool, while the
// writer's own automatic checkpoint waits for ten times as many.
func TestCheckpointsOffTheWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	w := s.DB()
	if _, err := w.Exec(`CREATE TABLE pad (x BLOB)`); err != nil {
		t.Fatal(err)
	}
	for range 2 * checkpointFrames / 100 {
		tx, err := w.Begin()
		if err != nil {
			t.Fatal(err)
		}
		for range 100 {
			if _, err := tx.Exec(`INSERT INTO pad VALUES (?)`, []byte(strings.Repeat("x", 4000))); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	c := &checkpoints{shm: path + "-shm"}
	defer c.close()
	testwait.Until(t, 10*time.Second, "the log copied into the database", func() bool {
		n, ok := c.pending()
		return ok && n < checkpointFrames
	})
	var auto int
	if err := w.QueryRow(`PRAGMA wal_autocheckpoint`).Scan(&auto); err != nil {
		t.Fatal(err)
	}
	if auto != writerCheckpointFrames {
		t.Fatalf("the writer checkpoints itself every %d pages, want %d (a backstop only)", auto, writerCheckpointFrames)
	}
}
