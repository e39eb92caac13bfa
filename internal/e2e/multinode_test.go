package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// TestTwoNodesShareOnePostgres runs two server processes on one database and
// triggers runs on both: every step executes once per attempt, and no run's
// DAG is advanced twice for one event.
func TestTwoNodesShareOnePostgres(t *testing.T) {
	db := nodesDB(t)
	up := newUpstream(t)
	var mu sync.Mutex
	calls := map[string]int{} // run:step:attempt -> count
	up.handle("/step", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.Header.Get("X-Ferry-Run-Id")+":"+r.Header.Get("X-Ferry-Step")+":"+r.Header.Get("X-Ferry-Attempt")]++
		mu.Unlock()
		fmt.Fprint(w, `{"ok": true}`)
	})
	// A lease of 10 s, not the suite's 2 s: with the whole suite's race-
	// built servers on two cores, a node went without renewing its leases
	// for over a second (its log: a dozen leases lost within half a
	// second, a connection dropped), the 2 s leases ran out and the other
	// node sent those attempts again, as an expired lease allows. This
	// test is about two nodes sharing the runs, not about leases running
	// out (TestStaleLeaseSendsNoRequest and the crash tests are).
	a := startServer(t, freePort(t), db, "--lease", "10s")
	b := startServer(t, freePort(t), db, "--lease", "10s")
	ca, cb := client{t, "http://" + a.addr}, client{t, "http://" + b.addr}
	ca.must(201, "POST", "/api/v1/workflows", fmt.Sprintf(`{"name": "fan", "tasks": {
		"a": {"url": "%[1]s/step"},
		"b1": {"needs": ["a"], "url": "%[1]s/step"},
		"b2": {"needs": ["a"], "url": "%[1]s/step"},
		"b3": {"needs": ["a"], "url": "%[1]s/step"},
		"b4": {"needs": ["a"], "url": "%[1]s/step"},
		"nap": {"needs": ["a"], "sleep": "200ms"},
		"z": {"needs": ["b1", "b2", "b3", "b4", "nap"], "url": "%[1]s/step"}}}`, up.URL))

	const runs = 40
	ids := make([]string, runs)
	var wg sync.WaitGroup
	for i := 0; i < runs; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := ca
			if i%2 == 1 {
				c = cb
			}
			code, out := c.do("POST", "/api/v1/workflows/fan/trigger", `{}`)
			if code != 201 {
				t.Errorf("trigger: %d %v", code, out)
				return
			}
			ids[i] = out["data"].(map[string]any)["run_id"].(string)
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	ca.waitAll(ids, "completed", 60*time.Second, func(r map[string]any) bool { return r["status"] == "completed" })
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		for _, step := range []string{"a", "b1", "b2", "b3", "b4", "z"} {
			if n := calls[id+":"+step+":1"]; n != 1 {
				t.Errorf("run %s step %s attempt 1 executed %d times", id, step, n)
			}
		}
		evs := ca.must(200, "GET", "/api/v1/runs/"+id+"/events", "")["data"].([]any)
		started := map[string]int{}
		for i, ev := range evs {
			ev := ev.(map[string]any)
			if ev["seq"] != float64(i+1) {
				t.Errorf("run %s: event %d has seq %v", id, i, ev["seq"])
			}
			if ev["type"] == "step_started" || ev["type"] == "step_sleeping" {
				started[ev["step"].(string)]++
			}
		}
		for step, n := range started {
			if n != 1 {
				t.Errorf("run %s: step %s started %d times (DAG advanced twice)", id, step, n)
			}
		}
	}
	if len(calls) != runs*6 {
		t.Errorf("%d distinct executions, want %d", len(calls), runs*6)
	}
}

// TestTwoNodesShareTaskReports: workers claim a run's task steps from one
// server and report them to either, so the parallel steps of one run are
// reported to both servers at once and each writes runs the other has
// cached (on Postgres a server decides a report batch on the runs and
// tasks it holds, and writes a row only if nobody wrote it since). Every
// task is handed out once, every run completes with each step started
// once, and its events are numbered without gap or repeat.
func TestTwoNodesShareTaskReports(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the ferry binary")
	}
	t.Parallel()
	db := pgtest.DSN(t)
	a := startServer(t, freePort(t), db)
	b := startServer(t, freePort(t), db)
	nodes := []client{{t, "http://" + a.addr}, {t, "http://" + b.addr}}
	nodes[0].must(201, "POST", "/api/v1/workflows", `{"name": "tfan", "tasks": {
		"a": {"task": {"type": "tfan.x.v1"}},
		"b1": {"needs": ["a"], "task": {"type": "tfan.x.v1"}},
		"b2": {"needs": ["a"], "task": {"type": "tfan.x.v1"}},
		"b3": {"needs": ["a"], "task": {"type": "tfan.x.v1"}},
		"b4": {"needs": ["a"], "task": {"type": "tfan.x.v1"}},
		"z": {"needs": ["b1", "b2", "b3", "b4"], "task": {"type": "tfan.x.v1"}}}}`)

	const runs, workers = 30, 8
	ids := make([]string, runs)
	for i := range ids {
		ids[i] = nodes[i%2].trigger("tfan", `{}`)
	}
	var mu sync.Mutex
	claimed := map[string]int{} // run:step -> times handed out
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				code, out := nodes[(w+n)%2].do("POST", "/api/v1/tasks/claim", fmt.Sprintf(`{"types": ["tfan.%%"], "worker_id": "w%d", "lease_seconds": 60, "max": 4, "wait_seconds": 1}`, w))
				if code != 200 {
					t.Errorf("claim: %d %v", code, out)
					return
				}
				tasks := out["data"].([]any)
				var done sync.WaitGroup
				for k, tk := range tasks {
					tk := tk.(map[string]any)
					mu.Lock()
					claimed[fmt.Sprint(tk["run_id"])+":"+fmt.Sprint(tk["step"])]++
					mu.Unlock()
					// Each task of the claim reported at once, to either
					// server: a run's parallel steps meet on both.
					done.Go(func() {
						body := fmt.Sprintf(`{"lease_token": %q, "result": {"ok": true}}`, tk["lease_token"])
						if code, out := nodes[(w+n+k)%2].do("POST", "/api/v1/tasks/"+tk["id"].(string)+"/complete", body); code != 200 {
							t.Errorf("complete %s: %d %v", tk["id"], code, out)
						}
					})
				}
				done.Wait()
			}
		})
	}
	nodes[0].waitAll(ids, "completed", 60*time.Second, func(r map[string]any) bool { return r["status"] == "completed" })
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		for _, step := range []string{"a", "b1", "b2", "b3", "b4", "z"} {
			if n := claimed[id+":"+step]; n != 1 {
				t.Errorf("run %s step %s handed out %d times", id, step, n)
			}
		}
		evs := nodes[1].must(200, "GET", "/api/v1/runs/"+id+"/events", "")["data"].([]any)
		started := map[string]int{}
		for i, ev := range evs {
			ev := ev.(map[string]any)
			if ev["seq"] != float64(i+1) {
				t.Errorf("run %s: event %d has seq %v", id, i, ev["seq"])
			}
			if ev["type"] == "step_started" {
				started[ev["step"].(string)]++
			}
		}
		if len(started) != 6 {
			t.Errorf("run %s: steps started %v, want all six once", id, started)
		}
		for step, n := range started {
			if n != 1 {
				t.Errorf("run %s: step %s started %d times (DAG advanced twice)", id, step, n)
			}
		}
	}
	if len(claimed) != runs*6 {
		t.Errorf("%d distinct tasks handed out, want %d", len(claimed), runs*6)
	}
}

// TestKilledNodeLeavesTimerShare: of two nodes on one Postgres, one is
// killed (SIGKILL: no goodbye) while runs triggered on both sleep. The
// other finds the killed node's LISTEN connection gone and takes the
// node out of its timer share (it logs both the node's joining and its
// leaving, under one id), and every run's wake-up is fired: the runs
// whose timers were the killed node's complete too.
func TestKilledNodeLeavesTimerShare(t *testing.T) {
	db := nodesDB(t)
	up := newUpstream(t)
	up.handle("/after", jsonReply(200, `{"ok": true}`))
	a := startServer(t, freePort(t), db, "--log-level", "info")
	b := startServer(t, freePort(t), db)
	joined := waitLog(t, a, "postgres node joined the timer share")
	ca, cb := client{t, "http://" + a.addr}, client{t, "http://" + b.addr}
	ca.must(201, "POST", "/api/v1/workflows", fmt.Sprintf(`{"name": "naps", "tasks": {
		"nap": {"sleep": "2s"},
		"after": {"needs": ["nap"], "url": "%s/after"}}}`, up.URL))
	var ids []string
	for i := range 16 {
		c := ca
		if i%2 == 1 {
			c = cb
		}
		ids = append(ids, c.trigger("naps", `{}`))
	}
	if n := ca.gauge("ferry_timer_share_nodes"); n != 2 {
		t.Errorf("a counts %v servers in the timer share with b running, want 2", n)
	}
	b.kill()
	gone := waitLog(t, a, "postgres node gone")
	if id := logAttr(joined, "node"); id == "" || id != logAttr(gone, "node") {
		t.Errorf("the node that joined (%q) is not the one gone (%q)", joined, gone)
	}
	if n := ca.gauge("ferry_timer_share_nodes"); n != 1 {
		t.Errorf("a counts %v servers in the timer share after b was killed, want 1", n)
	}
	ca.waitAll(ids, "completed", 30*time.Second, func(r map[string]any) bool { return r["status"] == "completed" })
}

// nodesDB is the database URL of a fresh schema for several server
// processes, with t parallel to other tests (skipped with -short). At
// most 16 connections a node, not 32: two nodes under load held 66, and
// with the other packages' tests running beside them the suite came
// within four of the local server's max_connections (100).
func nodesDB(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the ferry binary")
	}
	t.Parallel()
	return pgtest.WithParam(t, pgtest.DSN(t), "ferry_max_conns", "16")
}

// gauge is the value of an unlabelled metric in c's /metrics, or -1.
func (c client) gauge(name string) float64 {
	c.t.Helper()
	req, _ := http.NewRequest("GET", c.base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// waitLog waits for a line of p's output that contains s and returns it.
func waitLog(t *testing.T, p *proc, s string) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		for line := range strings.SplitSeq(p.output(), "\n") {
			if strings.Contains(line, s) {
				return line
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the log within 15s:\n%s", s, p.output())
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

// logAttr is the value of key in a log/slog text line, or "".
func logAttr(line, key string) string {
	for f := range strings.FieldsSeq(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}
