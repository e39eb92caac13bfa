package spec

import (
	"strings"
	"testing"
)

// TestBOMAndFlowStyleYAML: a definition that starts with a byte-order
// mark (several editors write one) and one in YAML's flow style are
// read; broken JSON still gets the JSON parser's error. (Found by an
// audit: the first two were refused with errors pointing elsewhere.)
func TestBOMAndFlowStyleYAML(t *testing.T) {
	for name, doc := range map[string]string{
		"json with BOM": "\ufeff{\"name\":\"a\",\"tasks\":{\"x\":{\"sleep\":5}}}",
		"yaml with BOM": "\ufeffname: a\ntasks:\n  x:\n    sleep: 5\n",
		"flow yaml":     "{name: a, tasks: {x: {sleep: 5}}}",
	} {
		w, err := Parse([]byte(doc), DefaultLimits)
		if err != nil || w.Name != "a" || len(w.Steps) != 1 {
			t.Errorf("%s: %+v, %v", name, w, err)
		}
	}
	_, err := Parse([]byte(`{"name": "a", "tasks": {"x": {"sleep": 5}}`), DefaultLimits)
	if err == nil || !strings.Contains(err.Error(), "JSON") {
		t.Errorf("broken JSON: %v, want the JSON parser's error", err)
	}
}
