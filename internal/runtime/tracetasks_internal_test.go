package runtime

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"

	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/store"
)

// headerStore answers TriggerHeaders from runs, or with err, and records
// each call's runs.
type headerStore struct {
	store.Store
	runs  map[string]map[string]string
	err   error
	calls [][]string
}

func (s *headerStore) TriggerHeaders(_ context.Context, ids []string) (map[string]map[string]string, error) {
	s.calls = append(s.calls, slices.Clone(ids))
	if s.err != nil {
		return nil, s.err
	}
	out := map[string]map[string]string{}
	for _, id := range ids {
		if h, ok := s.runs[id]; ok {
			out[id] = h
		}
	}
	return out, nil
}

// parentTracer is on, and makes a run's traceparent from its headers.
type parentTracer struct{ noTracer }

func (parentTracer) Enabled() bool { return true }
func (parentTracer) TaskParent(runID string, h map[string]string) string {
	return runID + "/" + h["Traceparent"]
}

// TestTasksHandedOutWithTheirRunsTraceContext: while tracing is on, a
// run's tasks are handed out with its trace context, each run's headers
// read once for all the tasks of a batch and kept for its later ones;
// standalone tasks get none; a failed read, or a caller gone, hands the
// tasks out without; tracing off reads nothing.
func TestTasksHandedOutWithTheirRunsTraceContext(t *testing.T) {
	st := &headerStore{runs: map[string]map[string]string{"r1": {"Traceparent": "a"}, "r2": {"Traceparent": "b"}}}
	r := &Runtime{st: st, clk: clock.Real{}, log: slog.New(slog.DiscardHandler), cfg: Config{Observer: noObserver{}, Tracer: parentTracer{}}}
	batch := []*store.Task{{ID: "t1", RunID: "r1"}, {ID: "t2", RunID: "r2"}, {ID: "t3", RunID: "r1"}, {ID: "t4"}, {ID: "t5", RunID: "gone"}}
	r.handedOut(t.Context(), batch, nil)
	want := []string{"r1/a", "r2/b", "r1/a", "", ""}
	for i, tk := range batch {
		if tk.TraceParent != want[i] {
			t.Errorf("task %s handed out with %q, want %q", tk.ID, tk.TraceParent, want[i])
		}
	}
	if len(st.calls) != 1 || !slices.Equal(st.calls[0], []string{"r1", "r2", "gone"}) {
		t.Fatalf("reads %v, want one of r1, r2 and gone", st.calls)
	}
	// The runs' later tasks: no read.
	later := []*store.Task{{ID: "t6", RunID: "r2"}}
	r.handedOut(t.Context(), later, nil)
	if len(st.calls) != 1 || later[0].TraceParent != "r2/b" {
		t.Errorf("a later task of r2: reads %v, traceparent %q, want no new read and r2/b", st.calls, later[0].TraceParent)
	}
	// A failed read: the tasks go out without, and the run is read again
	// next time.
	st.err = errors.New("database down")
	failed := []*store.Task{{ID: "t7", RunID: "r3"}}
	r.handedOut(t.Context(), failed, nil)
	if len(st.calls) != 2 || failed[0].TraceParent != "" {
		t.Errorf("after a failed read: reads %v, traceparent %q, want two reads, none", st.calls, failed[0].TraceParent)
	}
	st.err = nil
	st.runs["r3"] = map[string]string{"Traceparent": "c"}
	again := []*store.Task{{ID: "t7", RunID: "r3"}}
	r.handedOut(t.Context(), again, nil)
	if len(st.calls) != 3 || again[0].TraceParent != "r3/c" {
		t.Errorf("r3 once the database is back: reads %v, traceparent %q, want a third read, r3/c", st.calls, again[0].TraceParent)
	}
	// A caller gone: no read.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	r.handedOut(ctx, []*store.Task{{ID: "t8", RunID: "r4"}}, nil)
	if len(st.calls) != 3 {
		t.Errorf("a read for a caller gone: %v", st.calls)
	}
	// Tracing off: no read, no trace context.
	r.cfg.Tracer = noTracer{}
	off := []*store.Task{{ID: "t9", RunID: "r5"}}
	r.handedOut(t.Context(), off, nil)
	if len(st.calls) != 3 || off[0].TraceParent != "" {
		t.Errorf("tracing off: reads %v, traceparent %q", st.calls, off[0].TraceParent)
	}
}
