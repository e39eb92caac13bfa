package spec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ParseDuration accepts the seed's forms: "30s", "5m", "2h", "1d", compound
// Go forms such as "1h30m", and "500ms". Days are not a Go unit, so they are
// handled here; a bare number string is rejected so that the unit is never
// guessed (numbers are only accepted as JSON numbers, where the field decides
// the unit).
func ParseDuration(s string) (time.Duration, error) { return parseDuration(s, false) }

// parseDuration is ParseDuration; stored (reading a version accepted
// before, see Limits.Stored) reads days as any Go float literal, as
// versions stored before days had to be a decimal number were read.
func parseDuration(s string, stored bool) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty duration")
	}
	var total time.Duration
	rest := s
	if i := strings.IndexByte(rest, 'd'); i > 0 {
		// A decimal number, as Go's units take: ParseFloat alone also
		// reads the rest of Go's float literals ("1_0" as 10, "0x1p4" as
		// 16, "1e3"), which "1_0h" or "1e3h" are not.
		if !stored && !decimal(rest[:i]) {
			return 0, fmt.Errorf("invalid duration %q (use forms like 30s, 5m, 2h, 1d)", s)
		}
		days, err := strconv.ParseFloat(rest[:i], 64)
		// !(days < max) also rejects NaN; the bound keeps the conversion
		// below defined (float to int overflow is platform-dependent), and
		// is the one hours have: "106000d" was refused (the bound was half
		// of it) while the same length in hours was taken.
		if err != nil || days < 0 || !(days*float64(24*time.Hour) < float64(math.MaxInt64)) {
			return 0, fmt.Errorf("invalid duration %q (use forms like 30s, 5m, 2h, 1d)", s)
		}
		total = time.Duration(days * float64(24*time.Hour))
		rest = rest[i+1:]
	}
	if rest != "" {
		d, err := time.ParseDuration(rest)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q (use forms like 30s, 5m, 2h, 1d)", s)
		}
		if d < 0 {
			return 0, fmt.Errorf("negative duration %q", s)
		}
		if total > math.MaxInt64-d {
			return 0, fmt.Errorf("invalid duration %q (too long)", s)
		}
		total += d
	}
	if total < 0 {
		return 0, fmt.Errorf("negative duration %q", s)
	}
	return total, nil
}

// decimal tells whether s is an unsigned decimal number, with an optional
// leading '+' and fraction ("1", "1.5", ".5", "1."): what time.ParseDuration
// takes before a unit.
func decimal(s string) bool {
	s = strings.TrimPrefix(s, "+")
	digits := 0
	dot := false
	for _, c := range []byte(s) {
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && !dot:
			dot = true
		default:
			return false
		}
	}
	return digits > 0
}

// durationFromJSON reads a JSON duration: a string with a unit, or a number in
// the given unit (seconds for sleep, milliseconds for an HTTP timeout, as in
// the seed).
func durationFromJSON(raw json.RawMessage, unit time.Duration) (time.Duration, error) {
	return durationJSON(raw, unit, false)
}

// durationJSON is durationFromJSON; stored as for parseDuration.
func durationJSON(raw json.RawMessage, unit time.Duration, stored bool) (time.Duration, error) {
	var n json.Number
	// json.Number also accepts a JSON string holding a number ("30"); such
	// strings must go to ParseDuration, which rejects them, so that the unit
	// is never guessed.
	if t := bytes.TrimSpace(raw); len(t) > 0 && t[0] != '"' && json.Unmarshal(raw, &n) == nil {
		f, err := n.Float64()
		if err != nil || f < 0 || math.IsInf(f, 0) || f*float64(unit) > float64(math.MaxInt64/2) {
			return 0, fmt.Errorf("invalid duration %s", string(raw))
		}
		return time.Duration(f * float64(unit)), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return 0, fmt.Errorf("duration must be a string like \"30s\" or a number")
	}
	return parseDuration(s, stored)
}

// FormatDuration renders a duration the way users write them ("1d", "90s").
func FormatDuration(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	s := d.String()
	// "1m0s" → "1m", "2h0m0s" → "2h": how people write them.
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

const (
	secondUnit      = time.Second
	millisecondUnit = time.Millisecond
	maxHTTPTimeout  = time.Hour
)

// DurationFromJSON reads a duration given as a string with a unit or as a
// number in unit.
func DurationFromJSON(raw json.RawMessage, unit time.Duration) (time.Duration, error) {
	return durationFromJSON(raw, unit)
}
