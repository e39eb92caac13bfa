package storetest

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

// Run runs the conformance suite against the stores open returns. open must
// return a fresh, empty, migrated store on every call and close it in a
// t.Cleanup. Each subtest calls open once and runs in parallel with its
// siblings.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	groups := []struct {
		name  string
		tests []test
	}{
		{"Migrate", migrateTests},
		{"Workflows", workflowTests},
		{"Runs", runTests},
		{"InRun", inRunTests},
		{"Queue", queueTests},
		{"Expiry", expiryTests},
		{"APIKeys", apiKeyTests},
		{"Tasks", taskTests},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					s := open(t)
					if s == nil {
						t.Fatal("open returned a nil store")
					}
					tc.fn(t, s)
					// A store that keeps runs in memory (SQLite's run
					// cache) must hold what its tables hold.
					if v, ok := s.(interface{ VerifyRunCache(context.Context) error }); ok {
						if err := v.VerifyRunCache(t.Context()); err != nil {
							t.Errorf("run cache differs from the tables: %v", err)
						}
					}
				})
			}
		})
	}
}

type test struct {
	name string
	fn   func(t *testing.T, s store.Store)
}

// t0 is the suite's reference instant; it has microsecond precision (the
// stores' resolution) and is far from the zero time and from "now".
var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 891011000, time.UTC)

// at returns t0 plus d.
func at(d time.Duration) time.Time { return t0.Add(d) }

func ptr[T any](v T) *T { return &v }

// diff fails the test with a go-cmp diff when want and got differ. Times are
// compared with time.Time.Equal (go-cmp uses Equal methods).
func diff(t *testing.T, what string, want, got any, opts ...cmp.Option) {
	t.Helper()
	if d := cmp.Diff(want, got, opts...); d != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", what, d)
	}
}

func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func wantErr(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want errors.Is(err, %v)", what, err, target)
	}
}

func def(name string, n int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"name":%q,"steps":[{"name":"s%d","type":"http"}]}`, name, n))
}

// mkWorkflow creates an enabled workflow named name.
func mkWorkflow(t *testing.T, s store.Store, name string) *store.Workflow {
	t.Helper()
	w, err := s.CreateWorkflow(t.Context(), &store.Workflow{Name: name, Fingerprint: "fp-" + name + "-1", Definition: def(name, 1), Enabled: true})
	must(t, err, "CreateWorkflow "+name)
	return w
}

// baseRun is a running run of wf with the given idempotency key.
func baseRun(wf *store.Workflow, key string) store.Run {
	return store.Run{
		WorkflowID:     wf.ID,
		Version:        wf.Version,
		Status:         status.RunRunning,
		Input:          json.RawMessage(`{"order":42,"tags":["a","b"]}`),
		TriggerHeaders: map[string]string{"X-Request-Id": "req-1"},
		IdempotencyKey: key,
		ExpiresAt:      at(time.Hour),
		StartedAt:      t0,
	}
}

// mkRun creates nr at t0 and fails unless it was created.
func mkRun(t *testing.T, s store.Store, nr *store.NewRun) *store.Run {
	t.Helper()
	r, created, err := s.CreateRun(t.Context(), nr, t0)
	must(t, err, "CreateRun")
	if !created {
		t.Fatalf("CreateRun: created=false for a new run")
	}
	if r == nil || r.ID == "" {
		t.Fatalf("CreateRun returned run %+v without an id", r)
	}
	return r
}

// mkSimpleRun creates a running run of wf with steps a (position 0) and b
// (position 1), the given queue items and no events.
func mkSimpleRun(t *testing.T, s store.Store, wf *store.Workflow, queue ...store.QueueItem) *store.Run {
	t.Helper()
	return mkRun(t, s, &store.NewRun{
		Run: baseRun(wf, ""),
		Steps: []*store.StepRun{
			{Name: "a", Position: 0, Type: "http", Status: status.StepPending},
			{Name: "b", Position: 1, Type: "sleep", Status: status.StepPending},
		},
		Queue: queue,
	})
}

func getRun(t *testing.T, s store.Store, id string) (*store.Run, []*store.StepRun) {
	t.Helper()
	r, steps, err := s.GetRun(t.Context(), id)
	must(t, err, "GetRun "+id)
	return r, steps
}

func stepNamed(t *testing.T, steps []*store.StepRun, name string) *store.StepRun {
	t.Helper()
	for _, st := range steps {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("step %q not found", name)
	return nil
}

func events(t *testing.T, s store.Store, runID string) []*store.Event {
	t.Helper()
	evs, err := s.ListEvents(t.Context(), runID, 0, 0)
	must(t, err, "ListEvents")
	return evs
}

// seqs returns the events' sequence numbers.
func seqs(evs []*store.Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Seq
	}
	return out
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// far is later than any due time or lease the suite uses.
var far = at(1000 * time.Hour)

// claimAll claims every claimable item at now with a long lease.
func claimAll(t *testing.T, s store.Store, now time.Time) []*store.QueueItem {
	t.Helper()
	items, err := s.Claim(t.Context(), now, time.Hour, 10000)
	must(t, err, "Claim")
	return items
}

// queueKey identifies a queue item by content, independent of its id.
type queueKey struct {
	Kind, RunID, Step string
	Attempt           int
	DueAt             int64
}

func keysOf(items []*store.QueueItem) []queueKey {
	out := make([]queueKey, len(items))
	for i, it := range items {
		out[i] = queueKey{it.Kind, it.RunID, it.Step, it.Attempt, it.DueAt.UnixMicro()}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.RunID != b.RunID {
			return a.RunID < b.RunID
		}
		if a.DueAt != b.DueAt {
			return a.DueAt < b.DueAt
		}
		if a.Step != b.Step {
			return a.Step < b.Step
		}
		return a.Kind < b.Kind
	})
	return out
}

func keysFor(runID string, items ...store.QueueItem) []queueKey {
	ptrs := make([]*store.QueueItem, len(items))
	for i := range items {
		it := items[i]
		it.RunID = runID
		ptrs[i] = &it
	}
	return keysOf(ptrs)
}

// inRun runs fn in s.InRun at now and fails the test on error.
func inRun(t *testing.T, s store.Store, runID string, now time.Time, fn func(tx store.RunTx) error) {
	t.Helper()
	must(t, s.InRun(t.Context(), runID, now, fn), "InRun")
}

// rawDB is the store's database handle, for tests that look at or change
// its tables directly; the test is skipped when the store exposes none.
func rawDB(t *testing.T, s store.Store) *sql.DB {
	t.Helper()
	raw, ok := s.(interface{ DB() *sql.DB })
	if !ok {
		t.Skip("the store exposes no database handle")
	}
	return raw.DB()
}
