package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// refOrdered is an ordered object as encoding/json writes it through the
// original MarshalJSON: each key and value json.Marshal'ed on its own.
type refOrdered struct{ o *ordered }

func (r refOrdered) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range r.o.keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		buf.Write(kb)
		buf.WriteByte(':')
		vb, err := json.Marshal(reference(r.o.vals[k]))
		if err != nil {
			return nil, err
		}
		buf.Write(vb)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// reference is v with every ordered object replaced by a refOrdered, so
// that encoding/json writes it without the code under test.
func reference(v any) any {
	switch x := v.(type) {
	case *ordered:
		if x == nil {
			return nil
		}
		return refOrdered{x}
	case []any:
		if x == nil {
			return x
		}
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = reference(e)
		}
		return out
	case map[string]any:
		if x == nil {
			return x
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = reference(e)
		}
		return out
	}
	return v
}

// encodingJSON is what writeJSON wrote before the fast path: the encoder
// without HTML escaping, or nothing when encoding fails.
func encodingJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(reference(v)); err != nil {
		return nil
	}
	return buf.Bytes()
}

// jsonValue draws the values views are made of, nested up to depth; with
// odd, also values the fast path leaves to encoding/json (floats,
// structs, times in other zones).
func jsonValue(depth int, odd bool) *rapid.Generator[any] {
	str := rapid.OneOf(
		rapid.StringMatching(`[a-z_.0-9:-]{0,16}`),
		rapid.String(),
		rapid.SampledFrom([]string{"", `"`, `\`, "<b>", "a&b", "\n\t\x00", "é", "\u2028", "\xff", "run cancelled"}),
	)
	ts := rapid.Int64Range(-70000000000000, 300000000000000)
	gens := []*rapid.Generator[any]{
		rapid.Just[any](nil),
		rapid.Map(str, func(s string) any { return s }),
		rapid.Map(rapid.Bool(), func(v bool) any { return v }),
		rapid.Map(rapid.Int(), func(v int) any { return v }),
		rapid.Map(rapid.Int64(), func(v int64) any { return v }),
		rapid.Map(rapid.Int(), func(v int) any { return &v }),
		rapid.Map(rapid.Int64(), func(v int64) any { return &v }),
		rapid.Just[any]((*int)(nil)),
		rapid.Just[any]((*int64)(nil)),
		rapid.Map(ts, func(us int64) any { return time.UnixMicro(us).UTC() }),
		rapid.Map(rapid.IntRange(-2, 10001), func(y int) any { return time.Date(y, 3, 1, 0, 0, 0, 5, time.UTC) }),
		rapid.Map(rapid.SampledFrom([]string{`{}`, `{"ok":true}`, ` { "a" : [1, 2.5e3, "x y"] } `, `"<b>"`, `"\u2028"`, `{"a":`, `nul`, `[1,]`, "\"\u2028\"", `"a&b"`}),
			func(s string) any { return json.RawMessage(s) }),
		rapid.Just[any](json.RawMessage(nil)),
		rapid.Map(rapid.MapOfN(str, str, 0, 3), func(m map[string]string) any { return m }),
		rapid.Just[any](map[string]string(nil)),
	}
	if odd {
		gens = append(gens,
			rapid.Map(ts, func(us int64) any { return time.UnixMicro(us).In(time.FixedZone("x", 5400)) }),
			rapid.Map(rapid.Float64(), func(v float64) any { return v }),
			rapid.Just[any](struct{ A int }{1}),
		)
	}
	if depth > 0 {
		inner := jsonValue(depth-1, odd)
		gens = append(gens,
			rapid.Map(rapid.SliceOfN(rapid.Custom(func(t *rapid.T) [2]any {
				return [2]any{str.Draw(t, "key"), inner.Draw(t, "value")}
			}), 0, 6), func(kvs [][2]any) any {
				o := &ordered{}
				for _, kv := range kvs {
					o.set(kv[0].(string), kv[1])
				}
				return o
			}),
			rapid.Map(rapid.SliceOfN(inner, 0, 4), func(v []any) any { return v }),
			rapid.Just[any]([]any(nil)),
			rapid.Map(rapid.MapOfN(str, inner, 0, 4), func(m map[string]any) any { return m }),
			rapid.Just[any](map[string]any(nil)),
			rapid.Just[any]((*ordered)(nil)),
		)
	}
	return rapid.OneOf(gens...)
}

// TestResponseJSONMatchesEncodingJSON: a response written by the fast path
// is byte for byte what encoding/json writes, and what it cannot write it
// leaves to encoding/json (writeJSON's output is then the encoder's).
func TestResponseJSONMatchesEncodingJSON(t *testing.T) {
	var fast, all int
	// rapid runs 100 cases a Check; an escape inside an ordered object's
	// raw value took some 700 to come up.
	for range 30 {
		checkResponseJSON(t, &fast, &all)
	}
	t.Logf("the fast path wrote %d of %d values", fast, all)
	// The comparison is worth something only if the fast path wrote.
	if fast < all/3 {
		t.Fatalf("the fast path wrote %d of %d values", fast, all)
	}
}

func checkResponseJSON(t *testing.T, fast, all *int) {
	rapid.Check(t, func(t *rapid.T) {
		v := jsonValue(3, rapid.IntRange(0, 4).Draw(t, "kind") == 0).Draw(t, "value")
		want := encodingJSON(v)
		*all++
		if b, bp := encodeResponse(v); b != nil {
			*fast++
			if !bytes.Equal(b, want) {
				t.Fatalf("fast path wrote\n%s\nencoding/json\n%s", b, want)
			}
			putResponse(bp, b)
		}
		rec := httptest.NewRecorder()
		writeJSON(rec, 200, v)
		if want == nil { // encoding/json refuses it (a year past 9999…): a 500
			if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"code":"internal"`) {
				t.Fatalf("writeJSON of a value encoding/json refuses: %d %s, want 500", rec.Code, rec.Body.String())
			}
		} else if got := rec.Body.Bytes(); rec.Code != 200 || !bytes.Equal(got, want) {
			t.Fatalf("writeJSON wrote %d\n%s\nencoding/json\n%s", rec.Code, got, want)
		}
		if o, ok := v.(*ordered); ok && o != nil {
			got, err := o.MarshalJSON()
			ref, refErr := refOrdered{o}.MarshalJSON()
			if (err != nil) != (refErr != nil) || !bytes.Equal(got, ref) {
				t.Fatalf("MarshalJSON = %s, %v; the original %s, %v", got, err, ref, refErr)
			}
		}
	})
}

// TestResponseJSONTakesTheViews: the views a worker's reports are answered
// with go through the fast path, not back to encoding/json.
func TestResponseJSONTakesTheViews(t *testing.T) {
	at := time.Date(2026, 11, 27, 16, 0, 0, 123456000, time.UTC)
	task := &ordered{}
	task.set("id", "01a21dbb-ceaf-7bfd-bcc2-52c12e675ce6")
	task.set("payload", json.RawMessage(`{"order": 42}`))
	task.set("priority", 100)
	task.set("run_at", at)
	task.set("idempotency_key", nil)
	task.set("lease_until", utc(&at))
	task.set("result", json.RawMessage(`{"ok":true}`))
	task.set("status_code", (*int)(nil))
	task.set("headers", map[string]string{"Content-Type": "application/json"})
	v := map[string]any{"data": task, "next": []any{task}}
	b, bp := encodeResponse(v)
	if b == nil {
		t.Fatal("a completion's answer went to encoding/json")
	}
	defer putResponse(bp, b)
	if want := encodingJSON(v); !bytes.Equal(b, want) {
		t.Fatalf("wrote\n%s\nencoding/json\n%s", b, want)
	}
	// And the benchmark's answer, so that it measures the fast path.
	answer := completionAnswer()
	b2, bp2 := encodeResponse(answer)
	if b2 == nil {
		t.Fatal("the benchmark's completion answer went to encoding/json")
	}
	defer putResponse(bp2, b2)
	if want := encodingJSON(answer); !bytes.Equal(b2, want) {
		t.Fatalf("wrote\n%s\nencoding/json\n%s", b2, want)
	}
}

// TestResponseJSONEscapes pins the escapes that differ between the top
// level (no HTML escaping) and inside an ordered object (json.Marshal's),
// in strings and in raw values, whatever rapid draws.
func TestResponseJSONEscapes(t *testing.T) {
	for _, v := range []any{
		"\u2028", "<b>&", "a\u2029b", "\xff", "é",
		json.RawMessage("\"\u2028\""),
		json.RawMessage(`{"a": "x` + "\u2029" + `y", "b": [1, 2]}`),
		json.RawMessage(`"<b>&"`),
		json.RawMessage("\"\xff\""),
		json.RawMessage(`{"é": "ü"}`),
	} {
		o := &ordered{}
		o.set("p", v)
		for _, x := range []any{v, o, []any{o}, map[string]any{"data": o, "next": []any{v}}} {
			want := encodingJSON(x)
			rec := httptest.NewRecorder()
			writeJSON(rec, 200, x)
			if got := rec.Body.Bytes(); !bytes.Equal(got, want) {
				t.Errorf("%#v: writeJSON wrote %q, encoding/json %q", x, got, want)
			}
			if b, bp := encodeResponse(x); b != nil {
				if !bytes.Equal(b, want) {
					t.Errorf("%#v: the fast path wrote %q, encoding/json %q", x, b, want)
				}
				putResponse(bp, b)
			}
		}
	}
}

// completionAnswer is what a report that takes the run's next step is
// answered with: the task completed and the task claimed.
func completionAnswer() any {
	at := time.Date(2026, 11, 27, 16, 0, 0, 123456000, time.UTC)
	task := &ordered{}
	for _, kv := range [][2]any{
		{"id", "01a21dbb-ceaf-7bfd-bcc2-52c12e675ce6"}, {"type", "bench.noop.v1"}, {"status", "succeeded"},
		{"payload", json.RawMessage(`{}`)}, {"priority", 100}, {"run_at", at}, {"attempt", 1}, {"max_attempts", 3},
		{"retry_delay", "1s"}, {"idempotency_key", nil}, {"leased_by", "bench"}, {"lease_until", nil},
		{"cancel_requested", false}, {"result", json.RawMessage(`{"ok":true}`)}, {"last_error", nil},
		{"run_id", "01a21dbb-ceaf-7bfa-8cc3-b1859954517c"}, {"step", "s1"}, {"created_at", at}, {"updated_at", at}, {"finished_at", at},
	} {
		task.set(kv[0].(string), kv[1])
	}
	next := &ordered{}
	for _, kv := range [][2]any{
		{"id", "01a21dbb-ceaf-7bfd-bcc2-52c12e675ce7"}, {"type", "bench.noop.v1"}, {"payload", json.RawMessage(`{}`)},
		{"attempt", 1}, {"max_attempts", 3}, {"lease_token", "HB6YKW7XZPA6TDGAUYZINFLWWB"}, {"lease_until", at},
		{"run_id", "01a21dbb-ceaf-7bfa-8cc3-b1859954517c"}, {"step", "s2"},
	} {
		next.set(kv[0].(string), kv[1])
	}
	return map[string]any{"data": task, "next": []any{next}}
}

// BenchmarkCompletionAnswer writes a completion's answer as writeJSON
// does, and as encoding/json did before.
func BenchmarkCompletionAnswer(b *testing.B) {
	v := completionAnswer()
	b.Run("writeJSON", func(b *testing.B) {
		b.ReportAllocs()
		w := httptest.NewRecorder()
		for b.Loop() {
			w.Body.Reset()
			writeJSON(w, 200, v)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		var buf bytes.Buffer
		ref := reference(v)
		for b.Loop() {
			buf.Reset()
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			_ = enc.Encode(ref)
		}
	})
}

// TestUnencodableAnswerIs500: an answer encoding/json refuses is a 500
// with an error body, not the status the handler meant with an empty
// body (its status used to go out before the encoding failed).
func TestUnencodableAnswerIs500(t *testing.T) {
	rec := httptest.NewRecorder()
	deep := any("x")
	for range 10001 {
		deep = []any{deep}
	}
	writeJSON(rec, http.StatusOK, map[string]any{"data": deep, "f": func() {}})
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"code":"internal"`) {
		t.Fatalf("answer %d %q, want 500 with an internal error body", rec.Code, rec.Body.String())
	}
}
