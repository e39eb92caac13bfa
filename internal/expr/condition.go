package expr

import (
	"encoding/json"
	"strings"
)

// maxDepth bounds nesting of '(' and '!' so hostile definitions cannot
// exhaust the stack.
const maxDepth = 100

// Condition is a parsed "if" expression.
type Condition struct {
	src  string
	root node
	refs []Path
}

// ParseCondition parses s using the grammar
//
//	or    := and ('||' and)*
//	and   := unary ('&&' unary)*
//	unary := '!' unary | '(' or ')' | cmp
//	cmp   := operand (('=='|'!='|'>'|'>='|'<'|'<=') operand)?
//
// where an operand is a bare path or a literal (JSON number, single- or
// double-quoted string, true, false, null). A condition wrapped entirely in
// {{ }} is accepted as if the braces were absent. Errors are *SyntaxError
// with Pos a byte offset into s.
func ParseCondition(s string) (*Condition, error) {
	body, off := unwrap(s)
	p := &parser{}
	p.lex = lexer{src: body, err: func(pos int, msg string) *SyntaxError {
		return &SyntaxError{Pos: pos + off, Msg: msg, Input: s}
	}}
	if strings.TrimLeft(body, " \t\r\n") == "" {
		return nil, p.lex.err(len(body), "empty condition")
	}
	if err := p.advance(); err != nil {
		return nil, err
	}
	root, err := p.or()
	if err != nil {
		return nil, err
	}
	if p.tok.kind != tEOF {
		return nil, p.unexpected("end of expression")
	}
	return &Condition{src: s, root: root, refs: p.refs}, nil
}

// unwrap strips one pair of {{ }} enclosing the whole condition, returning
// the inside and its offset in s.
func unwrap(s string) (string, int) {
	start, end := 0, len(s)
	for start < end && isSpace(s[start]) {
		start++
	}
	for end > start && isSpace(s[end-1]) {
		end--
	}
	t := s[start:end]
	if len(t) < 4 || !strings.HasPrefix(t, "{{") || !strings.HasSuffix(t, "}}") {
		return s, 0
	}
	inner := t[2 : len(t)-2]
	if strings.Contains(inner, "{{") || strings.Contains(inner, "}}") {
		// {{ a }} == {{ b }} is not one wrapped condition; let the lexer
		// explain.
		return s, 0
	}
	return inner, start + 2
}

// String returns the source text as given to ParseCondition.
func (c *Condition) String() string { return c.src }

// Refs returns the paths the condition reads, in order of appearance.
func (c *Condition) Refs() []Path {
	out := make([]Path, len(c.refs))
	for i, r := range c.refs {
		out[i] = r.clone()
	}
	return out
}

// Eval evaluates the condition with lenient lookups: missing values are
// null. It never fails.
func (c *Condition) Eval(s *Scope) bool { return c.root.eval(s) }

// canonical is a fully parenthesised rendering that parses back to the same
// tree; the fuzz tests rely on it.
func (c *Condition) canonical() string { return c.root.String() }

type parser struct {
	lex   lexer
	tok   token
	depth int
	refs  []Path
}

func (p *parser) advance() error {
	t, err := p.lex.next()
	if err != nil {
		return err
	}
	p.tok = t
	return nil
}

func (p *parser) or() (node, error) {
	l, err := p.and()
	if err != nil {
		return nil, err
	}
	for p.tok.kind == tOr {
		if err := p.advance(); err != nil {
			return nil, err
		}
		r, err := p.and()
		if err != nil {
			return nil, err
		}
		l = &binNode{op: tOr, l: l, r: r}
	}
	return l, nil
}

func (p *parser) and() (node, error) {
	l, err := p.unary()
	if err != nil {
		return nil, err
	}
	for p.tok.kind == tAnd {
		if err := p.advance(); err != nil {
			return nil, err
		}
		r, err := p.unary()
		if err != nil {
			return nil, err
		}
		l = &binNode{op: tAnd, l: l, r: r}
	}
	return l, nil
}

func (p *parser) unary() (node, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxDepth {
		return nil, p.lex.err(p.tok.pos, "expression nested too deeply")
	}
	switch p.tok.kind {
	case tNot:
		if err := p.advance(); err != nil {
			return nil, err
		}
		x, err := p.unary()
		if err != nil {
			return nil, err
		}
		return &notNode{x: x}, nil
	case tLParen:
		open := p.tok.pos
		if err := p.advance(); err != nil {
			return nil, err
		}
		x, err := p.or()
		if err != nil {
			return nil, err
		}
		if p.tok.kind != tRParen {
			if p.tok.kind == tEOF {
				return nil, p.lex.err(open, "unclosed '('")
			}
			return nil, p.unexpected("')'")
		}
		if err := p.advance(); err != nil {
			return nil, err
		}
		return x, nil
	}
	return p.cmp()
}

func (p *parser) cmp() (node, error) {
	l, err := p.operand()
	if err != nil {
		return nil, err
	}
	if !p.tok.kind.isComparison() {
		return &truthNode{x: l}, nil
	}
	op := p.tok.kind
	if err := p.advance(); err != nil {
		return nil, err
	}
	r, err := p.operand()
	if err != nil {
		return nil, err
	}
	if p.tok.kind.isComparison() {
		return nil, p.lex.err(p.tok.pos, "comparisons cannot be chained; combine them with && or ||")
	}
	return &cmpNode{op: op, l: l, r: r}, nil
}

func (p *parser) operand() (operand, error) {
	t := p.tok
	switch t.kind {
	case tPath:
		p.refs = append(p.refs, t.path)
		if err := p.advance(); err != nil {
			return operand{}, err
		}
		return operand{path: t.path, isPath: true}, nil
	case tLiteral:
		if err := p.advance(); err != nil {
			return operand{}, err
		}
		return operand{val: t.val}, nil
	case tEOF:
		return operand{}, p.lex.err(t.pos, "unexpected end of expression; expected a path, a literal, '!' or '('")
	}
	return operand{}, p.lex.err(t.pos, "expected a path, a literal, '!' or '(', found '"+t.text+"'")
}

// unexpected explains a token that cannot follow a complete operand or
// comparison, with hints for habits from other languages.
func (p *parser) unexpected(want string) error {
	t := p.tok
	msg := "expected operator or " + want
	if t.kind == tPath {
		switch strings.ToLower(t.text) {
		case "and":
			msg += "; use '&&' for 'and'"
		case "or":
			msg += "; use '||' for 'or'"
		}
	}
	return p.lex.err(t.pos, msg)
}

type node interface {
	eval(s *Scope) bool
	String() string
}

type binNode struct {
	op   tokKind // tAnd or tOr
	l, r node
}

func (n *binNode) eval(s *Scope) bool {
	if n.op == tAnd {
		return n.l.eval(s) && n.r.eval(s)
	}
	return n.l.eval(s) || n.r.eval(s)
}

func (n *binNode) String() string {
	return "(" + n.l.String() + " " + opText[n.op] + " " + n.r.String() + ")"
}

type notNode struct{ x node }

func (n *notNode) eval(s *Scope) bool { return !n.x.eval(s) }
func (n *notNode) String() string     { return "!" + n.x.String() }

type truthNode struct{ x operand }

func (n *truthNode) eval(s *Scope) bool { return truthy(n.x.value(s)) }
func (n *truthNode) String() string     { return n.x.String() }

type cmpNode struct {
	op   tokKind
	l, r operand
}

func (n *cmpNode) eval(s *Scope) bool {
	a, b := n.l.value(s), n.r.value(s)
	switch n.op {
	case tEq:
		return equal(a, b)
	case tNe:
		return !equal(a, b)
	}
	c, ok := order(a, b)
	if !ok {
		return false
	}
	switch n.op {
	case tGt:
		return c > 0
	case tGe:
		return c >= 0
	case tLt:
		return c < 0
	}
	return c <= 0
}

func (n *cmpNode) String() string {
	return n.l.String() + " " + opText[n.op] + " " + n.r.String()
}

type operand struct {
	path   Path
	isPath bool
	val    any // literal: nil, bool, string or json.Number
}

func (o operand) value(s *Scope) any {
	if o.isPath {
		return s.Lookup(o.path)
	}
	return o.val
}

func (o operand) String() string {
	if o.isPath {
		return o.path.String()
	}
	switch v := o.val.(type) {
	case nil:
		return "null"
	case bool:
		if v {
			return "true"
		}
		return "false"
	case string:
		return quote(v)
	case json.Number:
		return string(v)
	}
	return "null"
}
