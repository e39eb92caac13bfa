package sqlstore

import (
	"database/sql"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestTablesDueDuringARefreshAreRefreshedNext: rows written to a table
// while an ANALYZE of other tables runs make it due, and it is refreshed
// as soon as that ANALYZE ends, not left until it is written again (a
// burst of tasks that ended during the refresh of runs would otherwise
// keep the statistics the refresh exists to replace). Tables are due
// only once their own rows reach the floor.
func TestTablesDueDuringARefreshAreRefreshedNext(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var calls [][]string
	first, release := make(chan struct{}), make(chan struct{})
	s := New(Dialect{Name: "test", Analyze: func(tables []string) string {
		mu.Lock()
		calls = append(calls, tables)
		n := len(calls)
		mu.Unlock()
		if n == 1 {
			close(first)
			<-release // the first refresh is in progress until released
		}
		return "SELECT 1"
	}}, db, db)
	t.Cleanup(func() { s.Close() })

	runs, tasks := slices.Index(AnalyzeTables[:], "runs"), slices.Index(AnalyzeTables[:], "tasks")
	var n [len(AnalyzeTables)]int
	n[tasks] = analyzeFloor - 1
	s.grew(n) // below the floor: nothing due
	n = [len(AnalyzeTables)]int{}
	n[runs] = analyzeFloor
	s.grew(n)
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("no refresh after a table's rows reached the floor")
	}
	n = [len(AnalyzeTables)]int{}
	n[tasks] = 1 // tasks reaches the floor while runs is being refreshed
	s.grew(n)
	close(release)
	waitFor(t, "a second refresh", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if want := [][]string{{"runs"}, {"tasks"}}; !slices.EqualFunc(calls, want, slices.Equal[[]string]) {
		t.Errorf("refreshes %v, want %v", calls, want)
	}
}
