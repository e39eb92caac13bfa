package httpstep

import (
	"net/http"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"3", 3 * time.Second},
		{" 120 ", 2 * time.Minute},
		{"0", 0},
		{"-5", 0},
		{"1.5", 0},
		{"soon", 0},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{"Sat, 01 Mar 2025 12:00:30 GMT", 30 * time.Second},
		{"Saturday, 01-Mar-25 12:00:30 GMT", 30 * time.Second}, // RFC 850
		{"99999999999999999999", 0},                            // not an int64: ignored
		{"9223372036854775807", time.Duration(9223372036) * time.Second},
	}
	for _, tc := range tests {
		if got := parseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
