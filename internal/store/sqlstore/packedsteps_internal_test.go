package sqlstore

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ferryhq/ferry/internal/store"
	"pgregory.net/rapid"
)

// TestPackedStepsRoundTrip: a packable step read back from the run row's
// steps is, every field and nil-ness included, what a step_runs row would
// have given back (overlayStep's image of it); strings of any valid UTF-8
// (quotes, escapes, control characters, non-ASCII) included.
func TestPackedStepsRoundTrip(t *testing.T) {
	str := rapid.OneOf(
		rapid.StringMatching(`[a-z_]{0,12}`),
		rapid.String(),
		rapid.SampledFrom([]string{"", `"`, `\`, "<b>", "a&b", "\n\t\x01\x1f\x7f", "é", "\u2028", `{"task_id":"t-1","type":"x.v1"}`}),
	)
	optTime := rapid.Custom(func(t *rapid.T) *time.Time {
		if rapid.Bool().Draw(t, "nil") {
			return nil
		}
		v := time.Unix(0, rapid.Int64Range(0, 4e18).Draw(t, "ns")).In(time.FixedZone("x", 3600))
		return &v
	})
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 5).Draw(t, "steps")
		var steps []*store.StepRun
		for i := range n {
			st := &store.StepRun{
				RunID: "r", Name: rapid.StringMatching(`[a-z][a-z0-9_]{0,8}`).Draw(t, "name") + strings.Repeat("x", i),
				Position: i, Type: str.Draw(t, "type"), Status: str.Draw(t, "status"), Attempt: rapid.IntRange(-1, 1000).Draw(t, "attempt"),
				Request: json.RawMessage(str.Draw(t, "request")), Body: []byte(str.Draw(t, "body")), Error: str.Draw(t, "error"),
				Truncated: rapid.Bool().Draw(t, "truncated"), Blocked: rapid.Bool().Draw(t, "blocked"),
				WakeAt: optTime.Draw(t, "wake"), StartedAt: optTime.Draw(t, "started"), FinishedAt: optTime.Draw(t, "finished"),
			}
			if rapid.Bool().Draw(t, "code") {
				c := rapid.IntRange(-1, 999).Draw(t, "status code")
				st.StatusCode = &c
			}
			if rapid.Bool().Draw(t, "duration") {
				d := rapid.Int64().Draw(t, "duration ms")
				st.DurationMS = &d
			}
			switch rapid.IntRange(0, 2).Draw(t, "headers") {
			case 1:
				st.Headers = map[string]string{}
			case 2:
				st.Headers = rapid.MapOfN(str, str, 1, 3).Draw(t, "header map")
			}
			steps = append(steps, st)
		}
		var want []*store.StepRun
		for _, st := range steps {
			if packable(st, true) {
				b := &store.StepRun{RunID: st.RunID, Name: st.Name, Position: st.Position, Type: st.Type}
				overlayStep(b, st)
				want = append(want, b)
			}
		}
		packed := packSteps(steps, packedIn(steps, true, nil, nil))
		got, all, err := unpackSteps("r", packed)
		if err != nil {
			t.Fatalf("unpack: %v\n%s", err, packed)
		}
		rw, rg := &runTx{run: &store.Run{}, steps: want}, &runTx{run: &store.Run{}, steps: got}
		if a, b := runImage(rw), runImage(rg); a != b {
			t.Fatalf("round trip:\nwant %s\ngot  %s\npacked %s", a, b, packed)
		}
		if all != (len(want) == n) {
			t.Fatalf("all steps in the row = %v, with %d of %d packable", all, len(want), n)
		}
		// The parser without reflection reads what encoding/json reads,
		// or leaves it to it.
		if packed == "" {
			return
		}
		fast, fastCount, ok := parsePacked("r", packed)
		slow, slowCount, err := decodePacked("r", packed)
		if err != nil {
			t.Fatalf("decodePacked: %v", err)
		}
		hasHeaders := false
		for _, st := range want {
			hasHeaders = hasHeaders || st.Headers != nil
		}
		if ok == hasHeaders {
			t.Fatalf("parsePacked took it = %v, with headers %v:\n%s", ok, hasHeaders, packed)
		}
		if ok {
			a, b := runImage(&runTx{run: &store.Run{}, steps: slow}), runImage(&runTx{run: &store.Run{}, steps: fast})
			if a != b || fastCount != slowCount {
				t.Fatalf("parsePacked differs from encoding/json:\njson   %s %d\nparsed %s %d\npacked %s", a, slowCount, b, fastCount, packed)
			}
		}
	})
}

// TestPackable: what stays out of the run's row.
func TestPackable(t *testing.T) {
	small := func() *store.StepRun {
		return &store.StepRun{Name: "a", Position: 0, Type: "task", Status: "running", Request: json.RawMessage(`{"task_id":"t"}`)}
	}
	if !packable(small(), true) {
		t.Fatal("a small task step of a short run is not packable")
	}
	if packable(small(), false) {
		t.Error("a small task step of a longer run is packable")
	}
	for what, change := range map[string]func(*store.StepRun){
		"a callback token":          func(st *store.StepRun) { st.CallbackToken = "tok" },
		"a large output":            func(st *store.StepRun) { st.Body = make([]byte, stepRowBytes) },
		"large headers":             func(st *store.StepRun) { st.Headers = map[string]string{"k": strings.Repeat("v", stepRowBytes)} },
		"an output not UTF-8":       func(st *store.StepRun) { st.Body = []byte{0xff} },
		"an output with a NUL":      func(st *store.StepRun) { st.Body = []byte{'a', 0} },
		"an error not UTF-8":        func(st *store.StepRun) { st.Error = "\xff" },
		"a header value not UTF-8":  func(st *store.StepRun) { st.Headers = map[string]string{"k": "\xc3"} },
		"a request with a NUL byte": func(st *store.StepRun) { st.Request = json.RawMessage("\x00") },
	} {
		st := small()
		change(st)
		if packable(st, true) {
			t.Errorf("a step with %s is packable", what)
		}
	}
}

// TestParsePackedRefuses: what the parser without reflection does not
// read is left to encoding/json, never read wrongly.
func TestParsePackedRefuses(t *testing.T) {
	for _, packed := range []string{
		`[{"n":"a","p":0,"t":"task","s":"x","e":"a\/b"}]`, // an escape appendEscaped does not write
		`[{"n":"a","p":0,"t":"task","s":"x","e":"\u00e9"}]`,
		`[{"n":"a","p":0,"t":"task","s":"x","h":{}}]`,
		`[{"n":"a","p":0,"t":"task","s":"x","z":1}]`,
		`[{"n":"a", "p":0}]`,
		`[{"n":"a","p":0}] `,
		`[{"n":"a","p":0,"x":false}]`,
	} {
		if _, _, ok := parsePacked("r", packed); ok {
			t.Errorf("parsePacked took %s", packed)
		}
	}
	got, _, err := unpackSteps("r", `[{"n":"a","p":0,"t":"task","s":"x","e":"a\/b\u00e9"}]`)
	if err != nil || len(got) != 1 || got[0].Error != "a/bé" {
		t.Errorf("unpackSteps through encoding/json = %v, %v", got, err)
	}
}

// TestPackedStepsMemoMatchesPacking: a run's row written with the forms
// its cache entry kept is byte for byte the row packSteps writes, over a
// run's life of writes, each laying some steps over the entry as stage
// does; with a step too large for the row, and for runs too short to keep
// forms.
func TestPackedStepsMemoMatchesPacking(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "steps")
		e := &cachedRun{run: store.Run{ID: "r"}, steps: make([]store.StepRun, n)}
		for i := range e.steps {
			e.steps[i] = store.StepRun{RunID: "r", Name: "s" + strings.Repeat("x", i), Position: i, Type: "task", Status: "pending"}
		}
		short := rapid.Bool().Draw(t, "short")
		for w := range rapid.IntRange(1, 6).Draw(t, "writes") {
			// What this write changes, as new step values (UpdateStep's).
			written := map[[2]string]*store.StepRun{}
			for _, i := range rapid.SliceOfNDistinct(rapid.IntRange(0, n-1), 0, n, rapid.ID[int]).Draw(t, "written") {
				st := e.steps[i]
				st.Status = rapid.SampledFrom([]string{"running", "success", "failed"}).Draw(t, "status")
				st.Attempt = w + 1
				if rapid.IntRange(0, 9).Draw(t, "big") == 0 {
					st.Body = []byte(strings.Repeat("b", stepRowBytes+1)) // not packable
				} else {
					st.Body = []byte(rapid.StringMatching(`[a-z"\\]{0,20}`).Draw(t, "body"))
				}
				at := time.Unix(1700000000, int64(w)*1001).UTC()
				st.FinishedAt = &at
				written[stepKey(&st)] = &st
			}
			rt := &runTx{run: &e.run, base: e}
			committed := rt.committedSteps(written)
			got, forms := packStepsMemo(committed, packedIn(committed, short, e, nil), e)
			if want := packSteps(committed, packedIn(committed, short, nil, nil)); got != want {
				t.Fatalf("write %d: row %q, want %q", w, got, want)
			}
			if (forms != nil) != (n >= packedMemoSteps) {
				t.Fatalf("write %d: forms kept for a run of %d steps: %v", w, n, forms != nil)
			}
			for i, f := range forms {
				// A step not written since is taken as the entry had it.
				if written[stepKey(&e.steps[i])] == nil && e.packed != nil && e.packed[i] != "" && unsafe.StringData(f) != unsafe.StringData(e.packed[i]) {
					t.Fatalf("write %d: step %d, not written, was packed again", w, i)
				}
			}
			// The next entry, as stage lays this write over it.
			next := e.clone()
			next.packed = forms
			for i := range next.steps {
				if st := written[[2]string{"r", next.steps[i].Name}]; st != nil {
					overlayStep(&next.steps[i], st)
				}
			}
			e = next
		}
	})
}

// BenchmarkPackChainStep measures what a write of one step of a ten-step
// run costs in packing the run's row: which steps the row keeps and their
// JSON, the other nine taken from the cache entry.
func BenchmarkPackChainStep(b *testing.B) {
	e := &cachedRun{run: store.Run{ID: "r"}, steps: make([]store.StepRun, 10)}
	at := time.Unix(1700000000, 0).UTC()
	for i := range e.steps {
		e.steps[i] = store.StepRun{RunID: "r", Name: "s" + strconv.Itoa(i), Position: i, Type: "task", Status: "success", Attempt: 1, Request: []byte(`{"task_id":"0194a3c1-8b7e-7c2a-9f10-3b2d4c5e6f70","type":"bench.noop.v1"}`), Body: []byte(`{"ok":true}`), StartedAt: &at, FinishedAt: &at}
	}
	rt := &runTx{run: &e.run, base: e}
	_, e.packed = packStepsMemo(rt.committedSteps(nil), packedIn(rt.committedSteps(nil), true, e, nil), e)
	st := e.steps[9]
	st.Status = "running"
	written := map[[2]string]*store.StepRun{stepKey(&st): &st}
	var buf [16]bool
	b.ReportAllocs()
	for b.Loop() {
		committed := rt.committedSteps(written)
		if packed, _ := packStepsMemo(committed, packedIn(committed, true, e, buf[:]), e); packed == "" {
			b.Fatal("nothing packed")
		}
	}
}
