package expr

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestConditionEval(t *testing.T) {
	sc := testScope(t)
	tests := []struct {
		cond string
		want bool
	}{
		{"tasks.charge.status_code == 200", true},
		{"tasks.charge.status_code == 200.0", true},
		{"tasks.charge.status_code == 2e2", true},
		{"200 == tasks.charge.status_code", true},
		{"tasks.charge.status_code != 200", false},
		{"tasks.charge.status_code == '200'", false}, // no coercion
		{"tasks.charge.body.ratio == 200", true},     // json.Number "200.0"
		{"tasks.floaty.body.code == 200", true},      // float64
		{"tasks.floaty.body.half < 1", true},
		{"tasks.payment-result.status == 'timeout'", true},
		{`tasks.payment-result.status == "timeout"`, true},
		{"tasks.charge.status == 'success' && tasks.charge.body.approved == true", true},
		{"tasks.charge.body.approved == true && !(tasks.charge.status_code >= 400)", true},
		{"tasks.plain.status_code >= 400", true},
		{"tasks.plain.status_code >= 400 && tasks.plain.status_code < 500", false},
		// Timed-out webhook: body is null, so this is false, not an error.
		{"tasks.payment-result.body.status == 'paid'", false},
		{"tasks.payment-result.body.status != 'paid'", true},
		{"tasks.payment-result.body == null", true},
		{"tasks.payment-result.status_code == null", true},
		{"tasks.payment-result.status_code == 200", false},
		{"null == null", true},
		{"null == 0", false},
		{"null != false", true},
		{"tasks.big.body.amount == null", true}, // truncated: lenient null
		{"tasks.nope.status == null", true},
		{"tasks.nope.status == 'success'", false},
		{"tasks.charge.body.status == 'paid'", true},
		{"tasks.charge.headers.X-REQUEST-ID == 'req-1'", true},
		{"trigger.headers.content-type == 'application/json'", true},
		{"trigger.body.items[1].qty == 1", true},
		{"trigger.body.items.1.qty == 1", true},
		{"trigger.body.items.0.id == 'a' && trigger.body.items[0].id == \"a\"", true},
		{"trigger.body.customer == trigger.body.customer", true},
		{"trigger.body.price > 12", true},
		{"trigger.body.price > 12.5", false},
		{"trigger.body.price >= 12.5", true},
		{"trigger.body.price <= -1", false},
		{"-1 < 0", true},
		{"-1.5e0 == -1.5", true},
		{"'abc' < 'abd'", true},
		{"'b' > 'a'", true},
		{"'10' > 9", false}, // mixed kinds are unordered
		{"'10' < 9", false},
		{"null < 1", false},
		{"null >= null", false},
		{"true > false", false},
		// Truthiness of bare operands.
		{"tasks.charge.body.approved", true},
		{"trigger.body.customer.vip", true},
		{"trigger.body.customer.nickname", false},
		{"trigger.body.zero", false},
		{"trigger.body.empty", false},
		{"trigger.body.order_id", true},
		{"trigger.body.tags", true},
		{"trigger.body.customer", true},
		{"tasks.nope.status", false},
		{"!tasks.nope.status", true},
		{"!!trigger.body.amount", true},
		{"true", true},
		{"false", false},
		{"null", false},
		{"0", false},
		{"''", false},
		{"'x'", true},
		// Precedence: && binds tighter than ||; ! applies to a comparison.
		{"true || false && false", true},
		{"(true || false) && false", false},
		{"!tasks.charge.status_code == 200", false},
		{"!(tasks.charge.status_code == 500)", true},
		{"false || false || true", true},
		{"true && true && false", false},
		// Escapes in strings.
		{`'it\'s' == "it's"`, true},
		{`'a\\b' == "a\\b"`, true},
		{`'\u00e9' == 'é'`, true},
		{`'tab\there' != 'tab here'`, true},
		// Wrapped in {{ }}.
		{"{{ tasks.charge.status_code == 200 }}", true},
		{"  {{tasks.charge.status_code != 200}}  ", false},
		// Numeric step-name-like segments and hyphens.
		{"tasks.payment-result.status=='timeout'&&tasks.charge.status_code==200", true},
	}
	for _, tt := range tests {
		c, err := ParseCondition(tt.cond)
		if err != nil {
			t.Errorf("ParseCondition(%q): %v", tt.cond, err)
			continue
		}
		if got := c.Eval(sc); got != tt.want {
			t.Errorf("Eval(%q) = %v, want %v (canonical %s)", tt.cond, got, tt.want, c.canonical())
		}
		if c.String() != tt.cond {
			t.Errorf("String() = %q, want the source %q", c.String(), tt.cond)
		}
		// The canonical form means the same thing.
		c2, err := ParseCondition(c.canonical())
		if err != nil {
			t.Errorf("canonical %q of %q does not parse: %v", c.canonical(), tt.cond, err)
		} else if c2.Eval(sc) != tt.want {
			t.Errorf("canonical %q evaluates differently", c.canonical())
		}
	}
}

func TestConditionNilScope(t *testing.T) {
	c, err := ParseCondition("tasks.a.status == null && !trigger.body")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Eval(nil) {
		t.Error("Eval(nil) = false, want everything to be null")
	}
}

func TestConditionCanonical(t *testing.T) {
	tests := []struct{ in, want string }{
		{"a.b==1", "a.b == 1"},
		{"a || b && c", "(a || (b && c))"},
		{"(a || b) && !c", "((a || b) && !c)"},
		{"!(a.b[01] != \"x'y\")", `!a.b[1] != 'x\'y'`},
		{"{{ true }}", "true"},
		{"x == null || y != false", "(x == null || y != false)"},
		{"'line\\nbreak' == a", `'line\nbreak' == a`},
	}
	for _, tt := range tests {
		c, err := ParseCondition(tt.in)
		if err != nil {
			t.Errorf("ParseCondition(%q): %v", tt.in, err)
			continue
		}
		if got := c.canonical(); got != tt.want {
			t.Errorf("canonical(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestConditionRefs(t *testing.T) {
	c, err := ParseCondition("tasks.charge.status_code == 200 && (trigger.body.items[0].id != 'x' || !wait.w-1.url) && 'lit' == tasks.payment-result.body.status")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range c.Refs() {
		got = append(got, r.String())
	}
	want := []string{"tasks.charge.status_code", "trigger.body.items[0].id", "wait.w-1.url", "tasks.payment-result.body.status"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Refs() = %q, want %q", got, want)
	}
	if c.Refs()[3].Step() != "payment-result" {
		t.Errorf("Step() = %q", c.Refs()[3].Step())
	}
	// Refs hands out copies.
	c.Refs()[0][0].Name = "mutated"
	if c.Refs()[0].Root() != "tasks" {
		t.Error("Refs() exposes internal state")
	}
}

func TestParseConditionErrors(t *testing.T) {
	tests := []struct {
		in  string
		pos int
		msg string
	}{
		{"", 0, "empty condition"},
		{"   ", 3, "empty condition"},
		{"{{ }}", 3, "empty condition"},
		{"tasks.a.status 'x'", 15, "expected operator or end of expression"},
		{"tasks.charge.ok a", 16, "expected operator or end of expression"},
		{"a == 1 and b == 2", 7, "use '&&' for 'and'"},
		{"a == 1 OR b == 2", 7, "use '||' for 'or'"},
		{"a = 1", 2, "use '=='"},
		{"a & b", 2, "use '&&'"},
		{"a | b", 2, "use '||'"},
		{"a ==", 4, "unexpected end of expression"},
		{"== 1", 0, "expected a path, a literal"},
		{"a == == 1", 5, "expected a path, a literal"},
		{"a == b == c", 7, "comparisons cannot be chained"},
		{"(a == 1", 0, "unclosed '('"},
		{"(a == 1 b)", 8, "expected operator or ')'"},
		{"a == 1)", 6, "expected operator or end of expression"},
		{"()", 1, "expected a path, a literal"},
		{"!", 1, "unexpected end of expression"},
		{"a && ", 5, "unexpected end of expression"},
		{"'abc", 0, "unterminated string"},
		{`"abc\"`, 0, "unterminated string"},
		{`'a\qb'`, 2, "unknown escape"},
		{`'\u12'`, 1, "four hex digits"},
		{`'\u12zz'`, 1, "four hex digits"},
		{"a == 01", 5, "invalid number"},
		{"a == 1.", 5, "invalid number"},
		{"a == 1e", 5, "invalid number"},
		{"a == 1.5.2", 5, "invalid number"},
		{"a == 12abc", 5, "invalid number"},
		{"a == -", 5, "expected a number after '-'"},
		{"a == -x", 5, "expected a number after '-'"},
		{"a == 1e999", 5, "number out of range"},
		{"a == True", 5, "did you mean 'true'"},
		{"NULL == a", 0, "did you mean 'null'"},
		{"a.", 2, "expected a name after '.'"},
		{"a[x] == 1", 2, "expected an array index"},
		{"{{ a }} == 1", 0, "template braces"},
		{"a == {{ b }}", 5, "template braces"},
		{"  {{ a == }}", 10, "unexpected end of expression"},
		{"{{ a == 1 b }}", 10, "expected operator or end of expression"},
		{"a # b", 2, "unexpected '#'"},
		{"a == é", 5, "unexpected 'é'"},
		{"a\x00", 1, `unexpected '\x00'`},
		{strings.Repeat("(", 200) + "a" + strings.Repeat(")", 200), 100, "nested too deeply"},
		{strings.Repeat("!", 200) + "a", 100, "nested too deeply"},
	}
	for _, tt := range tests {
		_, err := ParseCondition(tt.in)
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("ParseCondition(%q) error = %v, want *SyntaxError", tt.in, err)
			continue
		}
		if se.Pos != tt.pos || !strings.Contains(se.Msg, tt.msg) || se.Input != tt.in {
			t.Errorf("ParseCondition(%q) = %q (pos %d), want pos %d and message containing %q", tt.in, se.Msg, se.Pos, tt.pos, tt.msg)
		}
	}
}

func TestSyntaxErrorText(t *testing.T) {
	_, err := ParseCondition("tasks.charge.ok a")
	if err == nil || err.Error() != "expected operator or end of expression at 16" {
		t.Errorf("Error() = %v", err)
	}
}
