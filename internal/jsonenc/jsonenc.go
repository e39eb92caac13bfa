package jsonenc

import (
	"encoding/json"
	"slices"
	"strconv"
	"time"
)

// Marshal is json.Marshal(v), byte for byte: a map[string]any of
// strings, integers, booleans, UTC times and nulls is written directly,
// anything else (a float, a nested value, a json.RawMessage, which
// json.Marshal validates and compacts) by encoding/json.
func Marshal(v any) ([]byte, error) {
	if m, ok := v.(map[string]any); ok && m != nil { // nil is null
		if b, ok := AppendMap(make([]byte, 0, 128), m); ok {
			return b, nil
		}
	}
	return json.Marshal(v)
}

// AppendMap appends m as encoding/json would, or reports false when a
// value is of a kind it leaves to encoding/json.
func AppendMap(b []byte, m map[string]any) ([]byte, bool) {
	var arr [8]string
	keys := arr[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, k)
		b = append(b, ':')
		switch x := m[k].(type) {
		case nil:
			b = append(b, "null"...)
		case string:
			b = AppendString(b, x)
		case bool:
			b = strconv.AppendBool(b, x)
		case int:
			b = strconv.AppendInt(b, int64(x), 10)
		case int64:
			b = strconv.AppendInt(b, x, 10)
		case time.Time:
			// Time.MarshalJSON's form, for the UTC times events carry (it
			// refuses years it cannot write and offsets of a day or more).
			if y := x.Year(); y < 0 || y > 9999 || x.Location() != time.UTC {
				return nil, false
			}
			b = append(b, '"')
			b = x.AppendFormat(b, time.RFC3339Nano)
			b = append(b, '"')
		default:
			return nil, false
		}
	}
	return append(b, '}'), true
}

// AppendString appends s as encoding/json writes it.
func AppendString(b []byte, s string) []byte {
	if out, ok := appendPlain(b, s); ok {
		return out
	}
	q, _ := json.Marshal(s) // a string always encodes
	return append(b, q...)
}

// appendPlain appends s quoted when encoding/json writes it
// unchanged: printable ASCII other than the quote, the backslash and the
// characters it escapes for HTML. Otherwise it reports false and b is
// as it was.
func appendPlain(b []byte, s string) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return b, false
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}
