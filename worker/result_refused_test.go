package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/worker"
)

// TestResultTheServerRefusesFailsTheTask: a handler's result the server
// would refuse (a json.RawMessage holding bytes that are not UTF-8, or
// over the size a completion may take) fails the task at once, final, on
// both sources: the handler runs once, and the task is not left to its
// lease to run the handler again. (Found by an audit: the refused report
// was dropped and the handler ran once a lease until the last attempt.)
func TestResultTheServerRefusesFailsTheTask(t *testing.T) {
	cases := map[string]struct {
		result any
		why    string
	}{
		"not UTF-8": {json.RawMessage("{\"s\":\"\xff\"}"), "not UTF-8"},
		"too large": {map[string]string{"s": strings.Repeat("x", 2<<20)}, "more than a task's result may take"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			eachSource(t, func(t *testing.T, e *env) {
				var calls atomic.Int32
				w := newWorker(t, e.src, worker.Config{Lease: 2 * time.Second})
				w.Handle("test.refused.v1", func(ctx context.Context, task *worker.Task) (any, error) {
					calls.Add(1)
					return tc.result, nil
				})
				id := e.create(t, "test.refused.v1", `{}`, retryFast, func(nt *client.NewTask) { nt.MaxAttempts = 2 })
				start(t, w)
				task := e.waitTask(t, id, "an end", func(tk *client.Task) bool { return tk.Terminal() })
				if calls.Load() != 1 || task.Status != client.TaskFailed || task.Attempt != 1 || !strings.Contains(task.LastError, tc.why) {
					t.Fatalf("handler ran %d times; task %s at attempt %d, error %q; want one run, failed at attempt 1 saying %q", calls.Load(), task.Status, task.Attempt, task.LastError, tc.why)
				}
			})
		})
	}
}
