package expr

import (
	"errors"
	"reflect"
	"testing"
)

func TestParsePath(t *testing.T) {
	tests := []struct {
		in    string
		want  Path
		canon string
	}{
		{"trigger.body.order_id", Path{{"trigger", -1, false}, {"body", -1, false}, {"order_id", -1, false}}, ""},
		// Hyphenated step names are one segment, never a subtraction.
		{"tasks.payment-result.status", Path{{"tasks", -1, false}, {"payment-result", -1, false}, {"status", -1, false}}, ""},
		{"tasks.payment-result.body.items[0].id", Path{{"tasks", -1, false}, {"payment-result", -1, false}, {"body", -1, false}, {"items", -1, false}, {"0", 0, true}, {"id", -1, false}}, ""},
		{"a.items.0.id", Path{{"a", -1, false}, {"items", -1, false}, {"0", 0, false}, {"id", -1, false}}, ""},
		{"a[1][2]", Path{{"a", -1, false}, {"1", 1, true}, {"2", 2, true}}, ""},
		{"a[007]", Path{{"a", -1, false}, {"7", 7, true}}, "a[7]"},
		{"a.007", Path{{"a", -1, false}, {"007", 7, false}}, ""},
		{"_x.y-", Path{{"_x", -1, false}, {"y-", -1, false}}, ""},
		{"wait.step-1.url", Path{{"wait", -1, false}, {"step-1", -1, false}, {"url", -1, false}}, ""},
	}
	for _, tt := range tests {
		got, err := ParsePath(tt.in)
		if err != nil {
			t.Errorf("ParsePath(%q): %v", tt.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParsePath(%q) = %#v, want %#v", tt.in, got, tt.want)
		}
		canon := tt.canon
		if canon == "" {
			canon = tt.in
		}
		if got.String() != canon {
			t.Errorf("ParsePath(%q).String() = %q, want %q", tt.in, got.String(), canon)
		}
	}
}

func TestParsePathErrors(t *testing.T) {
	tests := []struct {
		in  string
		pos int
	}{
		{"", 0},
		{"1abc", 0},
		{"-a", 0},
		{"a.", 2},
		{"a..b", 2},
		{"a[", 2},
		{"a[]", 2},
		{"a[x]", 2},
		{"a[-1]", 2},
		{"a[1", 3},
		{"a[99999999999999999999999]", 1},
		{"a b", 1},
		{"a+b", 1},
		{"tasks.é", 6},
		{"a.b ", 3},
	}
	for _, tt := range tests {
		_, err := ParsePath(tt.in)
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("ParsePath(%q) error = %v, want *SyntaxError", tt.in, err)
			continue
		}
		if se.Pos != tt.pos {
			t.Errorf("ParsePath(%q) error at %d (%v), want at %d", tt.in, se.Pos, se, tt.pos)
		}
	}
}

func TestPathAccessors(t *testing.T) {
	p, err := ParsePath("tasks.payment-result.body[2].x")
	if err != nil {
		t.Fatal(err)
	}
	if p.Root() != "tasks" || p.Step() != "payment-result" {
		t.Errorf("Root/Step = %q/%q", p.Root(), p.Step())
	}
	want := []string{"tasks", "payment-result", "body", "[2]", "x"}
	if got := p.Names(); !reflect.DeepEqual(got, want) {
		t.Errorf("Names() = %q, want %q", got, want)
	}
	single, _ := ParsePath("trigger")
	if single.Root() != "trigger" || single.Step() != "" {
		t.Errorf("single Root/Step = %q/%q", single.Root(), single.Step())
	}
	idx, _ := ParsePath("a[0]")
	if idx.Step() != "" {
		t.Errorf("Step of a[0] = %q, want empty", idx.Step())
	}
	if (Path{}).Root() != "" || (Path{}).String() != "" {
		t.Error("empty path accessors")
	}
}
