package storetest

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
)

var inRunTests = []test{
	{"SeesRunAndSteps", testInRunSees},
	{"UpdateStepRoundTripsEveryColumn", testUpdateStepRoundTrip},
	{"UpdateStepUnknownIsNotFound", testUpdateStepUnknown},
	{"UpdateRun", testUpdateRun},
	{"UpdateRunEachColumnAlone", testUpdateRunEachColumn},
	{"AppendContinuesSeq", testAppendContinuesSeq},
	{"NowNeverBeforeTheLastWrite", testNowNeverBeforeLastWrite},
	{"ErrorRollsBackEverything", testInRunRollback},
	{"SerialisesConcurrentCallers", testInRunSerialises},
	{"SmallStepsInTheRunRow", testStepsInRunRow},
	{"StepsWrittenBeforeTheRowHeldThem", testStepsLegacy},
	{"StepsPlacedByAnotherBuild", testStepsPlacedElsewhere},
	{"GetRunWhileStepsMove", testGetRunWhileStepsMove},
	{"DormantRunsLeaveTheCache", testDormantRunsLeaveTheCache},
}

func testInRunSees(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)
	wantRun, wantSteps := getRun(t, s, r.ID)
	called := false
	inRun(t, s, r.ID, at(time.Second), func(tx store.RunTx) error {
		called = true
		diff(t, "tx.Run()", wantRun, tx.Run())
		diff(t, "tx.Steps()", wantSteps, tx.Steps())
		diff(t, "tx.Step(b)", wantSteps[1], tx.Step("b"))
		if st := tx.Step("nope"); st != nil {
			t.Errorf("tx.Step(unknown) = %+v, want nil", st)
		}
		return nil
	})
	if !called {
		t.Fatal("InRun did not call fn")
	}
}

func testUpdateStepRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)

	full := &store.StepRun{
		RunID:         r.ID,
		Name:          "a",
		Position:      0,
		Type:          "http",
		Status:        status.StepSuccess,
		Attempt:       3,
		CallbackToken: "cb-round-trip",
		StatusCode:    ptr(201),
		DurationMS:    ptr(int64(1234567890123)),
		Request:       json.RawMessage(`{"method":"POST","url":"https://example.com/x?y=1","headers":{"A":"b"},"body":"caf\u00e9 ☕"}`),
		Body:          []byte{0xff, 0xfe, 0x00, 0x80, 'o', 'k', 0xc3, 0x28, '\n', 0x00},
		Headers:       map[string]string{"Content-Type": "application/octet-stream", "X-Ünïcode": "✓", "Empty": ""},
		Truncated:     true,
		Blocked:       true,
		Error:         "upstream said: \"no\"\nline 2",
		WakeAt:        ptr(at(90*time.Second + 1*time.Microsecond)),
		StartedAt:     ptr(at(123456 * time.Microsecond)),
		FinishedAt:    ptr(at(time.Second + 999999*time.Microsecond)),
	}
	inRun(t, s, r.ID, at(time.Second), func(tx store.RunTx) error {
		return tx.UpdateStep(full)
	})
	_, steps := getRun(t, s, r.ID)
	diff(t, "step a after UpdateStep", full, stepNamed(t, steps, "a"))
	diff(t, "step b (untouched)", &store.StepRun{RunID: r.ID, Name: "b", Position: 1, Type: "sleep", Status: status.StepPending}, stepNamed(t, steps, "b"))
	// Microsecond precision, not just Equal-ish.
	if got := stepNamed(t, steps, "a").StartedAt; got == nil || got.UnixMicro() != full.StartedAt.UnixMicro() {
		t.Errorf("StartedAt = %v, want %v to the microsecond", got, full.StartedAt)
	}
	// A transaction sees the stored values too.
	inRun(t, s, r.ID, at(2*time.Second), func(tx store.RunTx) error {
		diff(t, "tx.Step(a)", full, tx.Step("a"))
		return nil
	})
	runID, name, err := s.StepByToken(ctx, "cb-round-trip")
	must(t, err, "StepByToken")
	if runID != r.ID || name != "a" {
		t.Errorf("StepByToken = (%s, %s), want (%s, a)", runID, name, r.ID)
	}

	// Clearing every optional column round-trips as well.
	cleared := &store.StepRun{RunID: r.ID, Name: "a", Position: 0, Type: "http", Status: status.StepPending}
	inRun(t, s, r.ID, at(3*time.Second), func(tx store.RunTx) error {
		return tx.UpdateStep(cleared)
	})
	_, steps = getRun(t, s, r.ID)
	diff(t, "step a after clearing", cleared, stepNamed(t, steps, "a"))
	_, _, err = s.StepByToken(ctx, "cb-round-trip")
	wantErr(t, err, store.ErrNotFound, "StepByToken after clearing the token")
}

func testUpdateStepUnknown(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)
	err := s.InRun(t.Context(), r.ID, t0, func(tx store.RunTx) error {
		err := tx.UpdateStep(&store.StepRun{RunID: r.ID, Name: "ghost", Type: "http", Status: status.StepSuccess})
		wantErr(t, err, store.ErrNotFound, "UpdateStep(unknown step)")
		return err
	})
	wantErr(t, err, store.ErrNotFound, "InRun returning UpdateStep's error")
}

func testUpdateRun(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)
	now := at(5*time.Second + 7*time.Microsecond)
	finished := at(4*time.Second + 3*time.Microsecond)
	var want store.Run
	inRun(t, s, r.ID, now, func(tx store.RunTx) error {
		u := *tx.Run()
		u.Status = status.RunFailed
		u.Error = "step a: boom ✗"
		u.FinishedAt = &finished
		if err := tx.UpdateRun(&u); err != nil {
			return err
		}
		diff(t, "tx.Run() after UpdateRun", u.Status, tx.Run().Status)
		want = u
		return nil
	})
	want.UpdatedAt = now
	got, _ := getRun(t, s, r.ID)
	diff(t, "run after UpdateRun", &want, got)
	if got.FinishedAt == nil || got.FinishedAt.UnixMicro() != finished.UnixMicro() {
		t.Errorf("FinishedAt = %v, want %v", got.FinishedAt, finished)
	}

	// And back (a resumed run clears error and finished_at).
	inRun(t, s, r.ID, now.Add(time.Second), func(tx store.RunTx) error {
		u := *tx.Run()
		u.Status, u.Error, u.FinishedAt = status.RunRunning, "", nil
		return tx.UpdateRun(&u)
	})
	got, _ = getRun(t, s, r.ID)
	if got.Status != status.RunRunning || got.Error != "" || got.FinishedAt != nil {
		t.Errorf("run after reset = {Status:%s Error:%q FinishedAt:%v}, want {running \"\" nil}", got.Status, got.Error, got.FinishedAt)
	}
}

func testAppendContinuesSeq(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_started", Step: "a"}}})
	now := at(time.Minute)
	inRun(t, s, r.ID, now, func(tx store.RunTx) error {
		if err := tx.Append(store.NewEvent{Type: "step_succeeded", Step: "a", Data: map[string]int{"status": 200}}); err != nil {
			return err
		}
		return tx.Append(store.NewEvent{Type: "run_completed"})
	})
	// A transaction that appends nothing does not disturb the sequence.
	inRun(t, s, r.ID, now, func(store.RunTx) error { return nil })
	later := at(2 * time.Minute)
	inRun(t, s, r.ID, later, func(tx store.RunTx) error {
		return tx.Append(store.NewEvent{Type: "note"})
	})
	evs := events(t, s, r.ID)
	diff(t, "seqs", seqRange(1, 5), seqs(evs))
	if len(evs) == 5 {
		want := []*store.Event{
			{RunID: r.ID, Seq: 3, Type: "step_succeeded", Step: "a", Data: json.RawMessage(`{"status":200}`), At: now},
			{RunID: r.ID, Seq: 4, Type: "run_completed", At: now},
			{RunID: r.ID, Seq: 5, Type: "note", At: later},
		}
		diff(t, "appended events", want, evs[2:])
	}
}

// testNowNeverBeforeLastWrite: a caller reads its clock, then waits for
// the run's lock while another writer goes first with a later time. Its
// transaction's time (RunTx.Now, and its events' at) is then that write's,
// so a run never records a time earlier than one it already holds (a run
// finished before its last step, an event log going back in time).
func testNowNeverBeforeLastWrite(t *testing.T, s store.Store) {
	for _, n := range []int{2, 12} { // steps in the run's row, and in step_runs
		t.Run(fmt.Sprintf("%d steps", n), func(t *testing.T) {
			wf := mkWorkflow(t, s, fmt.Sprintf("wf%d", n))
			nr := &store.NewRun{Run: baseRun(wf, ""), Events: []store.NewEvent{{Type: "run_started"}}}
			for i := 0; i < n; i++ {
				nr.Steps = append(nr.Steps, &store.StepRun{Name: fmt.Sprintf("s%d", i), Position: i, Type: "sleep", Status: status.StepPending})
			}
			r := mkRun(t, s, nr)
			step := func(tx store.RunTx, name, event string) error {
				st := *tx.Step(name)
				now := tx.Now()
				st.Status, st.StartedAt, st.FinishedAt = status.StepSuccess, &now, &now
				if err := tx.UpdateStep(&st); err != nil {
					return err
				}
				return tx.Append(store.NewEvent{Type: event, Step: name})
			}
			first, late := at(2*time.Minute), at(time.Minute)
			inRun(t, s, r.ID, first, func(tx store.RunTx) error {
				if !tx.Now().Equal(first) {
					t.Errorf("Now() = %v, want the time given, %v", tx.Now(), first)
				}
				return step(tx, "s0", "step_succeeded")
			})
			// Given a time before that write: its time is the write's.
			inRun(t, s, r.ID, late, func(tx store.RunTx) error {
				if !tx.Now().Equal(first) {
					t.Errorf("Now() given %v after a write at %v = %v, want %v", late, first, tx.Now(), first)
				}
				return step(tx, "s1", "step_succeeded")
			})
			// An event alone (no step changed) is a write of the run too.
			third := at(3 * time.Minute)
			inRun(t, s, r.ID, third, func(tx store.RunTx) error {
				return tx.Append(store.NewEvent{Type: "note"})
			})
			inRun(t, s, r.ID, late, func(tx store.RunTx) error {
				if !tx.Now().Equal(third) {
					t.Errorf("Now() given %v after an event at %v = %v, want %v", late, third, tx.Now(), third)
				}
				run := tx.Run()
				now := tx.Now()
				run.Status, run.FinishedAt = status.RunCompleted, &now
				if err := tx.UpdateRun(run); err != nil {
					return err
				}
				return tx.Append(store.NewEvent{Type: "run_completed"})
			})
			run, steps := getRun(t, s, r.ID)
			for _, st := range steps {
				if st.FinishedAt != nil && st.FinishedAt.After(*run.FinishedAt) {
					t.Errorf("step %s finished at %v, after its run (%v)", st.Name, st.FinishedAt, run.FinishedAt)
				}
			}
			evs := events(t, s, r.ID)
			for i := 1; i < len(evs); i++ {
				if evs[i].At.Before(evs[i-1].At) {
					t.Errorf("event %d (%s) at %v is before event %d (%s) at %v", evs[i].Seq, evs[i].Type, evs[i].At, evs[i-1].Seq, evs[i-1].Type, evs[i-1].At)
				}
			}
			diff(t, "event times", []time.Time{t0, first, first, third, third}, func() (out []time.Time) {
				for _, e := range evs {
					out = append(out, e.At)
				}
				return out
			}())
		})
	}
}

var errRollback = errors.New("storetest: deliberate failure")

func testInRunRollback(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	initial := []store.QueueItem{{Kind: store.KindHTTP, Step: "a", DueAt: t0}}
	r := mkRun(t, s, &store.NewRun{
		Run:    baseRun(wf, ""),
		Steps:  []*store.StepRun{{Name: "a", Position: 0, Type: "http", Status: status.StepPending}},
		Queue:  initial,
		Events: []store.NewEvent{{Type: "run_started"}, {Type: "step_started", Step: "a"}},
	})
	claimed, err := s.Claim(ctx, t0, time.Minute, 10)
	must(t, err, "Claim")
	if len(claimed) != 1 {
		t.Fatalf("claimed %d items, want 1", len(claimed))
	}
	beforeRun, beforeSteps := getRun(t, s, r.ID)

	err = s.InRun(ctx, r.ID, at(time.Second), func(tx store.RunTx) error {
		st := *tx.Step("a")
		st.Status, st.Attempt, st.Body, st.CallbackToken = status.StepSuccess, 9, []byte("x"), "rolled-back"
		if err := tx.UpdateStep(&st); err != nil {
			return err
		}
		u := *tx.Run()
		u.Status, u.Error = status.RunFailed, "nope"
		if err := tx.UpdateRun(&u); err != nil {
			return err
		}
		if err := tx.Append(store.NewEvent{Type: "lost-1"}, store.NewEvent{Type: "lost-2"}); err != nil {
			return err
		}
		if err := tx.Enqueue(store.QueueItem{Kind: store.KindWake, Step: "a", DueAt: t0}); err != nil {
			return err
		}
		if err := tx.Dequeue(claimed[0].ID, claimed[0].LeaseToken); err != nil {
			return err
		}
		return fmt.Errorf("wrapped: %w", errRollback)
	})
	wantErr(t, err, errRollback, "InRun returns fn's error")

	afterRun, afterSteps := getRun(t, s, r.ID)
	diff(t, "run after rollback", beforeRun, afterRun)
	diff(t, "steps after rollback", beforeSteps, afterSteps)
	diff(t, "event seqs after rollback", []int64{1, 2}, seqs(events(t, s, r.ID)))
	_, _, err = s.StepByToken(ctx, "rolled-back")
	wantErr(t, err, store.ErrNotFound, "StepByToken(rolled-back token)")
	// Neither the enqueue nor the dequeue happened: only the original item
	// exists, still leased (claimable once the lease ends, not before).
	if items := claimAll(t, s, at(30*time.Second)); len(items) != 0 {
		t.Errorf("claimable inside the lease after rollback: %v", keysOf(items))
	}
	diff(t, "queue after rollback", keysFor(r.ID, initial...), keysOf(claimAll(t, s, at(time.Minute))))

	// The sequence continues from the last committed event.
	inRun(t, s, r.ID, at(2*time.Second), func(tx store.RunTx) error {
		return tx.Append(store.NewEvent{Type: "kept"})
	})
	evs := events(t, s, r.ID)
	diff(t, "event seqs after a later append", []int64{1, 2, 3}, seqs(evs))
	if len(evs) == 3 && evs[2].Type != "kept" {
		t.Errorf("event 3 is %q, want kept", evs[2].Type)
	}
}

// testInRunSerialises runs read-modify-write increments of a step's Attempt
// from several goroutines at once: InRun must hold the run's lock for the
// whole transaction, so no increment is lost. Each increment also appends an
// event, so the event sequence must be gapless and unique.
func testInRunSerialises(t *testing.T, s store.Store) {
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)
	const workers, rounds = 8, 5
	errs := make(chan error, workers*rounds)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			<-start
			for i := range rounds {
				errs <- s.InRun(ctx, r.ID, t0, func(tx store.RunTx) error {
					st := *tx.Step("a")
					st.Attempt++
					if err := tx.UpdateStep(&st); err != nil {
						return err
					}
					return tx.Append(store.NewEvent{Type: "inc", Data: map[string]int{"worker": w, "round": i, "attempt": st.Attempt}})
				})
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("InRun: %v", err)
		}
	}
	_, steps := getRun(t, s, r.ID)
	if got := stepNamed(t, steps, "a").Attempt; got != workers*rounds {
		t.Errorf("Attempt = %d after %d concurrent increments, want %d (lost updates)", got, workers*rounds, workers*rounds)
	}
	evs := events(t, s, r.ID)
	diff(t, "event seqs", seqRange(1, workers*rounds), seqs(evs))
	// The increments were applied one after another: event k saw attempt k.
	for i, e := range evs {
		var d struct{ Attempt int }
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatalf("event %d data %s: %v", e.Seq, e.Data, err)
		}
		if d.Attempt != i+1 {
			t.Errorf("event %d recorded attempt %d, want %d", e.Seq, d.Attempt, i+1)
		}
	}
}

// testUpdateRunEachColumn: a write that leaves a run's status as it was
// still records its time and events, and a change of the error alone or
// of the finish time alone is written (a store may write a run whose
// status, error and finish are unchanged in a cheaper form).
func testUpdateRunEachColumn(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)
	now := at(time.Minute)
	inRun(t, s, r.ID, now, func(tx store.RunTx) error {
		u := *tx.Run()
		if err := tx.UpdateRun(&u); err != nil {
			return err
		}
		return tx.Append(store.NewEvent{Type: "noted"})
	})
	got, _ := getRun(t, s, r.ID)
	if got.Status != r.Status || !got.UpdatedAt.Equal(now) || got.Error != "" || got.FinishedAt != nil {
		t.Fatalf("run after an unchanged UpdateRun = {Status:%s UpdatedAt:%v Error:%q FinishedAt:%v}, want status %s at %v",
			got.Status, got.UpdatedAt, got.Error, got.FinishedAt, r.Status, now)
	}
	if evs := events(t, s, r.ID); len(evs) == 0 || evs[len(evs)-1].Type != "noted" {
		t.Fatalf("events after an unchanged UpdateRun: %v", evs)
	}
	inRun(t, s, r.ID, now.Add(time.Second), func(tx store.RunTx) error {
		u := *tx.Run()
		u.Error = "only the error"
		return tx.UpdateRun(&u)
	})
	if got, _ := getRun(t, s, r.ID); got.Error != "only the error" || got.Status != r.Status {
		t.Fatalf("run after changing its error alone = {Status:%s Error:%q}", got.Status, got.Error)
	}
	done := at(2 * time.Minute)
	inRun(t, s, r.ID, now.Add(2*time.Second), func(tx store.RunTx) error {
		u := *tx.Run()
		u.FinishedAt = &done
		return tx.UpdateRun(&u)
	})
	if got, _ := getRun(t, s, r.ID); got.FinishedAt == nil || !got.FinishedAt.Equal(done) || !got.UpdatedAt.Equal(now.Add(2*time.Second)) {
		t.Fatalf("run after changing its finish alone = {FinishedAt:%v UpdatedAt:%v}", got.FinishedAt, got.UpdatedAt)
	}
}

// stepRowNames are the steps of a run that have a step_runs row, by name,
// or nil when the store exposes no database handle.
func stepRowNames(t *testing.T, s store.Store, runID string) []string {
	t.Helper()
	raw, ok := s.(interface{ DB() *sql.DB })
	if !ok {
		return nil
	}
	rows, err := raw.DB().QueryContext(t.Context(), fmt.Sprintf(`SELECT name FROM step_runs WHERE run_id = '%s' ORDER BY name`, runID))
	must(t, err, "read step rows")
	defer rows.Close()
	names := []string{}
	for rows.Next() {
		var n string
		must(t, rows.Scan(&n), "scan step row")
		names = append(names, n)
	}
	must(t, rows.Err(), "read step rows")
	return names
}

// testStepsInRunRow: a short run's small steps (four steps: short on
// every store) are kept in its own row, and the others (a large output, a
// callback token, output that is not UTF-8) and every step of a long run
// in step_runs; a step that grows
// moves to a row and one that shrinks back is read from the run's row,
// every column as written, through GetRun and under the run's lock alike.
func testStepsInRunRow(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	big := []byte(strings.Repeat("x", 1000))
	steps := []*store.StepRun{
		{Name: "small", Position: 0, Type: "task", Status: status.StepRunning, Attempt: 1, Request: json.RawMessage(`{"task_id":"t-1","type":"x.v1"}`), Headers: map[string]string{}, StartedAt: ptr(at(time.Second))},
		{Name: "big", Position: 1, Type: "task", Status: status.StepSuccess, Attempt: 2, Body: big, Error: "é\n\"quoted\"", StartedAt: ptr(at(time.Second)), FinishedAt: ptr(at(2 * time.Second))},
		{Name: "tok", Position: 2, Type: "wait_for_webhook", Status: status.StepWaiting, CallbackToken: "tok-in-row-test", WakeAt: ptr(at(time.Minute))},
		{Name: "bytes", Position: 3, Type: "http", Status: status.StepSuccess, Body: []byte{0xff, 'o', 'k'}, StatusCode: ptr(200), DurationMS: ptr(int64(7)), Truncated: true, Blocked: true},
	}
	r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Steps: steps})
	want := make([]*store.StepRun, 0, len(steps))
	for _, st := range steps {
		st := *st
		st.RunID = r.ID
		want = append(want, &st)
	}
	check := func(what string, rows []string) {
		t.Helper()
		_, got := getRun(t, s, r.ID)
		diff(t, what+": GetRun", want, got)
		inRun(t, s, r.ID, at(time.Hour), func(tx store.RunTx) error {
			diff(t, what+": tx.Steps()", want, tx.Steps())
			return nil
		})
		if got := stepRowNames(t, s, r.ID); got != nil {
			diff(t, what+": steps with a step_runs row", rows, got)
		}
	}
	check("created", []string{"big", "bytes", "tok"})
	runID, name, err := s.StepByToken(t.Context(), "tok-in-row-test")
	must(t, err, "StepByToken")
	if runID != r.ID || name != "tok" {
		t.Errorf("StepByToken = (%s, %s), want (%s, tok)", runID, name, r.ID)
	}

	update := func(i int, st store.StepRun) {
		t.Helper()
		inRun(t, s, r.ID, at(time.Duration(i)*time.Second), func(tx store.RunTx) error { return tx.UpdateStep(&st) })
		for j, w := range want {
			if w.Name == st.Name {
				want[j] = &st
			}
		}
	}
	grown := *want[0]
	grown.Status, grown.Body, grown.FinishedAt = status.StepSuccess, big, ptr(at(3*time.Second))
	update(3, grown)
	check("small step grown past the row's share", []string{"big", "bytes", "small", "tok"})
	shrunk := grown
	shrunk.Body, shrunk.Attempt = []byte(`{"ok":true}`), 3
	update(4, shrunk)
	check("the step shrunk again (its step_runs row deleted)", []string{"big", "bytes", "tok"})
	regrown := shrunk
	regrown.Body, regrown.Error = big, "again"
	update(5, regrown)
	check("the step grown again", []string{"big", "bytes", "small", "tok"})
	bytes := *want[3]
	bytes.Status, bytes.Error = status.StepFailed, "boom"
	update(6, bytes)
	check("a step that has a row updated", []string{"big", "bytes", "small", "tok"})
	bigSmall := *want[1]
	bigSmall.Body = nil
	update(7, bigSmall)
	check("the big step emptied", []string{"bytes", "small", "tok"})

	// The runtime changes the step tx.Step returns and passes it back:
	// where the step was is what the store read, not the object it gave.
	inPlace := func(i int, name string, change func(st *store.StepRun), write bool) {
		t.Helper()
		inRun(t, s, r.ID, at(time.Duration(i)*time.Second), func(tx store.RunTx) error {
			st := tx.Step(name)
			change(st)
			if !write {
				return tx.Append(store.NewEvent{Type: "noted"}) // the run's row is written
			}
			cp := *st
			for j, w := range want {
				if w.Name == name {
					want[j] = &cp
				}
			}
			return tx.UpdateStep(st)
		})
	}
	inPlace(8, "big", func(st *store.StepRun) { st.Body, st.Attempt = big, 4 }, true)
	check("the emptied step grown in place", []string{"big", "bytes", "small", "tok"})
	inPlace(9, "big", func(st *store.StepRun) { st.Body = nil }, true)
	check("a step emptied in place", []string{"bytes", "small", "tok"})
	inPlace(10, "big", func(st *store.StepRun) { st.Body, st.Error = big, "in place" }, true)
	check("a step grown in place after it had shrunk", []string{"big", "bytes", "small", "tok"})
	inPlace(11, "small", func(st *store.StepRun) { st.Status = "changed but never written" }, false)
	check("a step changed in memory but not written", []string{"big", "bytes", "small", "tok"})

	// A long run keeps every step in step_runs (each store keeps a
	// shorter run's steps in its row: four on Postgres, twelve on SQLite).
	var long []*store.StepRun
	var names []string
	for i := range 20 {
		long = append(long, &store.StepRun{Name: fmt.Sprintf("s%02d", i), Position: i, Type: "task", Status: status.StepPending})
		names = append(names, fmt.Sprintf("s%02d", i))
	}
	lr := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Steps: long})
	_, got := getRun(t, s, lr.ID)
	if len(got) != len(long) {
		t.Fatalf("a run of %d steps reads back %d", len(long), len(got))
	}
	if rows := stepRowNames(t, s, lr.ID); rows != nil {
		diff(t, "a long run: steps with a step_runs row", names, rows)
	}
}

// testStepsLegacy: a run whose steps were all written as step_runs rows
// before runs held any (runs.steps empty) reads the same, and its next
// write moves its small steps into its row.
func testStepsLegacy(t *testing.T, s store.Store) {
	raw := rawDB(t, s)
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)
	_, before := getRun(t, s, r.ID)
	qs := []string{fmt.Sprintf(`UPDATE runs SET steps = '' WHERE id = '%s'`, r.ID)}
	for _, st := range before {
		qs = append(qs, fmt.Sprintf(`INSERT INTO step_runs (run_id, name, position, type, status) VALUES ('%s', '%s', %d, '%s', '%s')`, r.ID, st.Name, st.Position, st.Type, st.Status))
	}
	for _, q := range qs {
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	_, got := getRun(t, s, r.ID)
	diff(t, "the legacy steps", before, got)
	b := *before[1]
	b.Status, b.WakeAt = status.StepSleeping, ptr(at(time.Minute))
	inRun(t, s, r.ID, at(time.Second), func(tx store.RunTx) error { return tx.UpdateStep(&b) })
	_, got = getRun(t, s, r.ID)
	diff(t, "after an update", []*store.StepRun{before[0], &b}, got)
	var packed string
	must(t, raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT steps FROM runs WHERE id = '%s'`, r.ID)).Scan(&packed), "read runs.steps")
	if !strings.Contains(packed, `"n":"a"`) || !strings.Contains(packed, `"n":"b"`) {
		t.Errorf("runs.steps after the run's next write = %q, want both steps in it", packed)
	}
	diff(t, "step_runs rows after the steps moved into the run's row", []string{}, stepRowNames(t, s, r.ID))
}

// testStepsPlacedElsewhere: a run whose row holds steps that this store
// would keep in step_runs (written by a build that kept more steps in a
// run's row) reads whole, and its next write moves every such step into
// step_runs, the ones it did not change too: none is lost.
func testStepsPlacedElsewhere(t *testing.T, s store.Store) {
	raw := rawDB(t, s)
	ctx := t.Context()
	wf := mkWorkflow(t, s, "wf")
	var steps []*store.StepRun
	var names, packed []string
	for i := range 20 {
		name := fmt.Sprintf("s%02d", i)
		steps = append(steps, &store.StepRun{Name: name, Position: i, Type: "task", Status: status.StepPending})
		names = append(names, name)
		n := ""
		if i == 0 {
			n = `"N":20,`
		}
		packed = append(packed, fmt.Sprintf(`{%s"n":"%s","p":%d,"t":"task","s":"pending"}`, n, name, i))
	}
	r := mkRun(t, s, &store.NewRun{Run: baseRun(wf, ""), Steps: steps})
	_, before := getRun(t, s, r.ID)
	for _, q := range []string{
		fmt.Sprintf(`UPDATE runs SET steps = '[%s]' WHERE id = '%s'`, strings.Join(packed, ","), r.ID),
		fmt.Sprintf(`DELETE FROM step_runs WHERE run_id = '%s'`, r.ID),
	} {
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// A write the run caches cannot have seen: forget what they hold.
	_, err := s.UpdateWorkflow(ctx, wf.ID, &store.Workflow{Name: "wf-renamed", Fingerprint: wf.Fingerprint + "-renamed", Definition: wf.Definition, Enabled: true})
	must(t, err, "UpdateWorkflow")
	diff(t, "steps placed by another build", []string{}, stepRowNames(t, s, r.ID))
	_, got := getRun(t, s, r.ID)
	diff(t, "the run's steps as read", before, got)
	st := *before[5]
	st.Status, st.StartedAt = status.StepRunning, ptr(at(time.Second))
	inRun(t, s, r.ID, at(time.Second), func(tx store.RunTx) error { return tx.UpdateStep(&st) })
	want := append([]*store.StepRun(nil), before...)
	want[5] = &st
	_, got = getRun(t, s, r.ID)
	diff(t, "the run's steps after one was written", want, got)
	diff(t, "steps with a step_runs row after the write", names, stepRowNames(t, s, r.ID))
}

// testGetRunWhileStepsMove: a step that moves between the run's row and
// step_runs (a callback token set, then cleared) while GetRun reads the
// run is always read, from one place or the other.
func testGetRunWhileStepsMove(t *testing.T, s store.Store) {
	wf := mkWorkflow(t, s, "wf")
	r := mkSimpleRun(t, s, wf)
	done := make(chan error, 1)
	go func() {
		for i := range 150 {
			for _, tok := range []string{fmt.Sprintf("tok-move-%s-%d", r.ID, i), ""} {
				err := s.InRun(t.Context(), r.ID, at(time.Second), func(tx store.RunTx) error {
					st := *tx.Step("b")
					st.CallbackToken = tok
					return tx.UpdateStep(&st)
				})
				if err != nil {
					done <- err
					return
				}
			}
		}
		done <- nil
	}()
	for reads := 0; ; reads++ {
		select {
		case err := <-done:
			must(t, err, "InRun moving step b")
			if reads == 0 {
				t.Log("no read overlapped the moves")
			}
			return
		default:
		}
		_, steps, err := s.GetRun(t.Context(), r.ID)
		must(t, err, "GetRun")
		if len(steps) != 2 {
			t.Fatalf("read %d: GetRun returned %d steps, want 2", reads, len(steps))
		}
	}
}

// testDormantRunsLeaveTheCache: a store that keeps runs in memory does not
// keep one whose next write is more than a minute away (no step runs or
// waits, its earliest wake-up and its expiry later than that), whether it
// was created so or became so by a write; a run that wakes or expires
// sooner, or has a step running or waiting beside its long sleep, is
// kept. A kept run's next transaction is a cache hit, a dropped one's is
// not.
func testDormantRunsLeaveTheCache(t *testing.T, s store.Store) {
	c, ok := s.(interface{ RunCacheHits() int64 })
	if !ok {
		t.Skip("the store keeps no runs in memory")
	}
	wf := mkWorkflow(t, s, "dormant")
	now := t0
	sleeping := func(name string, pos int, d time.Duration) *store.StepRun {
		return &store.StepRun{Name: name, Position: pos, Type: "sleep", Status: status.StepSleeping, WakeAt: ptr(now.Add(d)), StartedAt: ptr(now)}
	}
	after := func(pos int) *store.StepRun {
		return &store.StepRun{Name: "after", Position: pos, Type: "task", Status: status.StepPending}
	}
	// hit runs one transaction on the run at now+1s (appending an event,
	// so that the run is written) and reports whether it was a cache hit.
	hit := func(id string, fn func(tx store.RunTx) error) bool {
		t.Helper()
		before := c.RunCacheHits()
		inRun(t, s, id, now.Add(time.Second), func(tx store.RunTx) error {
			if fn != nil {
				if err := fn(tx); err != nil {
					return err
				}
			}
			return tx.Append(store.NewEvent{Type: "touched"})
		})
		return c.RunCacheHits() != before
	}
	for _, tc := range []struct {
		name    string
		steps   []*store.StepRun
		expires time.Duration
		cached  bool
	}{
		{"asleep for an hour", []*store.StepRun{sleeping("nap", 0, time.Hour), after(1)}, 24 * time.Hour, false},
		{"asleep for a second", []*store.StepRun{sleeping("nap", 0, 2*time.Second), after(1)}, 24 * time.Hour, true},
		{"asleep for an hour, expiring in half a minute", []*store.StepRun{sleeping("nap", 0, time.Hour), after(1)}, 30 * time.Second, true},
		{"asleep for an hour beside a running step", []*store.StepRun{sleeping("nap", 0, time.Hour), {Name: "work", Position: 1, Type: "task", Status: status.StepRunning, Attempt: 1, StartedAt: ptr(now)}}, 24 * time.Hour, true},
		{"asleep for an hour beside a waiting step", []*store.StepRun{sleeping("nap", 0, time.Hour), {Name: "hook", Position: 1, Type: "webhook", Status: status.StepWaiting, CallbackToken: "wh_dormant", StartedAt: ptr(now)}}, 24 * time.Hour, true},
		{"asleep for an hour and for a second", []*store.StepRun{sleeping("nap", 0, time.Hour), sleeping("doze", 1, 2*time.Second)}, 24 * time.Hour, true},
	} {
		r := baseRun(wf, "")
		r.StartedAt, r.ExpiresAt = now, now.Add(tc.expires)
		res, err := s.CreateRuns(t.Context(), []*store.NewRun{{Workflow: wf, Run: r, Steps: tc.steps, Events: []store.NewEvent{{Type: "run_started"}}}}, now)
		must(t, err, "CreateRuns")
		if res[0].Err != nil {
			t.Fatalf("%s: %v", tc.name, res[0].Err)
		}
		if got := hit(res[0].Run.ID, nil); got != tc.cached {
			t.Errorf("%s: the run's first transaction was a cache hit: %v, want %v", tc.name, got, tc.cached)
		}
	}

	// A run that falls asleep for an hour by a write leaves the cache, and
	// comes back to it when a write brings its wake-up near.
	r := baseRun(wf, "")
	r.StartedAt, r.ExpiresAt = now, now.Add(24*time.Hour)
	res, err := s.CreateRuns(t.Context(), []*store.NewRun{{Workflow: wf, Run: r, Steps: []*store.StepRun{
		{Name: "work", Position: 0, Type: "task", Status: status.StepRunning, Attempt: 1, StartedAt: ptr(now)},
		{Name: "nap", Position: 1, Type: "sleep", Status: status.StepPending},
	}, Events: []store.NewEvent{{Type: "run_started"}}}}, now)
	must(t, err, "CreateRuns")
	id := res[0].Run.ID
	napFor := func(d time.Duration) func(tx store.RunTx) error {
		return func(tx store.RunTx) error {
			work := *tx.Step("work")
			work.Status, work.FinishedAt = status.StepSuccess, ptr(now.Add(time.Second))
			if err := tx.UpdateStep(&work); err != nil {
				return err
			}
			nap := *tx.Step("nap")
			nap.Status, nap.StartedAt, nap.WakeAt = status.StepSleeping, ptr(now.Add(time.Second)), ptr(now.Add(d))
			return tx.UpdateStep(&nap)
		}
	}
	if !hit(id, napFor(time.Hour)) {
		t.Error("the running run's transaction was not a cache hit")
	}
	if hit(id, nil) {
		t.Error("the run asleep for an hour was still cached")
	}
	if hit(id, napFor(3*time.Second)) {
		t.Error("the run asleep for an hour was cached at its next write")
	}
	if !hit(id, nil) {
		t.Error("the run woken soon after that write was not cached again")
	}
}
