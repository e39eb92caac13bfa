package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ferryclient "github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// testWorkerBinary builds internal/e2e/testworker.
func testWorkerBinary(t *testing.T) string {
	return buildBinary(t, "github.com/ferryhq/ferry/internal/e2e/testworker", "testworker")
}

// startWorker runs a testworker process against the server at base; its
// handled task ids go to out.
func startWorker(t *testing.T, base, out string, args ...string) *proc {
	t.Helper()
	args = append([]string{"--server", base, "--out", out}, args...)
	p := spawn(t, exec.Command(testWorkerBinary(t), args...))
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("worker %v output:\n%s", args, p.output())
		}
	})
	return p
}

// outLines reads a worker's out-file (missing means empty).
func outLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

func count(lines []string, id string) int {
	n := 0
	for _, l := range lines {
		if l == id {
			n++
		}
	}
	return n
}

// waitUntil polls cond until it holds.
func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

// TestWorkerKilledMidTask SIGKILLs a worker process holding a task: the task
// is reclaimed once the lease runs out, and another worker completes it,
// exactly once as recorded state.
func TestWorkerKilledMidTask(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the ferry and testworker binaries")
	}
	backends(t, func(t *testing.T, db string) {
		ctx := context.Background()
		addr := freePort(t)
		srv := startServer(t, addr, db)
		base := "http://" + addr
		c := ferryclient.New(base, apiKey)
		task, _, err := c.CreateTask(ctx, ferryclient.NewTask{Type: "jobs.slow.v1", Payload: json.RawMessage(`{"size": 3}`)})
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		hangOut, noopOut := filepath.Join(dir, "hang.out"), filepath.Join(dir, "noop.out")
		hang := startWorker(t, base, hangOut, "--types", "jobs.slow.v1", "--mode", "hang", "--lease", "2s", "--worker-id", "hang-1")

		waitUntil(t, "the hanging worker to hold the task", 30*time.Second, func() bool {
			got, err := c.GetTask(ctx, task.ID)
			if err != nil {
				t.Fatal(err)
			}
			return got.Status == ferryclient.TaskLeased && got.LeasedBy == "hang-1" && count(outLines(t, hangOut), task.ID) == 1
		})
		hang.kill() // SIGKILL: no shutdown code runs, no report is sent
		killed := time.Now()

		startWorker(t, base, noopOut, "--types", "jobs.slow.v1", "--mode", "noop", "--lease", "2s", "--worker-id", "noop-1")
		var done *ferryclient.Task
		waitUntil(t, "the task to succeed on the second worker", 30*time.Second, func() bool {
			done, err = c.GetTask(ctx, task.ID)
			if err != nil {
				t.Fatal(err)
			}
			return done.Terminal()
		})
		t.Logf("reclaimed and completed %s after the kill", time.Since(killed).Round(time.Millisecond))
		if done.Status != ferryclient.TaskSucceeded || done.Attempt != 2 || string(done.Result) != `{"ok":true,"worker":"noop-1"}` {
			t.Fatalf("task: %s\nserver:\n%s", done.Raw, srv.output())
		}
		evs, err := c.TaskEvents(ctx, task.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		var order []string
		for _, ev := range evs {
			n[ev.Type]++
			order = append(order, ev.Type)
		}
		if n["succeeded"] != 1 || n["lease_expired"] != 1 || n["claimed"] != 2 || n["failed"] != 0 || n["retried"] != 0 {
			t.Fatalf("events %v", order)
		}
		if got := count(outLines(t, noopOut), task.ID); got != 1 {
			t.Fatalf("the second worker ran the task %d times", got)
		}
		if got := count(outLines(t, hangOut), task.ID); got != 1 {
			t.Fatalf("the killed worker ran the task %d times", got)
		}
	})
}

// TestWorkersDrainPostgres runs 4 worker processes against one server on
// Postgres: 5,000 tasks all complete, and none runs twice.
func TestWorkersDrainPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the ferry and testworker binaries")
	}
	const (
		tasks   = 5000
		workers = 4
	)
	db := pgtest.DSN(t)
	addr := freePort(t)
	srv := startServer(t, addr, db)
	base := "http://" + addr
	c := ferryclient.New(base, apiKey)
	ctx := context.Background()
	dir := t.TempDir()
	outs := make([]string, workers)
	for i := range outs {
		outs[i] = filepath.Join(dir, fmt.Sprintf("w%d.out", i))
		startWorker(t, base, outs[i], "--types", "bulk.noop.v1", "--mode", "noop", "--concurrency", "16", "--lease", "30s", "--worker-id", fmt.Sprintf("w%d", i))
	}

	// Producers run while the workers drain.
	begin := time.Now()
	ids := make([]string, tasks)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= tasks {
					return
				}
				task, created, err := c.CreateTask(ctx, ferryclient.NewTask{Type: "bulk.noop.v1", Payload: json.RawMessage(fmt.Sprintf(`{"i": %d}`, i))})
				if err == nil && !created {
					err = fmt.Errorf("task %d: not created", i)
				}
				if err != nil {
					errs <- err
					return
				}
				ids[i] = task.ID
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("created %d tasks in %s", tasks, time.Since(begin).Round(time.Millisecond))

	want := make(map[string]bool, tasks)
	for _, id := range ids {
		want[id] = true
	}
	// Wait until every task was handled, counting the workers' records.
	var seen map[string]int
	perWorker := make([]int, workers)
	waitUntil(t, "every task to be handled", 120*time.Second, func() bool {
		seen = make(map[string]int, tasks)
		for i, out := range outs {
			lines := outLines(t, out)
			perWorker[i] = len(lines)
			for _, id := range lines {
				seen[id]++
			}
		}
		return len(seen) >= tasks
	})
	t.Logf("handled %d tasks in %s; per worker %v", tasks, time.Since(begin).Round(time.Millisecond), perWorker)
	for id, n := range seen {
		if !want[id] {
			t.Fatalf("a worker handled unknown task %s", id)
		}
		if n != 1 {
			t.Fatalf("task %s was handled %d times", id, n)
		}
	}
	for i, n := range perWorker {
		if n == 0 {
			t.Errorf("worker %d handled nothing: the load was not shared", i)
		}
	}

	// Every task is recorded as succeeded, on its first attempt. A handled
	// task's completion may still be on its way: poll each until terminal.
	var bad atomic.Int64
	var mu sync.Mutex
	var problems []string
	work := make(chan string)
	deadline := time.Now().Add(30 * time.Second)
	for range 16 {
		wg.Go(func() {
			for id := range work {
				for {
					task, err := c.GetTask(ctx, id)
					if err == nil && task.Terminal() {
						var res struct {
							OK     bool   `json:"ok"`
							Worker string `json:"worker"`
						}
						_ = json.Unmarshal(task.Result, &res)
						if task.Status != ferryclient.TaskSucceeded || task.Attempt != 1 || !res.OK || !strings.HasPrefix(res.Worker, "w") {
							bad.Add(1)
							mu.Lock()
							problems = append(problems, string(task.Raw))
							mu.Unlock()
						}
						break
					}
					if time.Now().After(deadline) {
						bad.Add(1)
						mu.Lock()
						problems = append(problems, fmt.Sprintf("task %s not finished: %v %v", id, task, err))
						mu.Unlock()
						break
					}
					time.Sleep(50 * time.Millisecond) // polling interval
				}
			}
		})
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d tasks not succeeded exactly once on attempt 1, e.g.:\n%s\nserver:\n%s", n, strings.Join(problems[:min(5, len(problems))], "\n"), srv.output())
	}
	t.Logf("verified %d tasks in %s total", tasks, time.Since(begin).Round(time.Millisecond))
}
