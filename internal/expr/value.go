package expr

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
)

// number is a JSON number reduced to something comparable. Integers that fit
// in int64 compare exactly; a number written with more digits than float64
// holds (an id past 2^63) keeps them in exact, compared at 256 bits, as
// templates carry it exactly; anything else falls back to float64, which
// is what a JSON number means to most producers anyway.
type number struct {
	i     int64
	f     float64
	isInt bool
	exact *big.Float // from text that neither int64 nor float64 holds exactly
}

// exactPrec is the precision numbers past int64 compare at: exact for
// integers of up to 77 digits, without the memory an exact rational of a
// huge exponent ("1e999999999") would take.
const exactPrec = 256

func toNumber(v any) (number, bool) {
	switch n := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
			return number{i: i, f: float64(i), isInt: true}, true
		}
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil && !isRangeErr(err) {
			return number{}, false
		}
		num := floatNumber(f)
		// An integer float64 cannot hold (past 2^53, or past its range)
		// keeps its digits; a fraction (0.1) means its float64, as to
		// most producers.
		if math.IsInf(f, 0) || math.Abs(f) >= 1<<53 { // only there can a float64 lose an integer's digits
			if x, _, err := big.ParseFloat(string(n), 10, exactPrec, big.ToNearestEven); err == nil && x.IsInt() && (math.IsInf(f, 0) || x.Cmp(big.NewFloat(f)) != 0) {
				num.exact = x
			}
		}
		return num, true
	case float64:
		return floatNumber(n), true
	case float32:
		return floatNumber(float64(n)), true
	case int:
		return intNumber(int64(n)), true
	case int8:
		return intNumber(int64(n)), true
	case int16:
		return intNumber(int64(n)), true
	case int32:
		return intNumber(int64(n)), true
	case int64:
		return intNumber(n), true
	case uint:
		return uintNumber(uint64(n)), true
	case uint8:
		return uintNumber(uint64(n)), true
	case uint16:
		return uintNumber(uint64(n)), true
	case uint32:
		return uintNumber(uint64(n)), true
	case uint64:
		return uintNumber(n), true
	}
	return number{}, false
}

func isRangeErr(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

func intNumber(i int64) number { return number{i: i, f: float64(i), isInt: true} }

func uintNumber(u uint64) number {
	if u <= math.MaxInt64 {
		return intNumber(int64(u))
	}
	return number{f: float64(u)}
}

func floatNumber(f float64) number {
	// A float that holds an exact int64 is the same number as that int, and
	// must compare exactly with other ints (200.0 == 200).
	if f == math.Trunc(f) && f >= -(1<<63) && f < 1<<63 {
		return number{i: int64(f), f: f, isInt: true}
	}
	return number{f: f}
}

// bigOf is n at exactPrec bits, or nil when it is not a number (NaN).
func bigOf(n number) *big.Float {
	switch {
	case n.exact != nil:
		return n.exact
	case n.isInt:
		return new(big.Float).SetPrec(exactPrec).SetInt64(n.i)
	case math.IsNaN(n.f):
		return nil
	}
	return new(big.Float).SetPrec(exactPrec).SetFloat64(n.f)
}

// cmpNumbers orders a and b; ok is false when they are unordered (NaN).
func cmpNumbers(a, b number) (c int, ok bool) {
	if a.exact != nil || b.exact != nil {
		x, y := bigOf(a), bigOf(b)
		if x == nil || y == nil {
			return 0, false
		}
		return x.Cmp(y), true
	}
	if a.isInt && b.isInt {
		switch {
		case a.i < b.i:
			return -1, true
		case a.i > b.i:
			return 1, true
		}
		return 0, true
	}
	// An int past 2^53 rounds on its way to float64, up to 2^63 itself
	// (math.MaxInt64 does), which a float past int64 may be: compared as
	// float64, 9223372036854775807 equalled 9223372036854775808.
	if (a.isInt && outsideFloat(a.i)) || (b.isInt && outsideFloat(b.i)) {
		x, y := bigOf(a), bigOf(b)
		if x == nil || y == nil {
			return 0, false
		}
		return x.Cmp(y), true
	}
	switch {
	case a.f < b.f:
		return -1, true
	case a.f > b.f:
		return 1, true
	case a.f == b.f:
		return 0, true
	}
	return 0, false
}

// equal is deep JSON equality: numbers by value across representations,
// never coercing between kinds ("200" != 200).
func equal(a, b any) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if na, ok := toNumber(a); ok {
		nb, ok := toNumber(b)
		if !ok {
			return false
		}
		c, ok := cmpNumbers(na, nb)
		return ok && c == 0
	}
	switch x := a.(type) {
	case string:
		y, ok := b.(string)
		return ok && x == y
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			yv, ok := y[k]
			if !ok || !equal(xv, yv) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return false
}

// order compares two numbers or two strings; anything else is unordered, so
// every ordering operator on mixed kinds is false.
func order(a, b any) (c int, ok bool) {
	if na, isNum := toNumber(a); isNum {
		if nb, isNum := toNumber(b); isNum {
			return cmpNumbers(na, nb)
		}
		return 0, false
	}
	sa, ok1 := a.(string)
	sb, ok2 := b.(string)
	if !ok1 || !ok2 {
		return 0, false
	}
	switch {
	case sa < sb:
		return -1, true
	case sa > sb:
		return 1, true
	}
	return 0, true
}

func truthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != ""
	}
	if n, ok := toNumber(v); ok {
		return n.f != 0 && !math.IsNaN(n.f)
	}
	return true
}

// formatValue renders a value the way it appears inside a longer string:
// strings raw, everything else as compact JSON text.
func formatValue(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return jsonText(v)
}

func jsonText(v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// URLs and bodies are not HTML; "<" must stay "<".
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only values no JSON decoder produces get here (NaN, channels...).
		if f, ok := v.(float64); ok {
			return strconv.FormatFloat(f, 'g', -1, 64)
		}
		return fmt.Sprint(v)
	}
	return string(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
}

// deepCopy copies JSON containers so values handed out of a Scope cannot be
// used to mutate it.
func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}

// outsideFloat says whether i may round when made a float64.
func outsideFloat(i int64) bool { return i > 1<<53 || i < -(1<<53) }
