package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/worker"
)

// TestWorkloadsReportEveryKey runs each workload small on both backends and
// checks the JSON line carries the keys tools read. Timing is not asserted.
func TestWorkloadsReportEveryKey(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every workload")
	}
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			database := db
			if db == "postgres" {
				// The bench makes its own schema; pgtest only proves the
				// server is there (and fails under CI when it is not).
				dsn := pgtest.DSN(t)
				database = dsn[:strings.Index(dsn, "?")] + "?sslmode=disable"
			}
			var out bytes.Buffer
			res, err := Run(t.Context(), Options{Workload: "all", Database: database, N: 12, Workers: 8, Timeout: time.Minute}, &out)
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 4 {
				t.Fatalf("%d results", len(res))
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 4 {
				t.Fatalf("%d JSON lines", len(lines))
			}
			for i, line := range lines {
				var m map[string]any
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatal(err)
				}
				for _, k := range []string{"workload", "backend", "n", "completed", "total_s", "units_per_s", "steps_per_s", "latency_ms", "handoff_ms", "lateness_ms", "peak_rss_mb", "settings"} {
					if _, ok := m[k]; !ok {
						t.Errorf("%s: key %q missing", m["workload"], k)
					}
				}
				r := res[i]
				if r.Completed != 12 || r.Backend != db || r.UnitsPerS <= 0 {
					t.Errorf("%s: %+v", r.Workload, r)
				}
			}
			if res[1].HandoffMS == nil || res[3].LatenessMS == nil {
				t.Errorf("chain10 needs handoff_ms and sleep lateness_ms")
			}
		})
	}
}

// TestPostgresMaxConnsOption: a Postgres URL may carry Ferry's
// ferry_max_conns, which the bench passes to the engine (and records)
// but not to the connection that makes its schema.
func TestPostgresMaxConnsOption(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a workload")
	}
	dsn := pgtest.DSN(t)
	database := dsn[:strings.Index(dsn, "?")] + "?sslmode=disable&ferry_max_conns=4"
	res, err := Run(t.Context(), Options{Workload: "chain10", Database: database, N: 5, Workers: 2, Timeout: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.Completed != 5 || r.Settings["postgres_max_conns"] != "4" {
		t.Fatalf("chain10 with ferry_max_conns=4: completed %d, postgres_max_conns %v", r.Completed, r.Settings["postgres_max_conns"])
	}
}

// TestSleepRSSAndRepeat: sleep-rss holds every run asleep, start times
// every run's first step, and --repeat reports the median run with every
// run's rate in settings.
func TestSleepRSSAndRepeat(t *testing.T) {
	if testing.Short() {
		t.Skip("runs workloads")
	}
	res, err := Run(t.Context(), Options{Workload: "sleep-rss", Database: "sqlite", N: 30, Workers: 4, Timeout: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.Completed != 30 || r.PeakRSSMB <= 0 {
		t.Errorf("sleep-rss: %+v", r)
	}
	res, err = Run(t.Context(), Options{Workload: "start", Database: "sqlite", N: 20, Workers: 4, Timeout: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.Completed != 20 || r.LatencyMS == nil || r.LatencyMS.P50 <= 0 {
		t.Errorf("start: every run's first step must be timed: %+v", r)
	}
	var allocs bytes.Buffer
	res, err = Run(t.Context(), Options{Workload: "jobs", Database: "sqlite", N: 10, Workers: 4, Repeat: 3, Timeout: time.Minute, Allocs: &allocs}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// One allocation line a run: a job allocates objects and bytes.
	lines := strings.Split(strings.TrimSpace(allocs.String()), "\n")
	for _, l := range lines {
		var objects, size float64
		if _, err := fmt.Sscanf(l, "allocs jobs sqlite: %f objects and %f bytes a unit", &objects, &size); err != nil || objects <= 0 || size <= objects {
			t.Errorf("allocation line %q: %v", l, err)
		}
	}
	if len(lines) != 3 {
		t.Errorf("%d allocation lines for 3 runs: %q", len(lines), allocs.String())
	}
	all, _ := res[0].Settings["units_per_s_all"].([]float64)
	if len(all) != 3 || res[0].Settings["repeats"] != 3 {
		t.Fatalf("settings = %v", res[0].Settings)
	}
	lower := 0
	for _, v := range all {
		if v < res[0].UnitsPerS {
			lower++
		}
	}
	if lower != 1 && !(all[0] == all[1] || all[1] == all[2] || all[0] == all[2]) {
		t.Errorf("reported %v is not the median of %v", res[0].UnitsPerS, all)
	}
}

// TestScaleReportsEachLevel: scale measures hand-off and claim latency at
// three retained sizes and reports one line per level.
func TestScaleReportsEachLevel(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a workload")
	}
	var out bytes.Buffer
	res, err := Run(t.Context(), Options{Workload: "scale", Database: "sqlite", N: 300, Workers: 8, Timeout: time.Minute}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 || strings.Count(out.String(), "\n") != 3 {
		t.Fatalf("%d results, output:\n%s", len(res), out.String())
	}
	for i, want := range []int{3, 30, 300} {
		r := res[i]
		if r.N != want || r.Completed != want || r.HandoffMS == nil || r.LatencyMS == nil {
			t.Errorf("level %d: %+v", i, r)
		}
	}
}

// TestDefaultWorkers: unless told, jobs runs River's benchmark's 2,000
// handlers, chain10 16 and the other workflows 64, and settings say
// which ran.
func TestDefaultWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs workloads")
	}
	for _, tc := range []struct {
		workload string
		want     int
	}{{"jobs", 2000}, {"chain10", 16}, {"fanout", 64}} {
		res, err := Run(t.Context(), Options{Workload: tc.workload, Database: "sqlite", N: 5, Timeout: time.Minute}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := res[0].Settings["workers"]; got != tc.want || res[0].Completed != 5 {
			t.Errorf("%s: workers %v (completed %d), want %d", tc.workload, got, res[0].Completed, tc.want)
		}
	}
}

// TestRatePacesTriggers: with a rate, the runs triggered one at a time
// are spread over n/rate seconds (the last of 21 at 100 a second is
// triggered 0.2 s after the first, so the sleep workload spans about
// 1.2 s; all at once it spans about 1.0 s), the rate is in settings, and
// the workloads that create their runs another way refuse one. The span
// starts at the first run's start as stored, which a slow first commit
// (the first of a fresh database, under the race detector) puts tens of
// milliseconds after its trigger: hence 1.15 s, not 1.2.
func TestRatePacesTriggers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a workload")
	}
	res, err := Run(t.Context(), Options{Workload: "sleep", Database: "sqlite", N: 21, Workers: 4, Rate: 100, Timeout: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.Completed != 21 || r.TotalS < 1.15 || r.Settings["trigger_rate"] != 100.0 {
		t.Errorf("sleep at 100 runs/s: completed %d over %.3f s (want 21 over ≥ 1.15 s), trigger_rate %v", r.Completed, r.TotalS, r.Settings["trigger_rate"])
	}
	for _, w := range []string{"jobs", "start"} {
		if _, err := Run(t.Context(), Options{Workload: w, Database: "sqlite", N: 5, Rate: 100, Timeout: time.Minute}, nil); err == nil || !strings.Contains(err.Error(), "--rate") {
			t.Errorf("%s with a rate: err %v, want one naming --rate", w, err)
		}
	}
}

// TestHTTPTransport: with transport http the workers and the triggers go
// through the engine's API on loopback (the requests it served are
// counted: at least a trigger, a claim and a report), and an unknown
// transport is refused.
func TestHTTPTransport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs workloads")
	}
	for _, w := range []string{"jobs", "chain10", "start"} {
		res, err := Run(t.Context(), Options{Workload: w, Database: "sqlite", N: 6, Workers: 4, Transport: "http", Timeout: time.Minute}, nil)
		if err != nil {
			t.Fatalf("%s: %v", w, err)
		}
		r := res[0]
		n, _ := r.Settings["http_requests"].(int64)
		if r.Completed != 6 || r.Settings["transport"] != "http" || n < 3 {
			t.Errorf("%s: completed %d, settings %v", w, r.Completed, r.Settings)
		}
	}
	res, err := Run(t.Context(), Options{Workload: "jobs", Database: "sqlite", N: 6, Workers: 4, Timeout: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res[0].Settings["http_requests"]; ok || res[0].Settings["transport"] != "embedded" {
		t.Errorf("embedded: settings %v", res[0].Settings)
	}
	if _, err := Run(t.Context(), Options{Workload: "jobs", Database: "sqlite", N: 6, Transport: "grpc", Timeout: time.Minute}, nil); err == nil || !strings.Contains(err.Error(), "transport") {
		t.Errorf("transport grpc: %v", err)
	}
	// scale times its claims in process: it refuses http rather than
	// label those figures HTTP.
	if _, err := Run(t.Context(), Options{Workload: "scale", Database: "sqlite", N: 300, Transport: "http", Timeout: time.Minute}, nil); err == nil || !strings.Contains(err.Error(), "--transport http") {
		t.Errorf("scale over http: %v", err)
	}
}

// TestSeveralNodes: with Nodes the workloads run on engines sharing one
// Postgres database, the workers shared out among them and every node's
// workers handling some of the tasks of jobs and chain10 (the triggers go
// to the nodes in turn and wake their own workers; in sleep either node's
// timer loop may fire every wake-up); several nodes are refused where
// they cannot apply. It checks the benchmark's plumbing: that a node
// wakes another's waiting claims is TestPeerTaskWakesWaitingClaim's.
func TestSeveralNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs workloads")
	}
	dsn := pgtest.DSN(t)
	database := dsn[:strings.Index(dsn, "?")] + "?sslmode=disable"
	for _, w := range []string{"jobs", "chain10", "sleep"} {
		n := 20
		if w == "jobs" {
			// Created in one batch through node 0, then drained: enough
			// for both nodes' claims to find some.
			n = 400
		}
		res, err := Run(t.Context(), Options{Workload: w, Database: database, N: n, Workers: 5, Nodes: 2, Timeout: time.Minute}, nil)
		if err != nil {
			t.Fatalf("%s: %v", w, err)
		}
		r := res[0]
		tasks, _ := r.Settings["node_tasks"].([]int64)
		want := int64(n)
		if w == "chain10" {
			want = 200
		}
		split, _ := r.Settings["workers_per_node"].([]int)
		if r.Completed != n || r.Settings["nodes"] != 2 || !slices.Equal(split, []int{3, 2}) || len(tasks) != 2 || tasks[0]+tasks[1] != want || (w != "sleep" && (tasks[0] == 0 || tasks[1] == 0)) {
			t.Errorf("%s: completed %d, settings %v", w, r.Completed, r.Settings)
		}
		// Both nodes' batches are summed: every task was reported in one.
		if ob, _ := r.Settings["optimistic_batches"].(map[string]int64); ob["written"]+ob["redecided"]+ob["stale"] == 0 {
			t.Errorf("%s: optimistic_batches %v, want the nodes' batches", w, r.Settings["optimistic_batches"])
		}
	}
	for _, o := range []Options{
		{Workload: "jobs", Database: "sqlite", Nodes: 2},
		{Workload: "jobs", Database: database, Nodes: 2, Transport: "http"},
		{Workload: "scale", Database: database, Nodes: 2},
		{Workload: "jobs", Database: database, Nodes: 3, Workers: 2},
		{Workload: "chain10", Database: database, Nodes: 20}, // its default 16 workers
	} {
		if _, err := Run(t.Context(), o, nil); err == nil || !strings.Contains(err.Error(), "--nodes") {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// TestSQLiteSynchronousSetting: settings.sqlite_synchronous names the
// level the store runs at, which reads the option in any case: NORMAL is
// no sync of Ferry's own, and must not be reported as full.
func TestSQLiteSynchronousSetting(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a workload")
	}
	for _, tc := range []struct{ database, want string }{
		{"sqlite", "full"},
		{"sqlite:x?synchronous=normal", "normal"},
		{"sqlite:x?synchronous=NORMAL", "normal"},
		{"sqlite:x?synchronous=Full", "full"},
	} {
		res, err := Run(t.Context(), Options{Workload: "jobs", Database: tc.database, N: 4, Workers: 2, Timeout: time.Minute}, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.database, err)
		}
		if got := res[0].Settings["sqlite_synchronous"]; got != tc.want {
			t.Errorf("%s: sqlite_synchronous %v, want %s", tc.database, got, tc.want)
		}
	}
}

// TestFailedTasksFailTheWorkload: a workload in which tasks failed gives
// an error, not figures. A run whose last step's task failed ends as
// completed (no step is blocked; the step statuses tell), so counting
// completed runs alone reported every such run of jobs as done.
func TestFailedTasksFailTheWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a workload")
	}
	o := Options{Database: "sqlite", N: 6, Workers: 2, Concurrency: 8, Timeout: time.Minute}
	var calls atomic.Int64
	e, err := start(t.Context(), o, func(context.Context, *worker.Task) (any, error) {
		if calls.Add(1) <= 3 {
			return nil, errors.New("the first three tasks fail")
		}
		return map[string]any{"ok": true}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.stop()
	def := `{"name": "bench-failing", "tasks": {"job": {"retries": 0, "task": {"type": "bench.noop.v1"}}}}`
	r, _, err := e.drive(t.Context(), o, "failing", def, 1, 1, false, false)
	if err == nil || !strings.Contains(err.Error(), "3 task attempts failed") {
		t.Fatalf("three of six tasks failed: err %v, result %+v", err, r)
	}
}
