package sqlstore

import (
	"github.com/ferryhq/ferry/internal/jsonenc"
	"github.com/ferryhq/ferry/internal/store"
)

// encodeData is json.Marshal(v), byte for byte, for the data of an event:
// nearly every event carries a small map[string]any of strings, integers
// and times (a job writes seven of them), which jsonenc writes directly.
// EventJSON is written as it is.
func encodeData(v any) ([]byte, error) {
	if j, ok := v.(store.EventJSON); ok && j != nil {
		return j, nil
	}
	return jsonenc.Marshal(v)
}

// appendJSONString appends s as encoding/json writes it.
func appendJSONString(b []byte, s string) []byte { return jsonenc.AppendString(b, s) }
