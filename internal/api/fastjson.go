package api

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ferryhq/ferry/internal/jsonenc"
)

// Responses are written without encoding/json's reflection where they can
// be: a worker's report over HTTP answers with the task it completed and
// the tasks it claimed, each an ordered object, and encoding/json marshalled
// every key and value of those on its own and then checked and compacted
// the whole again (writeJSON was 8 % of the process's CPU in chain10 over
// HTTP). The output is byte for byte what encoding/json writes
// (TestResponseJSONMatchesEncodingJSON); a value of any other type, or one
// that would need escaping this code does not do, falls back to
// encoding/json for the whole response.

// appendJSON appends v as encoding/json writes it, escaping <, > and & in
// strings when html (json.Marshal does, and so does every value inside an
// ordered object, which MarshalJSON writes with it), not otherwise (the
// response encoder, which writes the envelope). ok is false if v holds a
// value it does not write; b is then to be dropped.
func appendJSON(b []byte, v any, html bool) (_ []byte, ok bool) {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), true
	case string:
		return appendJSONString(b, x, html)
	case bool:
		return strconv.AppendBool(b, x), true
	case int:
		return strconv.AppendInt(b, int64(x), 10), true
	case int64:
		return strconv.AppendInt(b, x, 10), true
	case *int:
		if x == nil {
			return append(b, "null"...), true
		}
		return strconv.AppendInt(b, int64(*x), 10), true
	case *int64:
		if x == nil {
			return append(b, "null"...), true
		}
		return strconv.AppendInt(b, *x, 10), true
	case time.Time:
		// time.Time's MarshalJSON is RFC 3339 with nanoseconds; it fails
		// outside years 0–9999, and other zones are left to it.
		if y := x.Year(); y < 0 || y > 9999 || x.Location() != time.UTC {
			return b, false
		}
		b = append(b, '"')
		b = x.AppendFormat(b, time.RFC3339Nano)
		return append(b, '"'), true
	case json.RawMessage:
		return appendRaw(b, x)
	case *ordered:
		if x == nil {
			return append(b, "null"...), true
		}
		b = append(b, '{')
		for i, k := range x.keys {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendJSONString(b, k, true); !ok {
				return b, false
			}
			b = append(b, ':')
			if b, ok = appendJSON(b, x.vals[k], true); !ok {
				return b, false
			}
		}
		return append(b, '}'), true
	case []any:
		if x == nil {
			return append(b, "null"...), true
		}
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendJSON(b, e, html); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	case map[string]any:
		return appendSorted(b, x, html, appendJSON)
	case map[string]string:
		return appendSorted(b, x, html, func(b []byte, v string, html bool) ([]byte, bool) { return appendJSONString(b, v, html) })
	}
	return b, false
}

// appendSorted writes a map as encoding/json does: its keys in order.
func appendSorted[V any](b []byte, m map[string]V, html bool, val func([]byte, V, bool) ([]byte, bool)) (_ []byte, ok bool) {
	if m == nil {
		return append(b, "null"...), true
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		if b, ok = appendJSONString(b, k, html); !ok {
			return b, false
		}
		b = append(b, ':')
		if b, ok = val(b, m[k], html); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

// appendJSONString writes s as encoding/json does. With html it is
// jsonenc's (json.Marshal's escaping); without, only strings that need no
// escaping at all are written here.
func appendJSONString(b []byte, s string, html bool) ([]byte, bool) {
	if html {
		return jsonenc.AppendString(b, s), true
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return b, false
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}

// appendRaw writes a json.RawMessage as encoding/json does: compacted,
// after checking it is valid. A nil one is null. One that json.Marshal
// would change further (it escapes <, > and &, and U+2028 and U+2029)
// is left to encoding/json: 0xE2 is the first byte of both of those. (A
// string of characters to ContainsAny would not do: it reads "\xe2" as
// U+FFFD, which a valid U+2028 does not contain.)
func appendRaw(b []byte, raw json.RawMessage) ([]byte, bool) {
	if raw == nil {
		return append(b, "null"...), true
	}
	if bytes.IndexByte(raw, 0xe2) >= 0 || bytes.ContainsAny(raw, "<>&") {
		return b, false
	}
	buf := bytes.NewBuffer(b)
	if err := json.Compact(buf, raw); err != nil {
		return b, false
	}
	return buf.Bytes(), true
}

// responseBufs are the buffers responses are written into.
var responseBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// encodeResponse is what json.NewEncoder with SetEscapeHTML(false) writes
// for v, newline included, or nil when v is left to encoding/json. Once
// out is written, putResponse(bp, out) gives the buffer back.
func encodeResponse(v any) (out []byte, bp *[]byte) {
	bp = responseBufs.Get().(*[]byte)
	b, ok := appendJSON((*bp)[:0], v, false)
	if !ok {
		responseBufs.Put(bp)
		return nil, nil
	}
	return append(b, '\n'), bp
}

// putResponse returns a response's buffer (grown to out) to the pool; a
// large one is not kept.
func putResponse(bp *[]byte, out []byte) {
	if cap(out) <= 64<<10 {
		*bp = out[:0]
		responseBufs.Put(bp)
	}
}
