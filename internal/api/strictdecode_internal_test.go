package api

import "testing"

// TestStrictDecodeRefusesTrailingData: a request body is one JSON object
// and nothing after it, a stray closing bracket included (which the
// decoder's More let through).
func TestStrictDecodeRefusesTrailingData(t *testing.T) {
	for _, body := range []string{`{"type":"a.v1"}}`, `{"type":"a.v1"}]`, `{"type":"a.v1"} {}`, `{"type":"a.v1"}x`} {
		var v struct {
			Type string `json:"type"`
		}
		if fe := decodeStrictBytes([]byte(body), &v, ""); fe == nil {
			t.Errorf("accepted %q as %+v", body, v)
		}
	}
	var v struct {
		Type string `json:"type"`
	}
	if fe := decodeStrictBytes([]byte(" {\"type\":\"a.v1\"} \n"), &v, ""); fe != nil || v.Type != "a.v1" {
		t.Errorf("an object with white space around it: %v %+v", fe, v)
	}
}
