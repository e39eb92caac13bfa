package sqlstore

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ferryhq/ferry/internal/store"
)

// TestRowEventsByOwner: what each row gains is its owner's in-row events
// in order, however the owners' events interleave in the changeset, and
// nothing for events past the row's share.
func TestRowEventsByOwner(t *testing.T) {
	ev := func(owner string, seq int64, task bool) eventRow {
		rowCap := runEvents(1, true)
		if task {
			rowCap = taskRowEvents
		}
		return eventRow{owner: owner, seq: seq, typ: fmt.Sprintf("%s.%d", owner, seq), at: seq, cap: rowCap}
	}
	c := &changeset{events: []eventRow{
		ev("run", 1, false), ev("run", 2, false), ev("task", 1, true), ev("run", 3, false),
		ev("task", 2, true), ev("task", 9, true), ev("run", 9, false), ev("other", 4, false),
	}}
	want := map[string]string{}
	for _, e := range c.events {
		if e.inRow() {
			want[e.owner] = string(e.rowJSON([]byte(want[e.owner])))
		}
	}
	if got := c.rowEvents(); !reflect.DeepEqual(got, want) {
		t.Fatalf("rowEvents = %q, want %q", got, want)
	}
	if len(want) != 3 || !strings.Contains(want["run"], `"run.3"`) || strings.Contains(want["run"], `"run.9"`) {
		t.Fatalf("the expectation itself is off: %q", want)
	}
	if got := (&changeset{events: []eventRow{ev("task", 9, true)}}).rowEvents(); len(got) != 0 {
		t.Fatalf("rowEvents of events past the row = %q, want none", got)
	}
	long := eventRow{owner: "long", seq: 1, typ: "run_started", cap: runEvents(runRowEventsSteps+1, true)}
	if got := (&changeset{events: []eventRow{long}}).rowEvents(); len(got) != 0 {
		t.Fatalf("rowEvents of a long run's first event = %q, want none (its row holds its steps)", got)
	}
	if runEvents(runRowEventsSteps+1, false) != runRowEvents {
		t.Fatal("a run whose steps are not in its row has no room for its events")
	}
}

// TestTaskEventDataMatchesTheMaps: the data of a task's "created" event
// and of the "claimed" event of a task leased as it is created, written
// without maps, are byte for byte what encodeData writes for the maps
// they stand for, for any ids, types, steps and worker ids, attempts and
// lease ends (years json.Marshal refuses included).
func TestTaskEventDataMatchesTheMaps(t *testing.T) {
	str := rapid.OneOf(
		rapid.StringMatching(`[a-z0-9.\-]{0,20}`),
		rapid.String(),
		rapid.SampledFrom([]string{"", `"`, `\`, "<b>", "a&b", "\n", "é", "\xff"}),
	)
	rapid.Check(t, func(t *rapid.T) {
		until := time.UnixMicro(rapid.Int64Range(-70000000000000, 300000000000000).Draw(t, "until"))
		if rapid.Bool().Draw(t, "zoned") {
			until = until.In(time.FixedZone("x", 5400))
		}
		task := &store.Task{Type: str.Draw(t, "type"), LeasedBy: str.Draw(t, "worker"), Attempt: rapid.IntRange(0, 1000).Draw(t, "attempt"), LeaseUntil: &until}
		if rapid.Bool().Draw(t, "step") {
			task.RunID, task.Step = str.Draw(t, "run"), str.Draw(t, "name")
		}
		created := map[string]any{"type": task.Type}
		if task.RunID != "" {
			created["run_id"], created["step"] = task.RunID, task.Step
		}
		if got, want := createdData(task), mustJSON(created); got != want {
			t.Fatalf("createdData = %s, want %s", got, want)
		}
		how := rapid.SampledFrom([]string{"", "eager", "waiting_claim"}).Draw(t, "how")
		claimed := map[string]any{"worker_id": task.LeasedBy, "attempt": task.Attempt, "lease_until": task.LeaseUntil.UTC()}
		if how != "" {
			claimed[how] = true
		}
		if got, want := string(claimedData(task, how)), mustJSON(claimed); got != want {
			t.Fatalf("claimedData(%q) = %s, want %s", how, got, want)
		}
		if got, want := string(attemptData(task.Attempt)), mustJSON(map[string]any{"attempt": task.Attempt}); got != want {
			t.Fatalf("attemptData = %s, want %s", got, want)
		}
	})
}

// TestEventJSONKeptAsItIs: data the caller encoded goes into the event as
// it is (not re-encoded: a JSON string of it, say).
func TestEventJSONKeptAsItIs(t *testing.T) {
	in := `{"task_id":"01J","type":"a.b.v1"}`
	got, err := encodeData(store.EventJSON(in))
	if err != nil || string(got) != in {
		t.Fatalf("encodeData = %s, %v; want %s", got, err, in)
	}
}
