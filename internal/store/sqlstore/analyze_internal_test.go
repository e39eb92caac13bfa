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

// TestRefreshesStopAtTheCeiling: a table is due once its rows reach the
// floor and again each time they double, until a refresh has seen
// analyzeCeiling rows; it is then autovacuum's, however much it grows.
func TestRefreshesStopAtTheCeiling(t *testing.T) {
	s := &Store{}
	tasks := slices.Index(AnalyzeTables[:], "tasks")
	for _, c := range []struct {
		analyzed, written int64
		due               bool
	}{
		{0, analyzeFloor - 1, false},
		{0, analyzeFloor, true},
		{analyzeFloor, 2*analyzeFloor - 1, false},
		{analyzeFloor, 2 * analyzeFloor, true},
		{analyzeCeiling - 1, 2 * (analyzeCeiling - 1), true},
		{analyzeCeiling, 2 * analyzeCeiling, false},
		{analyzeCeiling, 1000 * analyzeCeiling, false},
	} {
		s.analyzedAt[tasks].Store(c.analyzed)
		s.written[tasks].Store(c.written)
		if got := slices.Contains(s.dueTables(), "tasks"); got != c.due {
			t.Errorf("analyzed at %d rows, %d written: due %v, want %v", c.analyzed, c.written, got, c.due)
		}
	}
}
