package expr

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Segment is one step of a Path.
type Segment struct {
	// Name is the segment as written: a field name, or the digits of an
	// index. For Bracket segments it holds the decimal index.
	Name string
	// Index is the array index the segment selects, or -1 when it cannot
	// index an array. A purely numeric dotted segment (items.0) has both a
	// Name and an Index: it indexes arrays and looks up the key "0" in
	// objects.
	Index int
	// Bracket is true for [N]; such a segment never matches object keys.
	Bracket bool
}

// Path is a parsed reference such as tasks.charge.body.items[0].id.
type Path []Segment

// String returns the canonical text of the path, which ParsePath accepts.
func (p Path) String() string {
	var b strings.Builder
	for i, s := range p {
		b.WriteString(s.text(i == 0))
	}
	return b.String()
}

func (s Segment) text(first bool) string {
	if s.Bracket {
		return "[" + strconv.Itoa(s.Index) + "]"
	}
	if first {
		return s.Name
	}
	return "." + s.Name
}

// Names returns one string per segment: the name of dotted segments and
// "[N]" for bracket segments, so Names()[0] is the namespace and Names()[1]
// the step name for tasks.<step> and wait.<step> paths.
func (p Path) Names() []string {
	out := make([]string, len(p))
	for i, s := range p {
		if s.Bracket {
			out[i] = s.text(false)
		} else {
			out[i] = s.Name
		}
	}
	return out
}

// Root returns the namespace (first segment), or "" for an empty path.
func (p Path) Root() string {
	if len(p) == 0 || p[0].Bracket {
		return ""
	}
	return p[0].Name
}

// Step returns the second segment (the step name under tasks and wait), or
// "" when there is none.
func (p Path) Step() string {
	if len(p) < 2 || p[1].Bracket {
		return ""
	}
	return p[1].Name
}

func (p Path) clone() Path {
	return append(Path(nil), p...)
}

// ParsePath parses the text of one path, without braces or surrounding space.
func ParsePath(s string) (Path, error) {
	p, end, err := scanPath(s, 0)
	if err != nil {
		return nil, err
	}
	if end != len(s) {
		return nil, &SyntaxError{Pos: end, Msg: "unexpected " + describeByte(s, end) + " in path", Input: s}
	}
	return p, nil
}

func isSegByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func isPathStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// scanPath reads a path starting at pos and returns it with the offset just
// past it. It stops at the first byte that cannot continue a path; whether
// that byte is acceptable is the caller's business. Hyphens belong to
// segments (step names are hyphenated), which is why the languages here have
// no subtraction.
func scanPath(s string, pos int) (Path, int, *SyntaxError) {
	if pos >= len(s) || !isPathStart(s[pos]) {
		return nil, pos, &SyntaxError{Pos: pos, Msg: "expected a path (letters, digits, '_' or '-', starting with a letter or '_'), found " + describeByte(s, pos), Input: s}
	}
	var p Path
	i := pos
	seg := func() {
		start := i
		for i < len(s) && isSegByte(s[i]) {
			i++
		}
		name := s[start:i]
		idx := -1
		if allDigits(name) {
			if n, err := strconv.Atoi(name); err == nil {
				idx = n
			}
		}
		p = append(p, Segment{Name: name, Index: idx})
	}
	seg()
	for i < len(s) {
		switch s[i] {
		case '.':
			i++
			if i >= len(s) || !isSegByte(s[i]) {
				return nil, i, &SyntaxError{Pos: i, Msg: "expected a name after '.', found " + describeByte(s, i), Input: s}
			}
			seg()
		case '[':
			open := i
			i++
			start := i
			for i < len(s) && isDigit(s[i]) {
				i++
			}
			if i == start {
				return nil, i, &SyntaxError{Pos: i, Msg: "expected an array index like [0], found " + describeByte(s, i), Input: s}
			}
			if i >= len(s) || s[i] != ']' {
				return nil, i, &SyntaxError{Pos: i, Msg: "expected ']' to close '[', found " + describeByte(s, i), Input: s}
			}
			n, err := strconv.Atoi(s[start:i])
			if err != nil {
				return nil, open, &SyntaxError{Pos: open, Msg: "array index too large", Input: s}
			}
			i++
			p = append(p, Segment{Name: strconv.Itoa(n), Index: n, Bracket: true})
		default:
			return p, i, nil
		}
	}
	return p, i, nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// describeByte names what sits at pos for error messages.
func describeByte(s string, pos int) string {
	if pos >= len(s) {
		return "end of input"
	}
	c := s[pos]
	if c >= 0x20 && c < 0x7f {
		return "'" + string(c) + "'"
	}
	if r, size := utf8.DecodeRuneInString(s[pos:]); r != utf8.RuneError || size > 1 {
		return strconv.QuoteRune(r)
	}
	return fmt.Sprintf("byte 0x%02x", c)
}
