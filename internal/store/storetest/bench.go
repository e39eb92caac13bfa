package storetest

import (
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/store"
)

// BenchClaimPastOtherType measures what a worker of one type, whose three
// tasks are scheduled two hours ahead, pays while n tasks of another type
// wait, half of them due and half scheduled ahead: its claim finding
// nothing (an idle worker's long-poll, which every commit that creates a
// task wakes) by its type, by a prefix, and as a worker of twenty other
// types, none with a task; and the read of when its next task is due. The
// claims are at one moment, so the store's list of the types with pending
// tasks is read once, as it is about once a second in a deployment. db is
// s's database, for filling it in one statement each.
func BenchClaimPastOtherType(b *testing.B, s store.Store, db *sql.DB, n int) {
	now := time.Now().UTC()
	us := strconv.FormatInt(now.UnixMicro(), 10)
	// One statement both databases run, with no placeholders: their
	// styles differ.
	if _, err := db.ExecContext(b.Context(), `WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < `+strconv.Itoa(n)+`)
		INSERT INTO tasks (id, type, payload, status, priority, run_at, attempt, max_attempts, created_at, updated_at)
		SELECT 'busy' || x, 'busy.a.v1', '{}', 'pending', 100, `+us+` + (x % 2) * 7200000000 - 3600000000 + x, 0, 3, `+us+`, `+us+` FROM g`); err != nil {
		b.Fatal(err)
	}
	// Three of the worker's type scheduled two hours ahead, after every
	// task of the other type: its claims walk the type and find nothing
	// due, and its next task is the first of them.
	if _, err := db.ExecContext(b.Context(), `INSERT INTO tasks (id, type, payload, status, priority, run_at, attempt, max_attempts, created_at, updated_at)
		SELECT 'rare' || x, 'rare.a.v1', '{}', 'pending', 100, `+us+` + 7200000000 + x, 0, 3, `+us+`, `+us+` FROM (SELECT 1 AS x UNION ALL SELECT 2 UNION ALL SELECT 3) AS g`); err != nil {
		b.Fatal(err)
	}
	if _, err := db.ExecContext(b.Context(), `ANALYZE tasks`); err != nil {
		b.Fatal(err)
	}
	var many []string // a worker handling twenty types, none with a task
	for i := range 20 {
		many = append(many, "rare.t"+strconv.Itoa(i)+".v1")
	}
	for _, patterns := range [][]string{{"rare.a.v1"}, {"rare.%"}, many} {
		name := patterns[0]
		if len(patterns) > 1 {
			name = strconv.Itoa(len(patterns)) + "-types"
		}
		b.Run("idle-claim/"+name, func(b *testing.B) {
			for b.Loop() {
				c, err := s.ClaimOrNext(b.Context(), store.ClaimTasks{Patterns: patterns, WorkerID: "w", Lease: time.Minute, Max: 16, Now: now})
				if err != nil || len(c.Tasks) != 0 {
					b.Fatalf("claim: %d tasks, %v", len(c.Tasks), err)
				}
			}
		})
	}
	b.Run("next-due", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := s.NextTaskDue(b.Context(), []string{"rare.a.v1"}, now); err != nil {
				b.Fatal(err)
			}
		}
	})
}
