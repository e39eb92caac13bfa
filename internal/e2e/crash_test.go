package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCrashRecovery kills the server with SIGKILL while runs are sleeping,
// waiting for a webhook and in the middle of an HTTP request, restarts it on
// the same database, and checks that every run finishes as designed.
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the ferry binary")
	}
	backends(t, func(t *testing.T, db string) {
		up := newUpstream(t)
		var mu sync.Mutex
		hung := map[string]bool{} // run ids whose first /work call hangs
		arrived := make(chan string, 16)
		up.handle("/work", func(w http.ResponseWriter, r *http.Request) {
			run := r.Header.Get("X-Ferry-Run-Id")
			mu.Lock()
			first := !hung[run]
			hung[run] = true
			mu.Unlock()
			if first {
				arrived <- run
				<-r.Context().Done() // until the server dies
				return
			}
			fmt.Fprint(w, `{"done": true}`)
		})
		addr := freePort(t)
		srv := startServer(t, addr, db)
		c := client{t, "http://" + addr}
		c.must(201, "POST", "/api/v1/workflows", fmt.Sprintf(`{"name": "sleeper", "tasks": {"nap": {"sleep": "4s"}, "after": {"needs": ["nap"], "url": "%s/after-sleep"}}}`, up.URL))
		c.must(201, "POST", "/api/v1/workflows", fmt.Sprintf(`{"name": "waiter", "tasks": {"w": {"wait_for_webhook": {"timeout": "1h"}}, "after": {"needs": ["w"], "if": "tasks.w.body.ok == true", "url": "%s/after-wait"}}}`, up.URL))
		c.must(201, "POST", "/api/v1/workflows", fmt.Sprintf(`{"name": "caller", "tasks": {"call": {"url": "%[1]s/work", "timeout": "1m"}, "after": {"needs": ["call"], "url": "%[1]s/after-call"}}}`, up.URL))

		const n = 3
		var sleepers, waiters, callers []string
		for i := 0; i < n; i++ {
			sleepers = append(sleepers, c.trigger("sleeper", `{}`))
			waiters = append(waiters, c.trigger("waiter", `{}`))
			callers = append(callers, c.trigger("caller", `{}`))
		}
		for i := 0; i < n; i++ {
			select {
			case <-arrived:
			case <-time.After(20 * time.Second):
				t.Fatal("HTTP steps never reached the upstream")
			}
		}
		c.waitAll(waiters, "waiting", 20*time.Second, func(r map[string]any) bool { return task(r, "w")["status"] == "waiting" })
		callbacks := make([]string, n)
		for i, id := range waiters {
			callbacks[i] = task(c.run(id), "w")["callback_url"].(string)
		}
		// Everything is mid-flight at the moment of the kill.
		for _, id := range sleepers {
			if st := task(c.run(id), "nap")["status"]; st != "sleeping" {
				t.Fatalf("sleeper %s is %v before the kill; want sleeping", id, st)
			}
		}
		srv.kill()

		startServer(t, addr, db)
		for _, cb := range callbacks {
			resp, err := http.Post(cb, "application/json", strings.NewReader(`{"ok": true}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 202 {
				t.Fatalf("callback after restart: %d", resp.StatusCode)
			}
		}
		all := append(append(append([]string{}, sleepers...), waiters...), callers...)
		c.waitAll(all, "every run completed", 60*time.Second, func(r map[string]any) bool { return r["status"] == "completed" })
		for _, id := range all {
			r := c.run(id)
			for name, tk := range r["tasks"].(map[string]any) {
				if st := tk.(map[string]any)["status"]; st != "success" {
					t.Errorf("run %s step %s: %v", id, name, tk)
				}
			}
		}
		for _, p := range []string{"/after-sleep", "/after-wait", "/after-call"} {
			if got := len(up.requests(p)); got != n {
				t.Errorf("%s called %d times, want %d", p, got, n)
			}
		}
		// Each interrupted call was redone once after the lease expired,
		// with the same idempotency key.
		keys := map[string]int{}
		for _, r := range up.requests("/work") {
			keys[r.Headers.Get("Idempotency-Key")]++
		}
		for _, id := range callers {
			if keys[id+":call"] != 2 {
				t.Errorf("run %s: /work called %d times with its key, want 2 (interrupted + redone)", id, keys[id+":call"])
			}
		}
	})
}
