package sqlstore

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ferryhq/ferry/internal/store"
)

// TestEncodeDataMatchesEncodingJSON: encodeData writes what json.Marshal
// writes for any event data, taking its own path or not: maps of every
// value kind, keys and strings of any bytes (quotes, escapes, HTML
// characters, non-ASCII, invalid UTF-8), times of any year and zone
// (json.Marshal refuses some: so must encodeData), a nil map.
func TestEncodeDataMatchesEncodingJSON(t *testing.T) {
	str := rapid.OneOf(
		rapid.StringMatching(`[a-z_]{0,12}`),
		rapid.String(),
		rapid.SampledFrom([]string{"", `"`, `\`, "<b>", "a&b", "\n\t\x00", "é", "\u2028", "\xff", "run cancelled"}),
	)
	value := rapid.OneOf(
		rapid.Just[any](nil),
		rapid.Map(str, func(s string) any { return s }),
		rapid.Map(rapid.Bool(), func(v bool) any { return v }),
		rapid.Map(rapid.Int(), func(v int) any { return v }),
		rapid.Map(rapid.Int64(), func(v int64) any { return v }),
		rapid.Map(rapid.Float64(), func(v float64) any { return v }),
		rapid.Map(rapid.Int64Range(-70000000000000, 300000000000000), func(us int64) any {
			return time.UnixMicro(us).UTC()
		}),
		rapid.Map(rapid.Int64Range(0, 4000000000000000), func(ns int64) any {
			return time.Unix(0, ns).In(time.FixedZone("x", 5400))
		}),
		rapid.Map(rapid.Int64Range(0, 4000000000000000), func(ns int64) any {
			return time.Unix(0, ns).In(time.FixedZone("beyond a day", 25*3600))
		}),
		rapid.Map(rapid.SliceOfN(rapid.Int(), 0, 3), func(v []int) any { return v }),
		rapid.Map(rapid.MapOfN(rapid.StringMatching(`[a-z]{1,4}`), rapid.Int(), 0, 3), func(v map[string]int) any { return v }),
	)
	rapid.Check(t, func(t *rapid.T) {
		var v any = rapid.MapOfN(str, value, 0, 10).Draw(t, "map")
		switch rapid.IntRange(0, 9).Draw(t, "kind") {
		case 0:
			v = rapid.MapOfN(str, rapid.Int(), 0, 3).Draw(t, "other map type")
		case 1:
			v = map[string]any(nil)
		}
		want, wantErr := json.Marshal(v)
		got, err := encodeData(v)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("encodeData(%#v) error %v, json.Marshal error %v", v, err, wantErr)
		}
		if string(got) != string(want) {
			t.Fatalf("encodeData(%#v) =\n%s\nwant\n%s", v, got, want)
		}
	})
	// The data of a job's events take the direct path.
	at := time.Date(2026, 11, 24, 23, 0, 0, 123456000, time.UTC)
	for _, m := range []map[string]any{
		{"worker_id": "w-1", "attempt": 1, "lease_until": at},
		{"type": "bench.noop.v1", "run_id": "01J", "step": "job"},
		{"workflow": "bench-jobs", "version": int64(1)},
		{"status": "completed", "reason": ""},
	} {
		if _, ok := appendMap(nil, m); !ok {
			t.Errorf("%v went to encoding/json", m)
		}
	}
}

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
		how := rapid.SampledFrom([]string{"eager", "waiting_claim"}).Draw(t, "how")
		want := mustJSON(map[string]any{"worker_id": task.LeasedBy, "attempt": task.Attempt, "lease_until": task.LeaseUntil.UTC(), how: true})
		if got := claimedData(task, how); got != want {
			t.Fatalf("claimedData = %s, want %s", got, want)
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
