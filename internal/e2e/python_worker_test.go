package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The example worker in examples/python_worker, run as a real process
// against the ferry binary on both backends.

const pythonWorkerScript = "../../examples/python_worker/worker.py"

// requirePython returns the python3 interpreter; without one the test is
// skipped, except in CI, where the example must be tested.
func requirePython(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the ferry binary and a Python worker")
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("python3 is not on PATH; CI must run the Python example worker: %v", err)
		}
		t.Skip("python3 is not on PATH")
	}
	return py
}

// pyWorker is a running examples/python_worker/worker.py.
type pyWorker struct {
	t    *testing.T
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error // from Wait, once done is closed
}

func (w *pyWorker) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.Write(p)
}

func (w *pyWorker) output() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.String()
}

// startPyWorker starts the worker against the server at base; the process
// is killed at cleanup if it is still running.
func startPyWorker(t *testing.T, python, base string, args ...string) *pyWorker {
	t.Helper()
	script, err := filepath.Abs(pythonWorkerScript)
	if err != nil {
		t.Fatal(err)
	}
	w := &pyWorker{t: t, done: make(chan struct{})}
	w.cmd = exec.Command(python, append([]string{script, "--server", base}, args...)...)
	w.cmd.Env = append(os.Environ(), "FERRY_API_KEY="+apiKey, "NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost", "PYTHONUNBUFFERED=1")
	w.cmd.Stdout, w.cmd.Stderr = w, w
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.err = w.cmd.Wait(); close(w.done) }()
	t.Cleanup(func() {
		select {
		case <-w.done:
		default:
			_ = w.cmd.Process.Kill()
			<-w.done
		}
	})
	return w
}

// wait expects the worker to exit with status 0 within timeout.
func (w *pyWorker) wait(timeout time.Duration) {
	w.t.Helper()
	select {
	case <-w.done:
		if w.err != nil {
			w.t.Fatalf("python worker: %v; output:\n%s", w.err, w.output())
		}
	case <-time.After(timeout):
		w.t.Fatalf("python worker still running after %s; output:\n%s", timeout, w.output())
	}
}

// waitOutput waits until the worker has logged substr.
func (w *pyWorker) waitOutput(substr string, timeout time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(w.output(), substr) {
		if time.Now().After(deadline) {
			w.t.Fatalf("the python worker did not log %q within %s; output:\n%s", substr, timeout, w.output())
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

// waitTask polls a task until cond holds, failing after timeout.
func (c client) waitTask(id, what string, timeout time.Duration, cond func(task map[string]any) bool) map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		tk := c.must(200, "GET", "/api/v1/tasks/"+id, "")["data"].(map[string]any)
		if cond(tk) {
			return tk
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(tk, "", "  ")
			c.t.Fatalf("timed out waiting for task %s; task:\n%s", what, b)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

func (c client) taskEventTypes(id string) []string {
	c.t.Helper()
	var types []string
	for _, e := range c.must(200, "GET", "/api/v1/tasks/"+id+"/events", "")["data"].([]any) {
		types = append(types, e.(map[string]any)["type"].(string))
	}
	return types
}

func (c client) createTask(body string) string {
	c.t.Helper()
	return c.must(201, "POST", "/api/v1/tasks", body)["data"].(map[string]any)["id"].(string)
}

// TestPythonWorkerCompletesTaskStep: a workflow's task step is done by the
// Python example; its result feeds the next HTTP step.
func TestPythonWorkerCompletesTaskStep(t *testing.T) {
	python := requirePython(t)
	backends(t, func(t *testing.T, db string) {
		up := newUpstream(t)
		up.handle("/upload", jsonReply(200, `{"id": "img_1"}`))
		addr := freePort(t)
		startServer(t, addr, db)
		c := client{t, "http://" + addr}
		c.must(201, "POST", "/api/v1/workflows", fmt.Sprintf(`{"name": "thumbs", "tasks": {
			"upload": {"url": "%[1]s/upload"},
			"resize": {"needs": ["upload"], "task": {"type": "content.thumbnail.v1", "payload": {"id": "{{tasks.upload.body.id}}"}}, "retries": 4},
			"notify": {"needs": ["resize"], "url": "%[1]s/notify", "body": {"thumb": "{{tasks.resize.body.thumbnail}}"}}}}`, up.URL))
		runID := c.trigger("thumbs", `{}`)

		w := startPyWorker(t, python, c.base, "--types", "content.%", "--once", "--max-tasks", "1", "--wait", "20")
		c.waitAll([]string{runID}, "the run to finish", 40*time.Second, func(r map[string]any) bool { return r["status"] != "running" })
		w.wait(20 * time.Second)

		run := c.run(runID)
		if run["status"] != "completed" {
			b, _ := json.MarshalIndent(run, "", "  ")
			t.Fatalf("run is %v, want completed:\n%s\nworker output:\n%s", run["status"], b, w.output())
		}
		resize := task(run, "resize")
		if resize["type"] != "task" || resize["status"] != "success" || resize["attempt"] != 1.0 {
			t.Errorf("resize step: %v", resize)
		}
		if want := map[string]any{"thumbnail": "img_1-thumb.png"}; !reflect.DeepEqual(resize["body"], want) {
			t.Errorf("resize body %v, want %v", resize["body"], want)
		}
		reqs := up.requests("/notify")
		if len(reqs) != 1 {
			t.Fatalf("/notify got %d requests, want 1", len(reqs))
		}
		var got map[string]any
		if err := json.Unmarshal(reqs[0].Body, &got); err != nil || !reflect.DeepEqual(got, map[string]any{"thumb": "img_1-thumb.png"}) {
			t.Errorf("/notify body %s, want {\"thumb\": \"img_1-thumb.png\"}", reqs[0].Body)
		}
	})
}

// TestPythonWorkerNonRetryable: a handler raising NonRetryable fails the task
// at its first attempt, although attempts remain.
func TestPythonWorkerNonRetryable(t *testing.T) {
	python := requirePython(t)
	backends(t, func(t *testing.T, db string) {
		addr := freePort(t)
		startServer(t, addr, db)
		c := client{t, "http://" + addr}
		id := c.createTask(`{"type": "demo.fail.v1", "payload": {"reason": "corrupt image"}, "max_attempts": 5}`)

		w := startPyWorker(t, python, c.base, "--types", "demo.%", "--once", "--max-tasks", "1", "--wait", "5")
		w.wait(30 * time.Second)
		tk := c.waitTask(id, "failed", 10*time.Second, func(tk map[string]any) bool { return tk["status"] != "pending" && tk["status"] != "leased" })
		if tk["status"] != "failed" || tk["attempt"] != 1.0 || tk["last_error"] != "corrupt image" || tk["result"] != nil {
			t.Errorf("task: %v\nworker output:\n%s", tk, w.output())
		}
		if ev := c.taskEventTypes(id); !slices.Equal(ev, []string{"created", "claimed", "failed"}) {
			t.Errorf("events %v, want created, claimed, failed", ev)
		}
	})
}

// TestPythonWorkerCancellationAndShutdown: the worker drops a task that is
// cancelled while it runs (it learns at a heartbeat), and on SIGTERM stops
// claiming but finishes the task in hand.
func TestPythonWorkerCancellationAndShutdown(t *testing.T) {
	python := requirePython(t)
	backends(t, func(t *testing.T, db string) {
		addr := freePort(t)
		startServer(t, addr, db)
		c := client{t, "http://" + addr}
		leased := func(tk map[string]any) bool { return tk["status"] == "leased" }

		// Cancelled mid-task: heartbeats every lease/3 = 1s report it.
		id := c.createTask(`{"type": "demo.sleep.v1", "payload": {"seconds": 60}}`)
		w := startPyWorker(t, python, c.base, "--types", "demo.sleep.v1", "--lease", "3", "--once", "--max-tasks", "1")
		c.waitTask(id, "leased", 20*time.Second, leased)
		c.must(200, "POST", "/api/v1/tasks/"+id+"/cancel", "")
		w.wait(20 * time.Second)
		if tk := c.must(200, "GET", "/api/v1/tasks/"+id, "")["data"].(map[string]any); tk["status"] != "cancelled" || tk["result"] != nil {
			t.Errorf("cancelled task: %v", tk)
		}
		if !strings.Contains(w.output(), "dropped (cancel requested)") {
			t.Errorf("the worker did not notice the cancellation:\n%s", w.output())
		}

		// SIGTERM mid-task: the task still completes, then the worker exits.
		// (Wait for the handler to start, not just for the lease: a claim
		// whose response has not arrived yet is abandoned on SIGTERM.)
		id = c.createTask(`{"type": "demo.sleep.v1", "payload": {"seconds": 2}}`)
		w = startPyWorker(t, python, c.base, "--types", "demo.sleep.v1", "--lease", "3")
		w.waitOutput("task "+id+" demo.sleep.v1: attempt 1", 20*time.Second)
		if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		w.wait(20 * time.Second)
		tk := c.must(200, "GET", "/api/v1/tasks/"+id, "")["data"].(map[string]any)
		if tk["status"] != "succeeded" || !reflect.DeepEqual(tk["result"], map[string]any{"slept": 2.0}) {
			t.Errorf("after SIGTERM: %v\nworker output:\n%s", tk, w.output())
		}
	})
}
