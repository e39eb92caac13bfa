package sqlite_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/sqlite"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
	"github.com/ferryhq/ferry/internal/store/storetest"
)

// open returns a migrated store on a fresh file, closed when t ends.
func open(t *testing.T) *sqlstore.Store {
	t.Helper()
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "ferry.db"))
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
}

func TestWALMode(t *testing.T) {
	s := open(t)
	var mode string
	if err := s.DB().QueryRowContext(t.Context(), "PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatalf("PRAGMA journal_mode: %v", err)
	}
	if !strings.EqualFold(mode, "wal") {
		t.Errorf("journal_mode = %q, want wal", mode)
	}
}

// TestStatementJournalsInMemory: the writer keeps its statement journals
// (one page copy per page a savepoint first touches) in memory; on the
// default temp_store they spill into temporary files, a file opened,
// written and closed per group.
func TestStatementJournalsInMemory(t *testing.T) {
	s := open(t)
	var n int
	if err := s.DB().QueryRowContext(t.Context(), "PRAGMA temp_store").Scan(&n); err != nil {
		t.Fatalf("PRAGMA temp_store: %v", err)
	}
	if n != 2 {
		t.Errorf("temp_store = %d, want 2 (MEMORY)", n)
	}
}

func TestOpenEmptyPath(t *testing.T) {
	if s, err := sqlite.Open(""); err == nil {
		s.Close()
		t.Fatal("Open(\"\") succeeded, want an error")
	}
}

// TestSynchronousOption: SQLite itself never syncs at commit (Ferry syncs
// the WAL before answering, see TestAnswersWaitForTheWALSync); full by
// default, normal on request, anything else refused.
func TestSynchronousOption(t *testing.T) {
	dir := t.TempDir()
	level := func(path string) int {
		t.Helper()
		s, err := sqlite.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var n int
		if err := s.DB().QueryRow(`PRAGMA synchronous`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := level(filepath.Join(dir, "a.db")); got != 1 {
		t.Errorf("default synchronous = %d, want 1 (NORMAL, with the WAL synced by the writer)", got)
	}
	if got := level(filepath.Join(dir, "b.db") + "?synchronous=normal"); got != 1 {
		t.Errorf("synchronous=normal gave %d, want 1 (NORMAL)", got)
	}
	for _, bad := range []string{"?synchronous=off", "?cache=shared"} {
		if _, err := sqlite.Open(filepath.Join(dir, "c.db") + bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestClaimWalkPlan: a claim walks each of its types' due tasks of each
// priority as a range of the pending tasks' index (type, priority, then
// run_at up to now), the priorities in the index's order, so tasks of
// other types and tasks scheduled ahead are not read and the claim order
// within a type needs no sort (see sqlstore's duePending); a claim of
// several types does so for each.
func TestClaimWalkPlan(t *testing.T) {
	s := open(t)
	now := time.Unix(1_700_000_000, 0)
	for _, typ := range []string{"billing.invoice.v1", "billing.refund.v1", "mail.send.v1"} {
		// Claims walk only the types that have pending tasks.
		if _, _, err := s.CreateTask(t.Context(), &store.Task{Type: typ, Payload: []byte(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now.Add(time.Hour)}, now); err != nil {
			t.Fatal(err)
		}
	}
	for _, types := range [][]string{{"billing.invoice.v1"}, {"billing.invoice.v1", "billing.refund.v1", "mail.send.v1"}} {
		qs, err := s.ClaimReads(t.Context(), store.ClaimTasks{Patterns: types, WorkerID: "w", Lease: time.Minute, Max: 16, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		all := explain(t, s, qs[0])
		if n := strings.Count(all, "SEARCH tasks USING INDEX tasks_claim (type=? AND priority=? AND run_at<?)"); n != len(types) {
			t.Errorf("claim of %v: %d walks of a type's due range of tasks_claim, want one a type:\n%s", types, n, all)
		}
		if strings.Contains(all, "TEMP B-TREE") {
			t.Errorf("claim of %v sorts its tasks:\n%s", types, all)
		}
		q, err := s.NextDueRead(t.Context(), types, now)
		if err != nil {
			t.Fatal(err)
		}
		if all := explain(t, s, q); strings.Count(all, "SEARCH tasks USING COVERING INDEX tasks_claim (type=? AND priority=? AND run_at>?)") != len(types) {
			t.Errorf("the read of when the next task of %v is due does not walk each type's later range of tasks_claim:\n%s", types, all)
		}
	}
}

// explain is the plan SQLite would run q with, a line a step.
func explain(t *testing.T, s *sqlstore.Store, q sqlstore.PipeQuery) string {
	t.Helper()
	rows, err := s.DB().QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+q.SQL, q.Args...)
	if err != nil {
		t.Fatalf("explain %s: %v", q.SQL, err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}

// BenchmarkClaimPastOtherType: see storetest.BenchClaimPastOtherType.
func BenchmarkClaimPastOtherType(b *testing.B) {
	s, err := sqlite.Open(filepath.Join(b.TempDir(), "ferry.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(b.Context()); err != nil {
		b.Fatal(err)
	}
	storetest.BenchClaimPastOtherType(b, s, s.DB(), 100_000)
}

// TestOpenTheFileNamed: the file written is the one named, and its writes
// are synced, whatever its name holds ('#' ended a SQLite URI's path and
// %41 was read as "A": another file, and "ferry.db#1" failed every write
// for a write-ahead log it looked for beside the name) and through a
// symbolic link (SQLite writes its log beside the link's target).
func TestOpenTheFileNamed(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target.db")
	if err := os.Symlink(target, filepath.Join(dir, "link.db")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, file string }{
		{"a#1.db", "a#1.db"},
		{"b%41.db", "b%41.db"},
		{"link.db", "target.db"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := sqlite.Open(filepath.Join(dir, c.name))
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer s.Close()
			if err := s.Migrate(t.Context()); err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			if err := s.AddAPIKey(t.Context(), "k", "hash-"+c.name); err != nil {
				t.Fatalf("a write: %v", err)
			}
			for _, f := range []string{c.file, c.file + "-wal"} {
				if fi, err := os.Lstat(filepath.Join(dir, f)); err != nil || !fi.Mode().IsRegular() {
					t.Errorf("%s: %v, want the file SQLite wrote", f, err)
				}
			}
		})
	}
}
