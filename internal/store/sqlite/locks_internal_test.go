package sqlite

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// shmLocks counts the POSIX locks this process holds on the file at path
// (/proc/locks: "1: POSIX ADVISORY READ <pid> <maj>:<min>:<inode> ...").
func shmLocks(t *testing.T, path string) int {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		t.Skipf("no /proc/locks: %v", err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || fs[1] != "POSIX" {
			continue
		}
		if fs[4] == fmt.Sprint(os.Getpid()) && strings.HasSuffix(fs[5], fmt.Sprintf(":%d", st.Ino)) {
			n++
		}
	}
	return n
}

// TestCheckpointLooksKeepSQLitesLocks: looking at the log's length, which
// the checkpoint loop does every 20 ms, leaves the locks SQLite holds on
// the wal-index (-shm) as they were. Closing any descriptor of a file
// drops every POSIX lock the process holds on it, SQLite's included: a
// look that opened and closed the file each time left the open store
// without its locks, and a second process on the database (a backup, a
// sqlite3 shell) then broke it — commits failed with I/O errors, the file
// could be corrupted and acknowledged writes lost. (Found by an audit.)
func TestCheckpointLooksKeepSQLitesLocks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.db")
	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.DB().Exec(`CREATE TABLE x (y INTEGER)`); err != nil {
		t.Fatal(err)
	}
	shm := path + "-shm"
	held := shmLocks(t, shm)
	if held == 0 {
		t.Fatal("SQLite holds no lock on the open store's -shm: the check cannot tell")
	}
	c := &checkpoints{shm: shm}
	defer c.close()
	for range 3 {
		if _, ok := c.pending(); !ok {
			t.Fatal("pending could not read the -shm")
		}
	}
	if got := shmLocks(t, shm); got != held {
		t.Fatalf("after the checkpoint loop's looks the store holds %d locks on its -shm, %d before", got, held)
	}
}
