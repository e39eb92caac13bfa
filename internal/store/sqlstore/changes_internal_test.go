package sqlstore

import (
	"encoding/json"
	"fmt"
	"maps"
	"testing"

	"github.com/ferryhq/ferry/internal/store"
)

// TestChangesetKeepsEachRowOnce: however many rows a changeset holds
// (past indexAfter it indexes them), a step written again takes the place
// of the step of the same run and name, in its position, and a run or
// task written again is listed once; merging keeps that.
func TestChangesetKeepsEachRowOnce(t *testing.T) {
	for _, n := range []int{3, indexAfter, 5 * indexAfter} {
		c := &changeset{}
		runs := make([]*runTx, n)
		tasks := make([]*taskTx, n)
		for i := range n {
			runs[i], tasks[i] = &runTx{}, &taskTx{}
			c.run(runs[i])
			c.task(tasks[i])
			c.step(&store.StepRun{RunID: fmt.Sprint("r", i), Name: "a"})
			c.step(&store.StepRun{RunID: fmt.Sprint("r", i), Name: "b"})
		}
		sub := &changeset{}
		again := &store.StepRun{RunID: "r1", Name: "b", Status: "again"}
		for i := range n {
			sub.run(runs[i])
			sub.task(tasks[i])
		}
		sub.step(again)
		sub.step(&store.StepRun{RunID: "new", Name: "a"})
		c.merge(sub)
		c.run(runs[0])
		c.task(tasks[n-1])
		if len(c.runs) != n || len(c.tasks) != n {
			t.Errorf("n=%d: %d runs and %d tasks listed, want %d of each", n, len(c.runs), len(c.tasks), n)
		}
		if len(c.steps) != 2*n+1 {
			t.Errorf("n=%d: %d steps listed, want %d", n, len(c.steps), 2*n+1)
		}
		if c.steps[3] != again {
			t.Errorf("n=%d: step 3 is %+v, want the step written again in the place of r1's b", n, c.steps[3])
		}
		if last := c.steps[len(c.steps)-1]; last.RunID != "new" {
			t.Errorf("n=%d: the last step is %+v, want the new one", n, last)
		}
	}
}

// TestNewRowsCountsRowsNotEvents: what a changeset counts towards the
// background ANALYZE is the rows it inserts into each table it analyzes:
// a run and its task are one of each whatever events they carry, and step
// rows, steps written out of their run's row and queue items count for
// their tables.
func TestNewRowsCountsRowsNotEvents(t *testing.T) {
	c := &changeset{newRuns: [][]any{{"r"}}, newTasks: []*store.Task{{ID: "k"}}}
	for seq := int64(1); seq <= 10; seq++ {
		c.events = append(c.events, eventRow{owner: "k", seq: seq, cap: taskRowEvents}, eventRow{owner: "r", seq: seq, cap: runRowEvents})
	}
	if got, want := c.newRows(), [len(AnalyzeTables)]int{1, 0, 1, 0}; got != want {
		t.Errorf("a run and a task with ten events each: %v rows (%v), want %v", got, AnalyzeTables, want)
	}
	c.newSteps = []*store.StepRun{{RunID: "r", Name: "a"}}
	c.stepsOut = 2
	c.queue = []store.QueueItem{{Kind: store.KindWake, RunID: "r", Step: "b"}}
	if got, want := c.newRows(), [len(AnalyzeTables)]int{1, 3, 1, 1}; got != want {
		t.Errorf("with a step row, two steps out of the run's row and a queue item: %v rows (%v), want %v", got, AnalyzeTables, want)
	}
}

// TestReadBackHeadersAsJSONGivesThem: the copy readBackHeaders makes
// without JSON is what the round trip through the row's JSON gives, for
// empty, plain, escaped and invalid UTF-8 headers.
func TestReadBackHeadersAsJSONGivesThem(t *testing.T) {
	for _, h := range []map[string]string{
		nil,
		{},
		{"X-Request-Id": "req-1"},
		{"A": "<b>&amp;\u2028\"\\", "É": "ünïcödé"},
		{"Bad": "a\xffb"},
		{"a\xc0": "v", "ok": "w"},
	} {
		b, err := headersJSON(h)
		if err != nil {
			t.Fatal(err)
		}
		var want map[string]string
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		got, err := readBackHeaders(h)
		if err != nil {
			t.Fatal(err)
		}
		if got == nil || !maps.Equal(got, want) {
			t.Errorf("readBackHeaders(%q) = %q, want %q (non-nil)", h, got, want)
		}
		// The result is the run's own: a cache entry must not share the
		// caller's map.
		got["zz-added"] = "x"
		if _, shared := h["zz-added"]; shared {
			t.Errorf("readBackHeaders(%q) returned the caller's map", h)
		}
	}
}
