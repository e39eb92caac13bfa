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

func (s *poisonStore) CreateRuns(ctx context.Context, nrs []*store.NewRun, now time.Time) ([]store.CreateResult, error) {
	s.batches++
	for _, nr := range nrs {
		if nr.Run.IdempotencyKey == "poison" {
			return nil, errors.New("the database refused the batch")
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
}
