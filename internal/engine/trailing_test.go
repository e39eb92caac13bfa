package engine_test

import (
	"testing"

	"github.com/ferryhq/ferry/internal/engine"
	"github.com/ferryhq/ferry/internal/status"
)

// TestBodyWithTrailingBracketIsNotJSON: a body with a stray closing
// bracket after a JSON value is not JSON (json.Valid says so, and the run
// view shows it as a string), so it is read as a raw string only
// (workflow-format.md: tasks.<step>.body.field is then a template_error).
// (Found by an audit: templates and conditions read it as the object.)
func TestBodyWithTrailingBracketIsNotJSON(t *testing.T) {
	def := parse(t, `{"name":"p","tasks":{
		"a":{"url":"https://x.test/a"},
		"whole":{"needs":["a"],"url":"https://x.test/w","body":{"v":"{{tasks.a.body}}"}},
		"field":{"needs":["a"],"url":"https://x.test/f","body":{"v":"{{tasks.a.body.x}}"}},
		"cond":{"needs":["a"],"if":"tasks.a.body.x == 1","url":"https://x.test/c"}
	}}`)
	for _, body := range []string{`{"x":1}}`, `{"x":1}]`} {
		r := engine.Run{Def: def, TriggerBody: []byte(`{}`), Steps: map[string]engine.StepState{
			"a": {Status: status.StepSuccess, StatusCode: intp(200), Body: []byte(body)},
		}}
		ds := decideAll(t, r)
		if d := ds["field"]; d.Action != engine.TemplateError {
			t.Errorf("body %q: {{tasks.a.body.x}} = %s (sent %s), want template_error: the body is not JSON", body, d.Action, d.HTTP.Body)
		}
		if d := ds["whole"]; d.HTTP != nil {
			jsonEqual(t, "body "+body+": {{tasks.a.body}}", d.HTTP.Body, `{"v":`+quoteJSON(body)+`}`)
		}
		if d := ds["cond"]; d.Action != engine.Skip {
			t.Errorf("body %q: if tasks.a.body.x == 1 -> %s, want skip (lenient null on a non-JSON body)", body, d.Action)
		}
	}
}

func quoteJSON(s string) string {
	b := []byte{'"'}
	for _, c := range []byte(s) {
		if c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, c)
	}
	return string(append(b, '"'))
}
