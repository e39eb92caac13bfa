package expr

import "testing"

// TestSurrogatePairEscape: a \u escape pair for a character past U+FFFF
// ("\ud83d\ude00", as JSON writes it) is that one character, and a lone
// surrogate stays the replacement character. (Found by an audit: the
// pair read as two U+FFFD.)
func TestSurrogatePairEscape(t *testing.T) {
	sc := &Scope{TriggerBody: decode(t, `{"e":"\ud83d\ude00"}`)}
	c, err := ParseCondition(`trigger.body.e == '\ud83d\ude00'`)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Eval(sc) {
		t.Errorf("%s is false for body %v (literal read as %q)", c, sc.TriggerBody, c.canonical())
	}
	lone, err := ParseCondition(`trigger.body.e == '\ud83d'`)
	if err != nil {
		t.Fatal(err)
	}
	if lone.Eval(sc) || lone.canonical() != "trigger.body.e == '\uFFFD'" {
		t.Errorf("a lone surrogate reads as %q", lone.canonical())
	}
}
