package expr

import "testing"

// TestBigIntegersCompareExactly: integers past what int64 and float64
// hold (ids) compare by their digits, as templates carry them, not as the
// float64 they round to; fractions still compare as float64 (0.1 ==
// 0.1). (Found by an audit: 12345678901234567890 == 12345678901234567891
// was true.)
func TestBigIntegersCompareExactly(t *testing.T) {
	sc := &Scope{TriggerBody: decode(t, `{"id":12345678901234567890,"neg":-98765432109876543210,"f":0.1,"huge":1e400}`)}
	for cond, want := range map[string]bool{
		"trigger.body.id == 12345678901234567891":  false,
		"trigger.body.id != 12345678901234567891":  true,
		"trigger.body.id > 12345678901234567000":   true,
		"trigger.body.id == 12345678901234567890":  true,
		"trigger.body.id > 1":                      true,
		"trigger.body.id < 1.5e19":                 true,
		"trigger.body.neg < -98765432109876543209": true,
		"trigger.body.f == 0.1":                    true,
		"trigger.body.huge > 1e300":                true,
	} {
		c, err := ParseCondition(cond)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Eval(sc); got != want {
			t.Errorf("%s = %v, want %v", cond, got, want)
		}
	}
}
