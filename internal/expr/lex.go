package expr

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

type tokKind int

const (
	tEOF tokKind = iota
	tPath
	tLiteral // number, string, true, false or null; value in tok.val
	tEq
	tNe
	tGt
	tGe
	tLt
	tLe
	tAnd
	tOr
	tNot
	tLParen
	tRParen
)

var opText = map[tokKind]string{
	tEq: "==", tNe: "!=", tGt: ">", tGe: ">=", tLt: "<", tLe: "<=",
	tAnd: "&&", tOr: "||", tNot: "!", tLParen: "(", tRParen: ")",
}

func (k tokKind) isComparison() bool { return k >= tEq && k <= tLe }

type token struct {
	kind tokKind
	pos  int    // offset in the lexer's text
	text string // source text of the token
	path Path   // for tPath
	val  any    // for tLiteral: nil, bool, string or json.Number
}

// lexer hands out one token at a time so that the first error reported is
// the leftmost one, whether it is lexical or grammatical.
type lexer struct {
	src string
	pos int
	err func(pos int, msg string) *SyntaxError
}

func (l *lexer) next() (token, *SyntaxError) {
	s := l.src
	for l.pos < len(s) && isSpace(s[l.pos]) {
		l.pos++
	}
	start := l.pos
	if start >= len(s) {
		return token{kind: tEOF, pos: start}, nil
	}
	tok := func(k tokKind, n int) (token, *SyntaxError) {
		l.pos += n
		return token{kind: k, pos: start, text: s[start:l.pos]}, nil
	}
	two := func(c byte) bool { return start+1 < len(s) && s[start+1] == c }
	switch c := s[start]; {
	case c == '=' && two('='):
		return tok(tEq, 2)
	case c == '=':
		return token{}, l.err(start, "'=' is not an operator; use '==' to compare")
	case c == '!' && two('='):
		return tok(tNe, 2)
	case c == '!':
		return tok(tNot, 1)
	case c == '>' && two('='):
		return tok(tGe, 2)
	case c == '>':
		return tok(tGt, 1)
	case c == '<' && two('='):
		return tok(tLe, 2)
	case c == '<':
		return tok(tLt, 1)
	case c == '&' && two('&'):
		return tok(tAnd, 2)
	case c == '&':
		return token{}, l.err(start, "use '&&' for 'and'")
	case c == '|' && two('|'):
		return tok(tOr, 2)
	case c == '|':
		return token{}, l.err(start, "use '||' for 'or'")
	case c == '(':
		return tok(tLParen, 1)
	case c == ')':
		return tok(tRParen, 1)
	case c == '\'' || c == '"':
		return l.str()
	case c == '-' || isDigit(c):
		return l.number()
	case c == '{' || c == '}':
		return token{}, l.err(start, "template braces are only allowed around the whole condition; write paths bare, e.g. tasks.charge.status_code == 200")
	case isPathStart(c):
		return l.word()
	}
	return token{}, l.err(start, "unexpected "+describeByte(s, start))
}

func (l *lexer) word() (token, *SyntaxError) {
	start := l.pos
	p, end, err := scanPath(l.src, start)
	if err != nil {
		return token{}, l.err(err.Pos, err.Msg)
	}
	l.pos = end
	t := token{kind: tPath, pos: start, text: l.src[start:end], path: p}
	if len(p) != 1 {
		return t, nil
	}
	switch t.text {
	case "true":
		return token{kind: tLiteral, pos: start, text: t.text, val: true}, nil
	case "false":
		return token{kind: tLiteral, pos: start, text: t.text, val: false}, nil
	case "null":
		return token{kind: tLiteral, pos: start, text: t.text, val: nil}, nil
	}
	// A one-segment path can never resolve, and these are certainly typos
	// that would otherwise silently compare against null.
	switch lower := strings.ToLower(t.text); lower {
	case "true", "false", "null":
		return token{}, l.err(start, "literals are lower case; did you mean '"+lower+"'?")
	}
	return t, nil
}

// number accepts JSON number syntax, so literals mean what they would in a
// body.
func (l *lexer) number() (token, *SyntaxError) {
	s, start := l.src, l.pos
	i := start
	bad := func() (token, *SyntaxError) {
		return token{}, l.err(start, "invalid number")
	}
	digits := func() bool {
		j := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		return i > j
	}
	if s[i] == '-' {
		i++
	}
	if i < len(s) && s[i] == '0' {
		i++
	} else if !digits() {
		return token{}, l.err(start, "expected a number after '-'")
	}
	if i < len(s) && s[i] == '.' {
		i++
		if !digits() {
			return bad()
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return bad()
		}
	}
	if i < len(s) && (isSegByte(s[i]) || s[i] == '.' || s[i] == '[') {
		return bad()
	}
	text := s[start:i]
	if _, err := strconv.ParseFloat(text, 64); err != nil {
		return token{}, l.err(start, "number out of range")
	}
	l.pos = i
	return token{kind: tLiteral, pos: start, text: text, val: json.Number(text)}, nil
}

func (l *lexer) str() (token, *SyntaxError) {
	s, start := l.src, l.pos
	q := s[start]
	var b strings.Builder
	i := start + 1
	for {
		if i >= len(s) {
			return token{}, l.err(start, "unterminated string")
		}
		c := s[i]
		switch {
		case c == q:
			l.pos = i + 1
			return token{kind: tLiteral, pos: start, text: s[start:l.pos], val: b.String()}, nil
		case c != '\\':
			b.WriteByte(c)
			i++
			continue
		}
		if i+1 >= len(s) {
			return token{}, l.err(start, "unterminated string")
		}
		switch e := s[i+1]; e {
		case '\\', '\'', '"', '/':
			b.WriteByte(e)
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			if i+6 > len(s) {
				return token{}, l.err(i, "expected four hex digits after \\u")
			}
			n, err := strconv.ParseUint(s[i+2:i+6], 16, 32)
			if err != nil {
				return token{}, l.err(i, "expected four hex digits after \\u")
			}
			r := rune(n)
			// A UTF-16 surrogate pair, as JSON writes a character past
			// U+FFFF ("\ud83d\ude00"): one character, not two U+FFFD.
			if utf16.IsSurrogate(r) && i+12 <= len(s) && s[i+6] == '\\' && s[i+7] == 'u' {
				if lo, err := strconv.ParseUint(s[i+8:i+12], 16, 32); err == nil {
					if pair := utf16.DecodeRune(r, rune(lo)); pair != utf8.RuneError {
						r = pair
						i += 6
					}
				}
			}
			b.WriteRune(r)
			i += 4
		default:
			return token{}, l.err(i, "unknown escape "+strconv.Quote(s[i:i+2])+" in string")
		}
		i += 2
	}
}

// quote writes s as a single-quoted literal that str reads back as s.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\', '\'':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}
