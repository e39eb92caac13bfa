package runtime

import (
	"context"
	"errors"
	"time"

	"testing"

	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/store"
)

// poisonStore refuses, as a whole, any batch of new runs holding one whose
// idempotency key is "poison" (as Postgres refused a batch holding one
// request it could not store), and counts the batches.
type poisonStore struct {
	store.Store
	batches int
}

var (
	errPoison = errors.New("the database refused the batch")
	errDown   = errors.New("the database is down")
)

// Refused: the poison is a refusal of data; anything else a failure.
func (s *poisonStore) Refused(err error) bool { return errors.Is(err, errPoison) }

func (s *poisonStore) CreateRuns(ctx context.Context, nrs []*store.NewRun, now time.Time) ([]store.CreateResult, error) {
	s.batches++
	for _, nr := range nrs {
		switch nr.Run.IdempotencyKey {
		case "poison":
			return nil, errPoison
		case "down":
			return nil, errDown
		}
	}
	return s.Store.CreateRuns(ctx, nrs, now)
}

// TestBatchFailingAsAWholeIsWrittenOneByOne: a batch the database refuses
// as a whole is written again one request at a time, so the request it
// cannot store fails alone and the others are written.
func TestBatchFailingAsAWholeIsWrittenOneByOne(t *testing.T) {
	st := &poisonStore{Store: openSQLite(t)}
	r, clk := newOn(t, st)
	def, err := spec.Parse([]byte(`{"name": "w", "tasks": {"a": {"sleep": "1h"}}}`), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	wf, err := st.CreateWorkflow(t.Context(), &store.Workflow{Name: def.Name, Definition: def.Source, Fingerprint: def.Fingerprint(), Enabled: def.Enabled})
	if err != nil {
		t.Fatal(err)
	}
	var batch []*triggerReq
	for _, key := range []string{"a", "poison", "b"} {
		nr := r.newRun(wf, def, TriggerRequest{IdempotencyKey: key}, clk.Now())
		batch = append(batch, &triggerReq{ctx: t.Context(), nr: nr, done: make(chan struct{})})
	}
	if retry := r.applyTriggers(batch); len(retry) != 0 {
		t.Fatalf("%d to retry", len(retry))
	}
	for _, q := range batch {
		<-q.done
		poison := q.nr.Run.IdempotencyKey == "poison"
		if poison != (q.err != nil) || !poison && (q.run == nil || !q.created) {
			t.Errorf("key %s: err %v, created %v, want only poison refused", q.nr.Run.IdempotencyKey, q.err, q.created)
		}
	}
	if st.batches != 4 {
		t.Errorf("%d store calls, want the batch then each of its 3 alone", st.batches)
	}

	// A failure of the database itself (not a refusal of the data) fails
	// the batch once: each request alone would wait on it in turn.
	st.batches = 0
	var down []*triggerReq
	for _, key := range []string{"c", "down", "d"} {
		nr := r.newRun(wf, def, TriggerRequest{IdempotencyKey: key}, clk.Now())
		down = append(down, &triggerReq{ctx: t.Context(), nr: nr, done: make(chan struct{})})
	}
	r.applyTriggers(down)
	for _, q := range down {
		<-q.done
		if !errors.Is(q.err, errDown) {
			t.Errorf("key %s: %v, want the batch's failure", q.nr.Run.IdempotencyKey, q.err)
		}
	}
	if st.batches != 1 {
		t.Errorf("%d store calls for a batch the database failed, want 1", st.batches)
	}
}
