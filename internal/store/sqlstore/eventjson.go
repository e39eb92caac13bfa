package sqlstore

import (
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"github.com/ferryhq/ferry/internal/store"
)

// encodeData is json.Marshal(v), byte for byte, for the data of an event.
// Nearly every event carries a small map[string]any of strings, integers
// and times (a job writes seven of them); encoding/json sorts such a map's
// keys and reflects on every value, which was a tenth of Ferry's CPU in
// the jobs workload. Those maps are written here directly; any other
// value (a float, a nested value) goes to encoding/json.
func encodeData(v any) ([]byte, error) {
	if j, ok := v.(store.EventJSON); ok && j != nil {
		return j, nil
	}
	if m, ok := v.(map[string]any); ok && m != nil { // nil is null
		if b, ok := appendMap(make([]byte, 0, 128), m); ok {
			return b, nil
		}
	}
	return json.Marshal(v)
}

// appendMap appends m as encoding/json would, or reports false when a
// value is of a kind it leaves to encoding/json.
func appendMap(b []byte, m map[string]any) ([]byte, bool) {
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
		b = appendJSONString(b, k)
		b = append(b, ':')
		switch x := m[k].(type) {
		case nil:
			b = append(b, "null"...)
		case string:
			b = appendJSONString(b, x)
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

// appendJSONString appends s as encoding/json writes it.
func appendJSONString(b []byte, s string) []byte {
	if out, ok := appendPlainString(b, s); ok {
		return out
	}
	q, _ := json.Marshal(s) // a string always encodes
	return append(b, q...)
}

// appendPlainString appends s quoted when encoding/json writes it
// unchanged: printable ASCII other than the quote, the backslash and the
// characters it escapes for HTML. Otherwise it reports false and b is
// as it was.
func appendPlainString(b []byte, s string) ([]byte, bool) {
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
