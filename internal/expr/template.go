package expr

import (
	"sort"
	"strings"
)

// Template is a string with zero or more {{ path }} placeholders. There is
// no escape for a literal "{{": every "{{" opens a placeholder.
type Template struct {
	src   string
	parts []part
}

// part is either literal text or a reference.
type part struct {
	lit   string
	ref   Path
	isRef bool
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// ParseTemplate parses s. Errors are *SyntaxError with Pos a byte offset
// into s.
func ParseTemplate(s string) (*Template, error) {
	t := &Template{src: s}
	i := 0
	for {
		open := strings.Index(s[i:], "{{")
		if open < 0 {
			if i < len(s) {
				t.parts = append(t.parts, part{lit: s[i:]})
			}
			return t, nil
		}
		open += i
		if open > i {
			t.parts = append(t.parts, part{lit: s[i:open]})
		}
		p, end, err := parsePlaceholder(s, open)
		if err != nil {
			return nil, err
		}
		t.parts = append(t.parts, part{ref: p, isRef: true})
		i = end
	}
}

// parsePlaceholder parses "{{ path }}" starting at the "{{" at open and
// returns the offset just past "}}".
func parsePlaceholder(s string, open int) (Path, int, error) {
	// Asking whether "}}" exists only once something is wrong keeps parsing
	// linear in the number of placeholders.
	unclosed := func(err error) error {
		if !strings.Contains(s[open+2:], "}}") {
			return &SyntaxError{Pos: open, Msg: "unclosed '{{'", Input: s}
		}
		return err
	}
	i := open + 2
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	if strings.HasPrefix(s[i:], "}}") {
		return nil, 0, &SyntaxError{Pos: open, Msg: "empty placeholder; write a path such as {{ trigger.body.id }}", Input: s}
	}
	p, end, err := scanPath(s, i)
	if err != nil {
		return nil, 0, unclosed(err)
	}
	for end < len(s) && isSpace(s[end]) {
		end++
	}
	if !strings.HasPrefix(s[end:], "}}") {
		return nil, 0, unclosed(&SyntaxError{Pos: end, Msg: "expected '}}' after the path, found " + describeByte(s, end) + " (a placeholder holds exactly one path)", Input: s})
	}
	return p, end + 2, nil
}

// String returns the source text.
func (t *Template) String() string { return t.src }

// Refs returns the referenced paths in order of appearance.
func (t *Template) Refs() []Path {
	var out []Path
	for _, p := range t.parts {
		if p.isRef {
			out = append(out, p.ref.clone())
		}
	}
	return out
}

// IsSingle reports whether the whole string is one placeholder (spaces
// inside the braces allowed, nothing outside them).
func (t *Template) IsSingle() bool {
	return len(t.parts) == 1 && t.parts[0].isRef
}

// Render resolves the template strictly. A single placeholder yields the
// referenced value itself, so a number stays a number and an object stays an
// object; anything else yields a string in which strings are inserted raw
// and other values as compact JSON (null, true, 200, {"a":1}). The first
// unresolvable reference is returned as a *ResolveError.
func (t *Template) Render(s *Scope) (any, error) {
	if t.IsSingle() {
		return s.Resolve(t.parts[0].ref)
	}
	return t.renderText(s)
}

func (t *Template) renderText(s *Scope) (string, error) {
	var b strings.Builder
	for _, p := range t.parts {
		if !p.isRef {
			b.WriteString(p.lit)
			continue
		}
		v, err := s.resolve(p.ref)
		if err != nil {
			return "", err
		}
		b.WriteString(formatValue(v))
	}
	return b.String(), nil
}

// RenderString renders s to a string, for URLs and header values: string
// values are inserted raw, anything else as its JSON text, even when s is a
// single placeholder.
func RenderString(s string, sc *Scope) (string, error) {
	t, err := ParseTemplate(s)
	if err != nil {
		return "", err
	}
	return t.renderText(sc)
}

// RenderJSON returns a rendered copy of a decoded JSON value: every string
// (map[string]any values, []any elements, or v itself) goes through Render,
// and object keys through RenderString. Other types are returned unchanged.
// Keys are visited in sorted order so the error returned (the first
// *SyntaxError or *ResolveError met) is deterministic; two keys that render
// to the same text are a *DuplicateKeyError. v is never modified.
func RenderJSON(v any, sc *Scope) (any, error) {
	switch x := v.(type) {
	case string:
		t, err := ParseTemplate(x)
		if err != nil {
			return nil, err
		}
		return t.Render(sc)
	case map[string]any:
		out := make(map[string]any, len(x))
		for _, k := range sortedKeys(x) {
			rk, err := RenderString(k, sc)
			if err != nil {
				return nil, err
			}
			if _, dup := out[rk]; dup {
				return nil, &DuplicateKeyError{Key: rk}
			}
			rv, err := RenderJSON(x[k], sc)
			if err != nil {
				return nil, err
			}
			out[rk] = rv
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			r, err := RenderJSON(e, sc)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	}
	return v, nil
}

// TemplateRefs lists the references in every string and object key of a
// decoded JSON value, in the order RenderJSON visits them, or the first
// *SyntaxError.
func TemplateRefs(v any) ([]Path, error) {
	var out []Path
	var visit func(v any) error
	addRefs := func(s string) error {
		t, err := ParseTemplate(s)
		if err != nil {
			return err
		}
		out = append(out, t.Refs()...)
		return nil
	}
	visit = func(v any) error {
		switch x := v.(type) {
		case string:
			return addRefs(x)
		case map[string]any:
			for _, k := range sortedKeys(x) {
				if err := addRefs(k); err != nil {
					return err
				}
				if err := visit(x[k]); err != nil {
					return err
				}
			}
		case []any:
			for _, e := range x {
				if err := visit(e); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := visit(v); err != nil {
		return nil, err
	}
	return out, nil
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
