package expr

import (
	"errors"
	"reflect"
	"testing"
)

var templateSeeds = []string{
	"",
	"plain",
	"{{ trigger.body.order_id }}",
	"https://api/{{trigger.body.items[0].id}}/x?y={{ tasks.payment-result.body.a.0 }}",
	"{{ tasks.charge.status_code }}{{wait.w.url}}",
	"{{",
	"{{}}",
	"{{ a b }}",
	"{{ a[99999999999999999999] }}",
	"{{{ a }}}",
	"}} {{ a }} }}",
	"{{ tasks.big.body.amount }}",
	"{{ trigger.headers.X-Sig }}",
	"{{\ta.b\r\n}}",
}

func FuzzParseTemplate(f *testing.F) {
	for _, s := range templateSeeds {
		f.Add(s)
	}
	sc := testScope(f)
	f.Fuzz(func(t *testing.T, s string) {
		tpl, err := ParseTemplate(s)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a *SyntaxError", err)
			}
			if se.Pos < 0 || se.Pos > len(s) {
				t.Fatalf("error position %d outside input of length %d", se.Pos, len(s))
			}
			return
		}
		if tpl.String() != s {
			t.Fatalf("String() = %q, want %q", tpl.String(), s)
		}
		checkRefsReparse(t, tpl.Refs())
		// Rendering never panics and only fails with a resolve error.
		if _, err := tpl.Render(sc); err != nil && !errors.As(err, new(*ResolveError)) {
			t.Fatalf("Render error %v is not a *ResolveError", err)
		}
		if _, err := RenderJSON(map[string]any{s: []any{s}}, sc); err != nil &&
			!errors.As(err, new(*ResolveError)) && !errors.As(err, new(*DuplicateKeyError)) {
			t.Fatalf("RenderJSON error %v", err)
		}
	})
}

var conditionSeeds = []string{
	"tasks.charge.status_code == 200",
	"tasks.payment-result.status == 'timeout'",
	"tasks.charge.body.approved == true && !(tasks.charge.status_code >= 400)",
	"{{ tasks.a.body.items[0].id != \"x\\\"y\" || trigger.body.n <= -1.5e3 }}",
	"!!null",
	"a.0 < 'b' && (c || d) || e > 2",
	"'\\u00e9\\n' == x",
	"a == 01",
	"((((a))))",
	"a == b == c",
	"{{ a }} == 1",
	"True",
}

func FuzzParseCondition(f *testing.F) {
	for _, s := range conditionSeeds {
		f.Add(s)
	}
	sc := testScope(f)
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCondition(s)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a *SyntaxError", err)
			}
			if se.Pos < 0 || se.Pos > len(s) {
				t.Fatalf("error position %d outside input of length %d", se.Pos, len(s))
			}
			return
		}
		c2, err := ParseCondition(c.String())
		if err != nil {
			t.Fatalf("String() %q does not re-parse: %v", c.String(), err)
		}
		// The canonical form must parse back to the same tree, refs and
		// meaning; it is a stronger round trip than String().
		canon := c.canonical()
		c3, err := ParseCondition(canon)
		if err != nil {
			t.Fatalf("canonical %q of %q does not parse: %v", canon, s, err)
		}
		if c3.canonical() != canon {
			t.Fatalf("canonical form unstable: %q -> %q", canon, c3.canonical())
		}
		if !reflect.DeepEqual(c3.Refs(), c.Refs()) || !reflect.DeepEqual(c2.Refs(), c.Refs()) {
			t.Fatalf("refs differ after round trip: %v vs %v", c.Refs(), c3.Refs())
		}
		got := c.Eval(sc)
		if c3.Eval(sc) != got {
			t.Fatalf("canonical %q evaluates differently from %q", canon, s)
		}
		_ = c.Eval(nil)
		checkRefsReparse(t, c.Refs())
	})
}

// checkRefsReparse asserts that every ref's canonical text is a valid
// single-placeholder template naming the same path.
func checkRefsReparse(t *testing.T, refs []Path) {
	t.Helper()
	for _, r := range refs {
		text := r.String()
		tpl, err := ParseTemplate("{{" + text + "}}")
		if err != nil {
			t.Fatalf("ref %q does not re-parse as a template: %v", text, err)
		}
		if !tpl.IsSingle() || !reflect.DeepEqual(tpl.Refs()[0], r) {
			t.Fatalf("ref %q re-parses as %v", text, tpl.Refs())
		}
		p, err := ParsePath(text)
		if err != nil || !reflect.DeepEqual(p, r) {
			t.Fatalf("ParsePath(%q) = %v, %v", text, p, err)
		}
	}
}
