package expr

import (
	"encoding/json"
	"math"
	"testing"
)

func TestEqual(t *testing.T) {
	tests := []struct {
		a, b any
		want bool
	}{
		{json.Number("200"), json.Number("200.0"), true},
		{json.Number("200"), 200, true},
		{json.Number("200"), float64(200), true},
		{json.Number("2e2"), int64(200), true},
		{uint8(7), float32(7), true},
		{json.Number("0.1"), 0.1, true},
		{json.Number("200"), json.Number("201"), false},
		{json.Number("9007199254740993"), json.Number("9007199254740992"), false}, // beyond float64, still exact
		{uint64(math.MaxUint64), float64(math.MaxUint64), true},
		{nil, nil, true},
		{nil, 200, false},
		{200, nil, false},
		{nil, false, false},
		{nil, "", false},
		{"200", 200, false},
		{200, "200", false},
		{true, json.Number("1"), false},
		{"a", "a", true},
		{true, true, true},
		{map[string]any{"a": json.Number("1"), "b": []any{"x"}}, map[string]any{"a": 1.0, "b": []any{"x"}}, true},
		{map[string]any{"a": 1}, map[string]any{"b": 1}, false},
		{map[string]any{"a": 1}, map[string]any{"a": 1, "b": 2}, false},
		{[]any{1, 2}, []any{1.0, json.Number("2")}, true},
		{[]any{1, 2}, []any{2, 1}, false},
		{[]any{}, map[string]any{}, false},
		{math.NaN(), math.NaN(), false},
		{json.Number("junk"), json.Number("junk"), false},
	}
	for _, tt := range tests {
		if got := equal(tt.a, tt.b); got != tt.want {
			t.Errorf("equal(%#v, %#v) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestOrder(t *testing.T) {
	tests := []struct {
		a, b any
		c    int
		ok   bool
	}{
		{json.Number("399"), 400, -1, true},
		{json.Number("400.5"), 400, 1, true},
		{json.Number("-1e3"), json.Number("-999"), -1, true},
		{"abc", "abd", -1, true},
		{"b", "a", 1, true},
		{"", "", 0, true},
		{"10", 9, 0, false},
		{nil, 1, 0, false},
		{true, false, 0, false},
		{math.NaN(), 1.0, 0, false},
	}
	for _, tt := range tests {
		c, ok := order(tt.a, tt.b)
		if ok != tt.ok || (ok && c != tt.c) {
			t.Errorf("order(%#v, %#v) = %d, %v; want %d, %v", tt.a, tt.b, c, ok, tt.c, tt.ok)
		}
	}
}

func TestTruthy(t *testing.T) {
	tests := []struct {
		v    any
		want bool
	}{
		{nil, false}, {false, false}, {true, true},
		{json.Number("0"), false}, {json.Number("0.0"), false}, {0.0, false}, {0, false},
		{json.Number("-1"), true}, {1.5, true},
		{"", false}, {"false", true}, {"0", true},
		{map[string]any{}, true}, {[]any{}, true},
	}
	for _, tt := range tests {
		if got := truthy(tt.v); got != tt.want {
			t.Errorf("truthy(%#v) = %v, want %v", tt.v, got, tt.want)
		}
	}
}

func TestFormatValue(t *testing.T) {
	tests := []struct {
		v    any
		want string
	}{
		{"raw <text>", "raw <text>"},
		{nil, "null"},
		{true, "true"},
		{json.Number("200"), "200"},
		{json.Number("12.50"), "12.50"},
		{float64(200), "200"},
		{0.5, "0.5"},
		{1e21, "1e+21"},
		{200, "200"},
		{map[string]any{"b": json.Number("1"), "a": "<x>"}, `{"a":"<x>","b":1}`},
		{[]any{"a", nil, 1.5}, `["a",null,1.5]`},
		{math.Inf(1), "+Inf"},
	}
	for _, tt := range tests {
		if got := formatValue(tt.v); got != tt.want {
			t.Errorf("formatValue(%#v) = %q, want %q", tt.v, got, tt.want)
		}
	}
}
