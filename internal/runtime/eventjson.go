package runtime

import (
	"encoding/json"
	"strconv"
)

// The data of a step's most frequent events, and a task step's request,
// encoded here rather than as maps for the store to encode: each map, its
// boxed values and their encoding were a tenth of the objects a chain10
// step allocated. The output is json.Marshal's of the map, byte for byte
// (keys sorted); strings it would escape go through json.Marshal.

// taskRef is {"task_id": id, "type": typ}.
func taskRef(id, typ string) []byte {
	if !plainJSON(id) || !plainJSON(typ) {
		b, _ := json.Marshal(map[string]any{"task_id": id, "type": typ})
		return b
	}
	b := make([]byte, 0, len(`{"task_id":"","type":""}`)+len(id)+len(typ))
	b = append(b, `{"task_id":"`...)
	b = append(b, id...)
	b = append(b, `","type":"`...)
	b = append(b, typ...)
	return append(b, `"}`...)
}

// attemptRef is {"task_id": id, "attempt": attempt}.
func attemptRef(attempt int, id string) []byte {
	if !plainJSON(id) {
		b, _ := json.Marshal(map[string]any{"task_id": id, "attempt": attempt})
		return b
	}
	b := make([]byte, 0, len(`{"attempt":,"task_id":""}`)+20+len(id))
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, int64(attempt), 10)
	b = append(b, `,"task_id":"`...)
	b = append(b, id...)
	return append(b, `"}`...)
}

// plainJSON: json.Marshal writes s unchanged between quotes (printable
// ASCII other than the quote, the backslash and the HTML characters it
// escapes).
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}
