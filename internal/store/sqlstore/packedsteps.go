package sqlstore

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/ferryhq/ferry/internal/store"
)

// A short run's small steps live in its own row (runs.steps, migration
// 0015) rather than in step_runs: every write of a step also writes its
// run's row (UpdateStep marks the run, for the version cache), so a step
// row was a second row version, and an index entry, for each change of a
// step. Only runs of up to Dialect.RunRowSteps steps keep them there
// (Store.shortRun), and only steps that are packable; the others (a
// webhook wait's callback token, which step_runs_token finds; a large
// output; every step of a longer run) are step_runs rows as before.
// Where a step belongs is a function of its state and its run's step
// count; where it is, is what it was read from (runTx.inRow), and each
// write of the run moves every step where it belongs (flushParts): out
// of the row by an upsert, into it by deleting its step_runs row. Stale
// rows left by earlier builds are ignored, the run row's copy winning
// (mergeSteps). Steps move both ways, so a read outside the run's lock
// reads both places in one snapshot (GetRun).

// stepRowBytes bounds the variable parts of a step kept in the run row
// (request, output, error, headers): a task step's request and a small
// result fit; a large output goes to step_runs, once.
const stepRowBytes = 256

// packable says whether st, a step of a run that is short or not (see
// Store.shortRun), is kept in its run's row. Strings must be
// valid UTF-8 to come back byte for byte from the row's JSON (a step_runs
// row keeps any bytes).
func packable(st *store.StepRun, short bool) bool {
	if !short || st.CallbackToken != "" {
		return false
	}
	n := len(st.Body) + len(st.Request) + len(st.Error)
	for k, v := range st.Headers {
		n += len(k) + len(v) + 6
	}
	if n > stepRowBytes {
		return false
	}
	// NUL too: Postgres's JSON functions (the down migration) refuse it.
	if !utf8.Valid(st.Body) || !utf8.Valid(st.Request) || !utf8.ValidString(st.Error) ||
		bytes.IndexByte(st.Body, 0) >= 0 || bytes.IndexByte(st.Request, 0) >= 0 || strings.IndexByte(st.Error, 0) >= 0 {
		return false
	}
	for k, v := range st.Headers {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return false
		}
	}
	return true
}

// packSteps is the runs.steps value for a run with these steps: a JSON
// array of those in says the row keeps (packedIn), or "" when there is
// none.
//
// When every step of the run is there, the first carries the run's step
// count ("N"): a reader then knows the run has no step_runs row to read
// (a stale one is of a step the row holds, and the row's copy wins).
func packSteps(steps []*store.StepRun, in []bool) string {
	all := !slices.Contains(in, false)
	var b []byte
	for i, st := range steps {
		if !in[i] {
			continue
		}
		count := 0
		if b == nil {
			b = make([]byte, 0, 160*len(steps))
			b = append(b, '[')
			if all {
				count = len(steps)
			}
		} else {
			b = append(b, ',')
		}
		b = appendPackedStep(b, st, count)
	}
	if b == nil {
		return ""
	}
	return ownedString(append(b, ']'))
}

// packedIn says which of a run's steps its row keeps (packable). A step
// that is base's own (not written since) and that base packed is kept
// without checking it again: every write of a step repacks the run's
// other steps, and checking each twice a write (where it goes, what the
// row holds) was ≈4 % of Ferry's CPU in chain10. buf, when long enough,
// is where the answer goes.
func packedIn(steps []*store.StepRun, short bool, base *cachedRun, buf []bool) []bool {
	in := buf[:0]
	if cap(in) < len(steps) {
		in = make([]bool, 0, len(steps))
	}
	for i, st := range steps {
		in = append(in, base.packedForm(i, st) != "" || packable(st, short))
	}
	return in
}

// packedForm is the form e (which may be nil) packed st in, st being the
// i-th of the run's steps, if st is e's own (not written since); else "".
func (e *cachedRun) packedForm(i int, st *store.StepRun) string {
	if e == nil || len(e.packed) != len(e.steps) || i >= len(e.steps) || st != &e.steps[i] {
		return ""
	}
	return e.packed[i]
}

// packedMemoSteps is the fewest steps of a run whose steps' packed forms
// its cache entry keeps: every write of a step rewrites the run's row with
// all its steps, and repacking the nine a chain10 step did not change was
// ≈4 % of Ferry's CPU; a run of one or two steps (a job, a sleeper) has
// little to repack, and a hundred thousand of them asleep would hold the
// forms in memory for nothing.
const packedMemoSteps = 4

// packStepsMemo is packSteps for a run whose steps' forms base (its
// cache entry, if any: the one packedIn was given for in) may hold: a
// step that is base's own (not written since) is taken as base packed
// it. forms are every step's form, "" for one not in the row, for the
// run's next cache entry (nil for a run of fewer than packedMemoSteps
// steps).
func packStepsMemo(steps []*store.StepRun, in []bool, base *cachedRun) (string, []string) {
	if len(steps) < packedMemoSteps {
		return packSteps(steps, in), nil
	}
	forms := make([]string, len(steps))
	all, n, size := true, 0, 2
	for i, st := range steps {
		if !in[i] {
			all = false
			continue
		}
		if forms[i] = base.packedForm(i, st); forms[i] == "" {
			forms[i] = ownedString(appendPackedStep(make([]byte, 0, packedSize(st)), st, 0))
		}
		n++
		size += len(forms[i]) + 1
	}
	if n == 0 {
		return "", forms
	}
	b := make([]byte, 0, size+16)
	b = append(b, '[')
	first := true
	for _, f := range forms {
		if f == "" {
			continue
		}
		if !first {
			b = append(b, ',')
		} else if all {
			// The first carries the run's step count (see packSteps).
			b = append(b, `{"N":`...)
			b = strconv.AppendInt(b, int64(len(steps)), 10)
			b = append(b, ',')
			f = f[1:]
		}
		first = false
		b = append(b, f...)
	}
	return ownedString(append(b, ']')), forms
}

// ownedString is b as a string without a copy. b must be the caller's
// own and never written again. A run's packed steps are built once a
// write, ≈2 KB for ten steps: the copy was ≈2 KB of the ≈25 KB a chain10
// step allocated, and 0.7 of the 2.3 µs BenchmarkPackChainStep took.
func ownedString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// packedSize is about the bytes appendPackedStep writes for st, a little
// more when its texts need few escapes: a step's form packed on its own
// (packStepsMemo) is then one allocation, where growing it from nothing
// was four, a copy into a string included.
func packedSize(st *store.StepRun) int {
	n := 160 + len(st.Name) + len(st.Type) + len(st.Status) + len(st.Error)
	n += len(st.Request) + len(st.Request)/4 + len(st.Body) + len(st.Body)/4
	if st.Headers != nil {
		for k, v := range st.Headers {
			n += len(k) + len(v) + 8
		}
	}
	return n
}

// appendPackedStep appends st as the run row holds it (see packedStep),
// with what a step_runs row would keep of it: an empty request or body
// is no request or body. A count above zero is written as "N".
func appendPackedStep(b []byte, st *store.StepRun, count int) []byte {
	b = append(b, '{')
	if count > 0 {
		b = append(b, `"N":`...)
		b = strconv.AppendInt(b, int64(count), 10)
		b = append(b, ',')
	}
	b = append(b, `"n":`...)
	b = appendEscaped(b, st.Name)
	b = append(b, `,"p":`...)
	b = strconv.AppendInt(b, int64(st.Position), 10)
	b = append(b, `,"t":`...)
	b = appendEscaped(b, st.Type)
	b = append(b, `,"s":`...)
	b = appendEscaped(b, st.Status)
	if st.Attempt != 0 {
		b = append(b, `,"a":`...)
		b = strconv.AppendInt(b, int64(st.Attempt), 10)
	}
	if st.StatusCode != nil {
		b = append(b, `,"c":`...)
		b = strconv.AppendInt(b, int64(*st.StatusCode), 10)
	}
	if st.DurationMS != nil {
		b = append(b, `,"d":`...)
		b = strconv.AppendInt(b, *st.DurationMS, 10)
	}
	if len(st.Request) > 0 {
		b = append(b, `,"q":`...)
		b = appendEscaped(b, st.Request)
	}
	if len(st.Body) > 0 {
		b = append(b, `,"b":`...)
		b = appendEscaped(b, st.Body)
	}
	if st.Headers != nil {
		h, _ := json.Marshal(st.Headers) // a map of strings always encodes
		b = append(b, `,"h":`...)
		b = append(b, h...)
	}
	if st.Truncated {
		b = append(b, `,"x":true`...)
	}
	if st.Blocked {
		b = append(b, `,"l":true`...)
	}
	if st.Error != "" {
		b = append(b, `,"e":`...)
		b = appendEscaped(b, st.Error)
	}
	b = appendPackedTime(b, `,"w":`, st.WakeAt)
	b = appendPackedTime(b, `,"r":`, st.StartedAt)
	b = appendPackedTime(b, `,"f":`, st.FinishedAt)
	return append(b, '}')
}

func appendPackedTime(b []byte, key string, t *time.Time) []byte {
	if t == nil {
		return b
	}
	b = append(b, key...)
	return strconv.AppendInt(b, ts(*t), 10)
}

// appendEscaped appends s, valid UTF-8, as a JSON string that decodes to
// it: only what JSON requires is escaped (the quote, the backslash and
// control characters). Unlike appendJSONString it need not match
// encoding/json's bytes, and a step's request is JSON full of quotes,
// which sent that one to encoding/json every time (two thirds of
// packSteps' time in chain10).
//
// A step's request and body are bytes: taken as they are rather than
// through a string, which copied each.
func appendEscaped[T ~string | ~[]byte](b []byte, s T) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// packedStep is one step of runs.steps, as encoding/json reads it (the
// fallback of unpackSteps).
type packedStep struct {
	Count      int             `json:"N"`
	Name       string          `json:"n"`
	Position   int             `json:"p"`
	Type       string          `json:"t"`
	Status     string          `json:"s"`
	Attempt    int             `json:"a"`
	StatusCode *int            `json:"c"`
	DurationMS *int64          `json:"d"`
	Request    *string         `json:"q"`
	Body       *string         `json:"b"`
	Headers    json.RawMessage `json:"h"`
	Truncated  bool            `json:"x"`
	Blocked    bool            `json:"l"`
	Error      string          `json:"e"`
	WakeAt     *int64          `json:"w"`
	StartedAt  *int64          `json:"r"`
	FinishedAt *int64          `json:"f"`
}

// unpackSteps reads a runs.steps value: the run's steps kept in its row,
// as scanStep would have read them from step_runs, and whether they are
// all of the run's steps (see packSteps).
func unpackSteps(runID, packed string) ([]*store.StepRun, bool, error) {
	if packed == "" {
		return nil, false, nil
	}
	out, count, ok := parsePacked(runID, packed)
	if !ok {
		var err error
		if out, count, err = decodePacked(runID, packed); err != nil {
			return nil, false, err
		}
	}
	slices.SortStableFunc(out, byPosition)
	return out, count > 0 && count == len(out), nil
}

// decodePacked is unpackSteps through encoding/json: for what parsePacked
// does not take (escapes appendEscaped does not write; headers).
func decodePacked(runID, packed string) ([]*store.StepRun, int, error) {
	var ps []packedStep
	if err := json.Unmarshal([]byte(packed), &ps); err != nil {
		return nil, 0, fmt.Errorf("run %s: decode steps: %w", runID, err)
	}
	out := make([]*store.StepRun, len(ps))
	sts := make([]store.StepRun, len(ps))
	count := 0
	for i, p := range ps {
		st := &sts[i]
		count = max(count, p.Count)
		st.RunID, st.Name, st.Position, st.Type, st.Status, st.Attempt = runID, p.Name, p.Position, p.Type, p.Status, p.Attempt
		st.StatusCode, st.DurationMS = p.StatusCode, p.DurationMS
		if p.Request != nil {
			st.Request = json.RawMessage(*p.Request)
		}
		if p.Body != nil {
			st.Body = []byte(*p.Body)
		}
		if p.Headers != nil {
			if err := json.Unmarshal(p.Headers, &st.Headers); err != nil {
				return nil, 0, fmt.Errorf("run %s: decode step headers: %w", runID, err)
			}
		}
		st.Truncated, st.Blocked, st.Error = p.Truncated, p.Blocked, p.Error
		st.WakeAt, st.StartedAt, st.FinishedAt = packedTime(p.WakeAt), packedTime(p.StartedAt), packedTime(p.FinishedAt)
		out[i] = st
	}
	return out, count, nil
}

// parsePacked reads what appendPackedStep writes, without reflection
// (encoding/json was 4 % of Ferry's CPU in the jobs workload, reading the
// runs the version cache no longer held); anything else — an escape it
// does not write, headers, a key it does not know — reports false, and
// encoding/json reads the value instead.
func parsePacked(runID, s string) (out []*store.StepRun, count int, ok bool) {
	p := packedParser{s: s}
	if !p.byte('[') {
		return nil, 0, false
	}
	sts := make([]store.StepRun, 0, strings.Count(s, `"n":`))
	for {
		if !p.byte('{') {
			return nil, 0, false
		}
		sts = append(sts, store.StepRun{RunID: runID})
		st := &sts[len(sts)-1]
		for {
			key, ok := p.str()
			if !ok || len(key) != 1 || !p.byte(':') || !p.field(st, key[0], &count) {
				return nil, 0, false
			}
			if p.byte('}') {
				break
			}
			if !p.byte(',') {
				return nil, 0, false
			}
		}
		if p.byte(']') {
			break
		}
		if !p.byte(',') {
			return nil, 0, false
		}
	}
	if p.i != len(s) {
		return nil, 0, false
	}
	out = make([]*store.StepRun, len(sts))
	for i := range sts {
		out[i] = &sts[i]
	}
	return out, count, true
}

// field reads the value of st's field named key (count for "N"); it
// reports false for headers and keys appendPackedStep does not write.
func (p *packedParser) field(st *store.StepRun, key byte, count *int) bool {
	switch key {
	case 'n':
		return p.strTo(&st.Name)
	case 't':
		return p.strTo(&st.Type)
	case 's':
		return p.strTo(&st.Status)
	case 'e':
		return p.strTo(&st.Error)
	case 'q':
		v, ok := p.str()
		st.Request = json.RawMessage(v)
		return ok
	case 'b':
		v, ok := p.str()
		st.Body = []byte(v)
		return ok
	case 'x':
		return p.isTrue(&st.Truncated)
	case 'l':
		return p.isTrue(&st.Blocked)
	}
	v, ok := p.int()
	switch key {
	case 'N':
		*count = int(v)
	case 'p':
		st.Position = int(v)
	case 'a':
		st.Attempt = int(v)
	case 'c':
		c := int(v)
		st.StatusCode = &c
	case 'd':
		st.DurationMS = &v
	case 'w':
		st.WakeAt = packedTime(&v)
	case 'r':
		st.StartedAt = packedTime(&v)
	case 'f':
		st.FinishedAt = packedTime(&v)
	default: // headers, or a key this reader does not know
		return false
	}
	return ok
}

func (p *packedParser) strTo(dst *string) bool {
	v, ok := p.str()
	*dst = v
	return ok
}

// isTrue reads true, the only boolean appendPackedStep writes.
func (p *packedParser) isTrue(dst *bool) bool {
	if !strings.HasPrefix(p.s[p.i:], "true") {
		return false
	}
	p.i += 4
	*dst = true
	return true
}

// packedParser walks a runs.steps value as appendPackedStep writes it:
// no whitespace.
type packedParser struct {
	s string
	i int
}

func (p *packedParser) byte(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str reads a string with the escapes appendEscaped writes.
func (p *packedParser) str() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case '"':
			v := p.s[start:p.i]
			p.i++
			return v, true
		case '\\':
			return p.escaped(start)
		}
		p.i++
	}
	return "", false
}

// escaped finishes a string from start whose first escape is at p.i.
func (p *packedParser) escaped(start int) (string, bool) {
	b := make([]byte, 0, 2*(p.i-start)+16)
	b = append(b, p.s[start:p.i]...)
	for p.i < len(p.s) {
		j := strings.IndexAny(p.s[p.i:], `"\\`)
		if j < 0 {
			return "", false
		}
		b = append(b, p.s[p.i:p.i+j]...)
		p.i += j
		if p.s[p.i] == '"' {
			p.i++
			return string(b), true
		}
		if p.i+1 >= len(p.s) {
			return "", false
		}
		switch e := p.s[p.i+1]; e {
		case '"', '\\':
			b = append(b, e)
			p.i += 2
		case 'n':
			b = append(b, '\n')
			p.i += 2
		case 'u':
			// appendEscaped writes \u00XX for control characters only.
			if p.i+6 > len(p.s) || p.s[p.i+2:p.i+4] != "00" {
				return "", false
			}
			v, err := strconv.ParseUint(p.s[p.i+4:p.i+6], 16, 8)
			if err != nil || v >= 0x20 {
				return "", false
			}
			b = append(b, byte(v))
			p.i += 6
		default:
			return "", false
		}
	}
	return "", false
}

func (p *packedParser) int() (int64, bool) {
	start := p.i
	if p.i < len(p.s) && p.s[p.i] == '-' {
		p.i++
	}
	for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		p.i++
	}
	v, err := strconv.ParseInt(p.s[start:p.i], 10, 64)
	return v, err == nil
}

func byPosition(a, b *store.StepRun) int { return cmp.Compare(a.Position, b.Position) }

func packedTime(v *int64) *time.Time {
	if v == nil {
		return nil
	}
	t := fromTS(*v)
	return &t
}

// mergeSteps is a run's steps in position order from its step_runs rows
// and the steps its row holds; a step in both is the row's (the step_runs
// row is what it was before it became packable again).
func mergeSteps(rows, packed []*store.StepRun) []*store.StepRun {
	if len(packed) == 0 {
		return rows
	}
	if len(rows) == 0 {
		return packed
	}
	out := slices.Clone(packed)
	for _, r := range rows {
		if !slices.ContainsFunc(packed, func(p *store.StepRun) bool { return p.Name == r.Name }) {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, byPosition)
	return out
}
