package jsonenc

import (
	"encoding/json"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestMarshalMatchesEncodingJSON: Marshal writes what json.Marshal
// writes for any event data, taking its own path or not: maps of every
// value kind, keys and strings of any bytes (quotes, escapes, HTML
// characters, non-ASCII, invalid UTF-8), times of any year and zone
// (json.Marshal refuses some: so must Marshal), a nil map.
func TestMarshalMatchesEncodingJSON(t *testing.T) {
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
		got, err := Marshal(v)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("Marshal(%#v) error %v, json.Marshal error %v", v, err, wantErr)
		}
		if string(got) != string(want) {
			t.Fatalf("Marshal(%#v) =\n%s\nwant\n%s", v, got, want)
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
		if _, ok := AppendMap(nil, m); !ok {
			t.Errorf("%v went to encoding/json", m)
		}
	}
}

// TestMarshalOtherValues: values other than a map[string]any are
// encoding/json's, a json.RawMessage validated and compacted as it does.
func TestMarshalOtherValues(t *testing.T) {
	for _, v := range []any{nil, map[string]any(nil), json.RawMessage(` { "a" : [1, 2] } `), struct{ A int }{1}, []string{"x"}, 1.5} {
		want, _ := json.Marshal(v)
		if got, err := Marshal(v); err != nil || string(got) != string(want) {
			t.Errorf("Marshal(%#v) = %s, %v; want %s", v, got, err, want)
		}
	}
	if _, err := Marshal(json.RawMessage(`{"a":`)); err == nil {
		t.Error("Marshal of invalid raw JSON: no error")
	}
}
