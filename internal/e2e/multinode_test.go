package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// TestTwoNodesShareOnePostgres runs two server processes on one database and
// triggers runs on both: every step executes once per attempt, and no run's
// DAG is advanced twice for one event.
func TestTwoNodesShareOnePostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the ferry binary")
	}
	t.Parallel()
	db := pgtest.DSN(t)
	up := newUpstream(t)
	var mu sync.Mutex
	calls := map[string]int{} // run:step:attempt -> count
	up.handle("/step", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.Header.Get("X-Ferry-Run-Id")+":"+r.Header.Get("X-Ferry-Step")+":"+r.Header.Get("X-Ferry-Attempt")]++
		mu.Unlock()
		fmt.Fprint(w, `{"ok": true}`)
	})
	a := startServer(t, freePort(t), db)
	b := startServer(t, freePort(t), db)
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
