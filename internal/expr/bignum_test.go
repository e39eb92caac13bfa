package expr

import (
	"math"
	"testing"
)

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

// TestIntegersAt2To63CompareExactly: an int64 past 2^53 rounds to float64
// (math.MaxInt64 to 2^63), so comparing it with a number held as a
// float64, 2^63 being the first past int64, found them equal.
func TestIntegersAt2To63CompareExactly(t *testing.T) {
	sc := &Scope{TriggerBody: decode(t, `{"max":9223372036854775807,"p63":9223372036854775808,"min":-9223372036854775808,"half":0.5}`)}
	for cond, want := range map[string]bool{
		"trigger.body.max == 9223372036854775808":        false,
		"trigger.body.max != 9223372036854775808":        true,
		"trigger.body.max < 9223372036854775808":         true,
		"trigger.body.p63 == 9223372036854775807":        false,
		"trigger.body.p63 > trigger.body.max":            true,
		"trigger.body.p63 >= trigger.body.max":           true,
		"trigger.body.max <= 9.223372036854775808e18":    true,
		"9223372036854775807 == 9.223372036854775808e18": false,
		"9223372036854775807 == 9223372036854775807":     true,
		"9223372036854775296 < 9223372036854775808":      true,
		"trigger.body.min == -9223372036854775808":       true,
		"trigger.body.min > -9.223372036854775809e18":    true,
		"9007199254740993 > 9007199254740992.5":          true, // the float is 9007199254740992
		"trigger.body.max > trigger.body.half":           true,
		"-9007199254740993 < trigger.body.half":          true,
	} {
		c, err := ParseCondition(cond)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Eval(sc); got != want {
			t.Errorf("%s = %v, want %v", cond, got, want)
		}
	}
	// A Go caller's int64 and uint64 too.
	if equal(int64(math.MaxInt64), uint64(1<<63)) {
		t.Error("equal(math.MaxInt64, uint64(1<<63)) = true")
	}
}
