package expr

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseTemplateRefs(t *testing.T) {
	tests := []struct {
		in     string
		refs   []string
		single bool
	}{
		{"", nil, false},
		{"plain text } }} {", nil, false},
		{"{{trigger.body.id}}", []string{"trigger.body.id"}, true},
		{"{{ tasks.payment-result.status }}", []string{"tasks.payment-result.status"}, true},
		{"{{\ttasks.a.body.items.0.id\n}}", []string{"tasks.a.body.items.0.id"}, true},
		{" {{trigger.body.id}}", []string{"trigger.body.id"}, false},
		{"{{trigger.body.id}} ", []string{"trigger.body.id"}, false},
		{"{{a.b}}{{c.d}}", []string{"a.b", "c.d"}, false},
		{"https://x/{{ trigger.body.items[0].id }}/y?z={{wait.w.url}}", []string{"trigger.body.items[0].id", "wait.w.url"}, false},
		{"{{ a[01] }}", []string{"a[1]"}, true},
	}
	for _, tt := range tests {
		tpl, err := ParseTemplate(tt.in)
		if err != nil {
			t.Errorf("ParseTemplate(%q): %v", tt.in, err)
			continue
		}
		var got []string
		for _, r := range tpl.Refs() {
			got = append(got, r.String())
		}
		if !reflect.DeepEqual(got, tt.refs) {
			t.Errorf("ParseTemplate(%q).Refs() = %q, want %q", tt.in, got, tt.refs)
		}
		if tpl.IsSingle() != tt.single {
			t.Errorf("ParseTemplate(%q).IsSingle() = %v", tt.in, tpl.IsSingle())
		}
		if tpl.String() != tt.in {
			t.Errorf("String() = %q", tpl.String())
		}
	}
}

func TestParseTemplateErrors(t *testing.T) {
	tests := []struct {
		in  string
		pos int
		msg string
	}{
		{"{{", 0, "unclosed '{{'"},
		{"abc {{ trigger.body", 4, "unclosed '{{'"},
		{"{{a.b}} {{ c", 8, "unclosed '{{'"},
		{"{{}}", 0, "empty placeholder"},
		{"x {{   }}", 2, "empty placeholder"},
		{"{{ 1a }}", 3, "expected a path"},
		{"{{ a b }}", 5, "expected '}}'"},
		{"{{ a.b == 1 }}", 7, "expected '}}'"},
		{"{{ a - b }}", 5, "expected '}}'"},
		{"{{ a. }}", 5, "expected a name after '.'"},
		{"{{ a[x] }}", 5, "expected an array index"},
		{"{{{ a }}}", 2, "expected a path"},
		{"{{ a }", 0, "unclosed '{{'"},
		{"{{ a.$b }}", 5, "expected a name after '.'"},
	}
	for _, tt := range tests {
		_, err := ParseTemplate(tt.in)
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("ParseTemplate(%q) error = %v, want *SyntaxError", tt.in, err)
			continue
		}
		if se.Pos != tt.pos || !strings.Contains(se.Msg, tt.msg) || se.Input != tt.in {
			t.Errorf("ParseTemplate(%q) = %+v, want pos %d and message containing %q", tt.in, se, tt.pos, tt.msg)
		}
	}
}

func TestRender(t *testing.T) {
	sc := testScope(t)
	tests := []struct {
		in   string
		want any
	}{
		{"no placeholders", "no placeholders"},
		{"", ""},
		// A single placeholder keeps the JSON type.
		{"{{ trigger.body.amount }}", json.Number("1250")},
		{"{{tasks.charge.status_code}}", 200},
		{"{{ tasks.charge.body.approved }}", true},
		{"{{ trigger.body.customer }}", map[string]any{"email": "x@y.z", "vip": true, "nickname": nil}},
		{"{{ trigger.body.items }}", decode(t, `[{"id":"a","qty":2},{"id":"b","qty":1}]`)},
		{"{{ tasks.payment-result.status_code }}", nil},
		{"{{ tasks.skip-me.body }}", nil},
		{"{{ trigger.body.order_id }}", "ord_1"},
		// In longer text everything is stringified.
		{"id={{trigger.body.order_id}}", "id=ord_1"},
		{"code {{ tasks.charge.status_code }}", "code 200"},
		{"ratio {{ tasks.charge.body.ratio }}", "ratio 200.0"},
		{"float {{ tasks.floaty.body.code }}", "float 200"},
		{"half {{ tasks.floaty.body.half }}", "half 0.5"},
		{"price {{ trigger.body.price }}", "price 12.5"},
		{"nick={{ trigger.body.customer.nickname }}", "nick=null"},
		{"code={{ tasks.payment-result.status_code }}", "code=null"},
		{"vip={{ trigger.body.customer.vip }}", "vip=true"},
		{"c={{ trigger.body.customer }}", `c={"email":"x@y.z","nickname":null,"vip":true}`},
		{"i={{ trigger.body.items[1] }}", `i={"id":"b","qty":1}`},
		{"t={{ trigger.body.tags }}", "t=[]"},
		{"h={{ trigger.body.html }}", "h=<b>&"},
		{" {{ trigger.body.amount }}", " 1250"},
		{"{{trigger.body.items.0.id}}-{{trigger.body.items[1].id}}", "a-b"},
		{"{{ trigger.headers.X-SIGNATURE }}", "sig"},
		{"{{ wait.payment-result.url }}", "https://ferry.example/hooks/abc"},
		{"{{ tasks.big.body }}", `{"amount": 12`},
		{"{{ tasks.plain.body }}!", "Internal Server Error!"},
	}
	for _, tt := range tests {
		tpl, err := ParseTemplate(tt.in)
		if err != nil {
			t.Errorf("ParseTemplate(%q): %v", tt.in, err)
			continue
		}
		got, err := tpl.Render(sc)
		if err != nil {
			t.Errorf("Render(%q): %v", tt.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Render(%q) = %#v, want %#v", tt.in, got, tt.want)
		}
	}
}

func TestRenderFirstErrorWins(t *testing.T) {
	sc := testScope(t)
	tpl, err := ParseTemplate("{{ trigger.body.order_id }} {{ tasks.big.body.amount }} {{ tasks.nope.status }}")
	if err != nil {
		t.Fatal(err)
	}
	_, err = tpl.Render(sc)
	var re *ResolveError
	if !errors.As(err, &re) {
		t.Fatalf("error = %v, want *ResolveError", err)
	}
	want := "Failed to resolve {{tasks.big.body.amount}}: Cannot read 'body.amount' because the response from 'big' exceeded the 256KB limit and was truncated"
	if err.Error() != want {
		t.Errorf("error = %q\nwant    %q", err.Error(), want)
	}
}

func TestRenderString(t *testing.T) {
	sc := testScope(t)
	tests := []struct{ in, want string }{
		{"{{ trigger.body.order_id }}", "ord_1"},
		{"{{ trigger.body.amount }}", "1250"},
		{"{{ tasks.charge.status_code }}", "200"},
		{"{{ tasks.payment-result.status_code }}", "null"},
		{"{{ trigger.body.customer.vip }}", "true"},
		{"{{ trigger.body.items[0] }}", `{"id":"a","qty":2}`},
		{"https://api/{{ trigger.body.order_id }}?a={{trigger.body.amount}}", "https://api/ord_1?a=1250"},
		{"Bearer {{ trigger.headers.x-signature }}", "Bearer sig"},
	}
	for _, tt := range tests {
		got, err := RenderString(tt.in, sc)
		if err != nil || got != tt.want {
			t.Errorf("RenderString(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if _, err := RenderString("{{", sc); !errors.As(err, new(*SyntaxError)) {
		t.Errorf("RenderString syntax error = %v", err)
	}
	if _, err := RenderString("{{ tasks.nope.status }}", sc); !errors.As(err, new(*ResolveError)) {
		t.Errorf("RenderString resolve error = %v", err)
	}
}

func TestRenderJSON(t *testing.T) {
	sc := testScope(t)
	in := decode(t, `{
		"order": "{{ trigger.body.order_id }}",
		"amount": "{{ trigger.body.amount }}",
		"note": "amount {{ trigger.body.amount }} for {{ trigger.body.customer.email }}",
		"customer": "{{ trigger.body.customer }}",
		"lines": ["{{ trigger.body.items[0].id }}", 3, true, null, {"n": "{{ tasks.charge.status_code }}"}],
		"key-{{ trigger.body.order_id }}": "v",
		"{{ trigger.body.amount }}": "numeric key",
		"literal": 1.5
	}`)
	before := decode(t, `{}`)
	raw, _ := json.Marshal(in)
	if err := json.Unmarshal(raw, &before); err != nil {
		t.Fatal(err)
	}
	got, err := RenderJSON(in, sc)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"order":     "ord_1",
		"amount":    json.Number("1250"),
		"note":      "amount 1250 for x@y.z",
		"customer":  map[string]any{"email": "x@y.z", "vip": true, "nickname": nil},
		"lines":     []any{"a", json.Number("3"), true, nil, map[string]any{"n": 200}},
		"key-ord_1": "v",
		"1250":      "numeric key",
		"literal":   json.Number("1.5"),
	}
	if !reflect.DeepEqual(got, want) {
		gj, _ := json.Marshal(got)
		t.Errorf("RenderJSON = %s", gj)
	}
	after, _ := json.Marshal(in)
	if string(after) != string(raw) {
		t.Errorf("input mutated:\n%s\n%s", raw, after)
	}
	// Mutating the output must not reach the scope.
	got.(map[string]any)["customer"].(map[string]any)["email"] = "changed"
	if sc.Lookup(mustPath(t, "trigger.body.customer.email")) != "x@y.z" {
		t.Error("scope mutated through RenderJSON output")
	}
}

func TestRenderJSONErrors(t *testing.T) {
	sc := testScope(t)
	// Sorted key order makes the first error deterministic.
	in := map[string]any{
		"b": "{{ tasks.nope.status }}",
		"a": []any{"ok", "{{ tasks.plain.body.x }}"},
	}
	for range 10 {
		_, err := RenderJSON(in, sc)
		var re *ResolveError
		if !errors.As(err, &re) || re.Path != "tasks.plain.body.x" {
			t.Fatalf("error = %v, want the resolve error for tasks.plain.body.x", err)
		}
	}
	if _, err := RenderJSON(map[string]any{"x": "{{ oops"}, sc); !errors.As(err, new(*SyntaxError)) {
		t.Errorf("syntax error = %v", err)
	}
	if _, err := RenderJSON(map[string]any{"{{ nope }}": 1}, sc); !errors.As(err, new(*ResolveError)) {
		t.Errorf("key resolve error = %v", err)
	}
	_, err := RenderJSON(map[string]any{"ord_1": 1, "{{ trigger.body.order_id }}": 2}, sc)
	var de *DuplicateKeyError
	if !errors.As(err, &de) || de.Key != "ord_1" || err.Error() != `two object keys render to the same key "ord_1"` {
		t.Errorf("duplicate key error = %v", err)
	}
	// Scalars and unknown types pass through.
	for _, v := range []any{nil, true, json.Number("1"), 2.5, []string{"{{ x }}"}} {
		got, err := RenderJSON(v, sc)
		if err != nil || !reflect.DeepEqual(got, v) {
			t.Errorf("RenderJSON(%#v) = %#v, %v", v, got, err)
		}
	}
}

func TestTemplateRefs(t *testing.T) {
	in := decode(t, `{
		"z": "{{ tasks.a.body.x }}",
		"{{ trigger.headers.k }}": ["x {{ wait.w.url }} {{ tasks.b-c.status }}", 1, null],
		"m": {"n": "{{trigger.body.items[2]}}"}
	}`)
	refs, err := TemplateRefs(in)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range refs {
		got = append(got, r.String())
	}
	want := []string{"trigger.body.items[2]", "tasks.a.body.x", "trigger.headers.k", "wait.w.url", "tasks.b-c.status"}
	// Keys sort as "m", "z", "{{ trigger.headers.k }}" ('{' sorts after letters).
	if !reflect.DeepEqual(got, want) {
		t.Errorf("TemplateRefs = %q, want %q", got, want)
	}
	if refs, err := TemplateRefs("plain"); err != nil || refs != nil {
		t.Errorf("TemplateRefs(plain) = %v, %v", refs, err)
	}
	_, err = TemplateRefs(map[string]any{"a": "{{ ok.x }}", "b": []any{"{{ bad path }}"}})
	var se *SyntaxError
	if !errors.As(err, &se) || se.Input != "{{ bad path }}" {
		t.Errorf("TemplateRefs syntax error = %#v", err)
	}
}
