package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/lexer"
	"github.com/goccy/go-yaml/token"
	"github.com/google/uuid"
	"golang.org/x/net/http/httpguts"
)

var (
	workflowNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
	// Step names appear inside dotted paths (tasks.<name>.body), so they may
	// hold hyphens but never dots.
	stepNameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$`)
	methods    = map[string]bool{"GET": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "HEAD": true, "OPTIONS": true}
)

// member is one key of a JSON object, in document order.
type member struct {
	Key   string
	Value json.RawMessage
}

// objectMembers decodes a JSON object keeping key order, which encoding/json
// maps lose; step order is meaningful to users.
func objectMembers(raw json.RawMessage) ([]member, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var out []member
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		out = append(out, member{kt.(string), v})
	}
	return out, true
}

// Optional settings given as JSON null mean what leaving them out means,
// the default (docs/api.md, Requests and responses): a YAML key with no
// value is null. Payloads (body, task.payload) are not settings: null is
// their value. A null "if" is no condition, as the seed's DAG format
// says (null or omitted, the step runs unconditionally); an empty one is
// refused, so that no one means a condition and gets none.
var (
	nullTopDefaults  = map[string]bool{"description": true, "trigger": true, "max_duration": true, "enabled": true}
	nullStepDefaults = map[string]bool{"needs": true, "if": true, "method": true, "headers": true, "retries": true, "retry_delay": true, "timeout": true}
)

// isNull tells whether a member's value is JSON null.
func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// nullDefault tells whether the member key: raw is a null setting to read
// as left out. Versions stored when a null retries or priority was read
// as 0 (0 retries, or the first of priorities) read as they were, so
// their runs go on as they started.
func (c *collector) nullDefault(defaults map[string]bool, key string, raw json.RawMessage) bool {
	if !defaults[key] || !isNull(raw) {
		return false
	}
	return !(c.stored && (key == "retries" || key == "priority"))
}

// isStepPath tells whether path names a step ("tasks.<name>").
func isStepPath(path string) bool {
	name, ok := strings.CutPrefix(path, "tasks.")
	return ok && !strings.ContainsAny(name, ".[")
}

// duplicateKeys are the paths of the keys given twice in one object of
// the JSON document js (valid), each once, in document order.
func duplicateKeys(js []byte) []string {
	var out []string
	type level struct {
		keys      map[string]bool // nil: an array
		path      string
		index     int    // an array's next element
		key       string // an object's last key
		expectKey bool
	}
	var stack []*level
	// child is the path of the value the level on top is at.
	child := func() string {
		if len(stack) == 0 {
			return ""
		}
		l := stack[len(stack)-1]
		if l.keys == nil {
			return fmt.Sprintf("%s[%d]", l.path, l.index)
		}
		if l.path == "" {
			return l.key
		}
		return l.path + "." + l.key
	}
	// done ends a value of the level on top.
	done := func() {
		if len(stack) == 0 {
			return
		}
		if l := stack[len(stack)-1]; l.keys == nil {
			l.index++
		} else {
			l.expectKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	for {
		tok, err := dec.Token()
		if err != nil {
			return out // the end of the document
		}
		if len(stack) > 0 {
			if l := stack[len(stack)-1]; l.keys != nil && l.expectKey {
				if k, ok := tok.(string); ok {
					l.key, l.expectKey = k, false
					if seen, dup := l.keys[k]; dup && !seen {
						out = append(out, child())
						l.keys[k] = true // told once
					} else if !dup {
						l.keys[k] = false
					}
					continue
				}
			}
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			l := &level{path: child(), expectKey: true}
			if tok == json.Delim('{') {
				l.keys = map[string]bool{}
			}
			stack = append(stack, l)
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			done()
		default:
			done()
		}
	}
}

// ToJSON converts a YAML or JSON document to JSON. JSON is returned as is;
// anything else is read as YAML.
func ToJSON(doc []byte) ([]byte, error) {
	// A byte-order mark is no part of the text (editors on Windows write
	// one); left, it made JSON "not an object" and a YAML key "\ufeffname".
	doc = bytes.TrimPrefix(doc, []byte("\ufeff"))
	trimmed := bytes.TrimSpace(doc)
	// JSON is returned as it is. What starts like JSON but is not may be
	// YAML's flow style ({name: a, tasks: {…}}): read as YAML if it is
	// YAML, else left to the JSON parser to say what is wrong with it.
	if len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[') {
		if json.Valid(trimmed) {
			return trimmed, nil
		}
		if y, err := yamlToJSON(doc); err == nil {
			return y, nil
		}
		return trimmed, nil
	}
	return yamlToJSON(doc)
}

// yamlToJSON converts a YAML document to JSON, bounded (see ToJSON).
func yamlToJSON(doc []byte) ([]byte, error) {
	// The YAML parser's work grows with the square of how deeply
	// collections nest ("[[[[…", "- - - -…"): a definition of 250 KB took
	// 24 GB.
	tokens := lexer.Tokenize(string(doc))
	if yamlNesting(tokens) > MaxYAMLNesting {
		return nil, fmt.Errorf("invalid YAML: collections nested more than %d levels deep", MaxYAMLNesting)
	}
	// The decoder reads the first document of a stream and drops the
	// rest: a definition is one document, not a first one that counts.
	if n := yamlDocuments(tokens); n > 1 {
		return nil, fmt.Errorf("invalid YAML: the file holds %d documents (separated by ---); a definition is one", n)
	}
	// This is yaml.YAMLToJSON with a bound in the middle: aliases let a
	// document of a few hundred bytes expand to gigabytes of JSON ("billion
	// laughs"), so the decoded value, in which aliases are shared, is
	// measured before it is encoded.
	var v any
	if err := yaml.UnmarshalWithOptions(doc, &v, yaml.UseOrderedMap()); err != nil {
		return nil, fmt.Errorf("invalid YAML: %w", err)
	}
	if limit := 8*len(doc) + 1<<20; !yamlWithin(v, &limit) {
		return nil, fmt.Errorf("invalid YAML: aliases expand the document beyond %d bytes", 8*len(doc)+1<<20)
	}
	if at, ok := nonFinite(v, ""); ok {
		return nil, &ValueError{Path: at, Msg: "is .inf or .nan, a number JSON cannot hold"}
	}
	out, err := yaml.MarshalWithOptions(v, yaml.JSON())
	if err != nil {
		return nil, fmt.Errorf("invalid YAML: %w", err)
	}
	return goEscapesToJSON(out), nil
}

// goEscapesToJSON rewrites the escapes the YAML encoder writes in its JSON
// strings (it quotes them with strconv.Quote) that JSON does not have:
// \a, \v, \xHH and \UHHHHHHHH. Without it, a YAML string holding a
// control character ("\e[1m", "\0", a raw DEL) came out as text that is
// not JSON, and a valid definition was refused as invalid JSON.
func goEscapesToJSON(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\`)) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == '"':
			inString = !inString
		case c == '\\' && inString && i+1 < len(b):
			hexAt := func(from, n int) (rune, bool) {
				if from+n > len(b) {
					return 0, false
				}
				var r rune
				for _, h := range b[from : from+n] {
					switch {
					case '0' <= h && h <= '9':
						r = r<<4 | rune(h-'0')
					case 'a' <= h && h <= 'f':
						r = r<<4 | rune(h-'a'+10)
					case 'A' <= h && h <= 'F':
						r = r<<4 | rune(h-'A'+10)
					default:
						return 0, false
					}
				}
				return r, true
			}
			switch b[i+1] {
			case 'a':
				out = append(out, `\u0007`...)
				i++
				continue
			case 'v':
				out = append(out, `\u000b`...)
				i++
				continue
			case 'x':
				if r, ok := hexAt(i+2, 2); ok {
					if r >= utf8.RuneSelf {
						r = utf8.RuneError // a byte that is not UTF-8 (the input is)
					}
					out = fmt.Appendf(out, `\u%04x`, r)
					i += 3
					continue
				}
			case 'U':
				if r, ok := hexAt(i+2, 8); ok {
					if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
						out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
					} else {
						out = fmt.Appendf(out, `\u%04x`, r)
					}
					i += 9
					continue
				}
			}
			// A JSON escape (\", \\, \n, \uHHHH…): kept.
			out = append(out, c, b[i+1])
			i++
			continue
		}
		out = append(out, c)
	}
	return out
}

// yamlDocuments counts the documents in a stream's tokens: each "---",
// and content that no "---" opened (the first document's, or any after a
// "...").
func yamlDocuments(tokens token.Tokens) int {
	docs, open := 0, false
	directive := -1 // the line of a directive ("%YAML 1.2"): its words are not content
	for _, tk := range tokens {
		line := -2
		if tk.Position != nil {
			line = tk.Position.Line
		}
		switch {
		case tk.Type == token.DirectiveType:
			directive = line
			continue
		case line == directive:
			continue
		}
		switch tk.Type {
		case token.CommentType:
		case token.DocumentHeaderType:
			docs, open = docs+1, true
		case token.DocumentEndType:
			open = false
		default:
			if !open {
				docs, open = docs+1, true
			}
		}
	}
	return docs
}

// ValueError is a YAML value with no JSON form, at Path in the document.
type ValueError struct{ Path, Msg string }

func (e *ValueError) Error() string { return "invalid YAML: " + e.Path + " " + e.Msg }

// nonFinite is the path (under at) of the first infinite or NaN number
// in a decoded YAML value, which its JSON form would not hold.
func nonFinite(v any, at string) (string, bool) {
	under := func(k string) string {
		if at == "" {
			return k
		}
		return at + "." + k
	}
	switch x := v.(type) {
	case float64:
		return at, math.IsNaN(x) || math.IsInf(x, 0)
	case float32:
		return nonFinite(float64(x), at)
	case yaml.MapSlice:
		for _, it := range x {
			if p, ok := nonFinite(it.Value, under(fmt.Sprint(it.Key))); ok {
				return p, true
			}
		}
	case map[string]any:
		for k, e := range x {
			if p, ok := nonFinite(e, under(k)); ok {
				return p, true
			}
		}
	case []any:
		for i, e := range x {
			if p, ok := nonFinite(e, fmt.Sprintf("%s[%d]", at, i)); ok {
				return p, true
			}
		}
	}
	return "", false
}

// MaxYAMLNesting bounds how deeply a YAML definition's collections nest
// where nesting is cheap to write: flow collections ([…] and {…}) and
// block entries on one line ("- - - x", "? ? x"). Nesting by indentation
// costs the square of its depth in bytes, so the size limit bounds it.
const MaxYAMLNesting = 100

// yamlNesting is the deepest such nesting in a document's tokens, as the
// YAML parser's own lexer reads them (so quotes, comments and block
// scalars count as the parser counts them); it stops counting past
// MaxYAMLNesting.
func yamlNesting(tokens token.Tokens) int {
	depth, deepest := 0, 0
	line, run := -1, 0
	for _, tk := range tokens {
		switch tk.Type {
		case token.SequenceStartType, token.MappingStartType:
			depth++
			deepest = max(deepest, depth)
		case token.SequenceEndType, token.MappingEndType:
			depth = max(depth-1, 0)
		case token.SequenceEntryType, token.MappingKeyType:
			if tk.Position != nil && tk.Position.Line == line {
				run++
			} else {
				line, run = -1, 1
				if tk.Position != nil {
					line = tk.Position.Line
				}
			}
			deepest = max(deepest, depth+run)
		}
		if deepest > MaxYAMLNesting {
			break
		}
	}
	return deepest
}

// yamlWithin subtracts a rough JSON size of v from *budget and reports
// whether it stayed positive; it stops early, so its cost is bounded by the
// budget and not by the expanded size.
func yamlWithin(v any, budget *int) bool {
	*budget -= 8
	if *budget < 0 {
		return false
	}
	switch x := v.(type) {
	case string:
		*budget -= len(x)
	case yaml.MapSlice:
		for _, it := range x {
			if !yamlWithin(it.Key, budget) || !yamlWithin(it.Value, budget) {
				return false
			}
		}
	case []any:
		for _, e := range x {
			if !yamlWithin(e, budget) {
				return false
			}
		}
	case map[string]any:
		for k, e := range x {
			*budget -= len(k)
			if !yamlWithin(e, budget) {
				return false
			}
		}
	}
	return *budget >= 0
}

// Parse reads and validates a definition (JSON or YAML). On failure the error
// is a *ValidationError listing every problem.
func Parse(doc []byte, lim Limits) (*Workflow, error) {
	c := &collector{stored: lim.Stored}
	if lim.MaxBytes > 0 && len(doc) > lim.MaxBytes {
		c.add("", CodeTooLarge, "definition is larger than the %d-byte limit", lim.MaxBytes)
		return nil, c.err()
	}
	if !lim.Stored && !utf8.Valid(doc) {
		c.add("", CodeInvalidJSON, "a definition must be UTF-8 text")
		return nil, c.err()
	}
	js, err := ToJSON(doc)
	if ve := (*ValueError)(nil); errors.As(err, &ve) {
		c.add(ve.Path, CodeInvalidValue, "%s %s", ve.Path, ve.Msg)
		return nil, c.err()
	}
	if err != nil {
		c.add("", CodeInvalidJSON, "%v", err)
		return nil, c.err()
	}
	if !json.Valid(js) {
		var v any
		err := json.Unmarshal(js, &v)
		c.add("", CodeInvalidJSON, "invalid JSON: %v", err)
		return nil, c.err()
	}
	top, ok := objectMembers(js)
	if !ok {
		c.add("", CodeInvalidType, "a workflow definition must be a JSON object")
		return nil, c.err()
	}
	// JSON keeps the last of two equal keys without a word (a second
	// "tasks" dropped the first's steps); YAML refuses them, and so does
	// a definition in either form.
	// (A step given twice is told below, as invalid_name.)
	if !lim.Stored {
		for _, path := range duplicateKeys(js) {
			if !isStepPath(path) {
				c.add(path, CodeDuplicateKey, "%s is given twice in one object", path)
			}
		}
	}
	w := &Workflow{Trigger: "api", MaxDuration: DefaultMaxDuration, Enabled: true, index: map[string]*Step{}}
	var compact bytes.Buffer
	_ = json.Compact(&compact, js)
	w.Source = compact.Bytes()

	var tasksRaw json.RawMessage
	seenName := false
	for _, m := range top {
		if c.nullDefault(nullTopDefaults, m.Key, m.Value) {
			continue
		}
		switch m.Key {
		case "name":
			seenName = true
			if s, ok := str(c, "name", m.Value); ok {
				w.Name = s
				switch {
				case !workflowNameRE.MatchString(s):
					c.add("name", CodeInvalidName, "workflow name %q must start with a letter or digit and hold only letters, digits, '.', '_' and '-' (at most 128)", s)
				case isUUID(s):
					c.add("name", CodeInvalidName, "workflow name %q looks like an id; ids and names share the API path", s)
				}
			}
		case "description":
			if s, ok := str(c, "description", m.Value); ok {
				w.Description = s
			}
		case "trigger":
			if s, ok := str(c, "trigger", m.Value); ok {
				if s != "api" {
					c.add("trigger", CodeUnsupportedTrigger, "trigger %q is not supported; use \"api\"", s)
				}
				w.Trigger = s
			}
		case "max_duration":
			d, err := durationJSON(m.Value, secondUnit, c.stored)
			if err != nil || d <= 0 {
				c.add("max_duration", CodeInvalidDuration, "max_duration must be a positive duration like \"30d\" (at most 106,751 days) or seconds as a number")
			} else {
				w.MaxDuration = d
			}
		case "enabled":
			if err := json.Unmarshal(m.Value, &w.Enabled); err != nil {
				c.add("enabled", CodeInvalidType, "enabled must be true or false")
			}
		case "tasks":
			tasksRaw = m.Value
		default:
			c.add(m.Key, CodeUnknownField, "unknown field %q", m.Key)
		}
	}
	if !seenName {
		c.add("name", CodeRequired, "name is required")
	}
	if tasksRaw == nil {
		c.add("tasks", CodeRequired, "tasks is required")
		return nil, c.err()
	}
	steps, ok := objectMembers(tasksRaw)
	switch {
	case !ok:
		c.add("tasks", CodeInvalidType, "tasks must be an object of step name to step")
		return nil, c.err()
	case len(steps) == 0:
		c.add("tasks", CodeRequired, "a workflow needs at least one step")
		return nil, c.err()
	case lim.MaxSteps > 0 && len(steps) > lim.MaxSteps:
		c.add("tasks", CodeTooManySteps, "workflow has %d steps; the limit is %d", len(steps), lim.MaxSteps)
		return nil, c.err()
	}
	for _, m := range steps {
		path := "tasks." + m.Key
		if !stepNameRE.MatchString(m.Key) {
			c.add(path, CodeInvalidName, "step name %q must hold only letters, digits, '_' and '-' (at most 64), and not start with '-'", m.Key)
		}
		if _, dup := w.index[m.Key]; dup {
			c.add(path, CodeInvalidName, "step %q is defined twice", m.Key)
			continue
		}
		st := parseStep(c, path, m.Key, m.Value)
		w.Steps = append(w.Steps, st)
		w.index[m.Key] = st
	}
	checkGraph(c, w)
	checkExpressions(c, w)
	if err := c.err(); err != nil {
		return nil, err
	}
	return w, nil
}

// ValidName tells whether s can be a workflow's name: every name stored
// is one (the rule has not changed), so a list's cursor that is not one
// was never a cursor of the workflow list.
func ValidName(s string) bool { return workflowNameRE.MatchString(s) && !isUUID(s) }

func isUUID(s string) bool {
	_, err := uuid.Parse(s)
	return err == nil
}

func str(c *collector, path string, raw json.RawMessage) (string, bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		c.add(path, CodeInvalidType, "%s must be a string", lastSegment(path))
		return "", false
	}
	return s, true
}

func lastSegment(path string) string {
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		return path[i+1:]
	}
	return path
}

// checkHeaders refuses at create time what the step could never send:
// a name that is not an HTTP token, a value with a control character
// (templates cannot remove one), or one name given twice in different
// case, of which the request would carry whichever came last in map
// order. Stored versions are not checked again: their steps fail at run
// time as before.
func checkHeaders(c *collector, path string, h map[string]string) {
	seen := make(map[string]string, len(h))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		p := path + "." + k
		switch canon := strings.ToLower(k); {
		case !httpguts.ValidHeaderFieldName(k):
			c.add(p, CodeInvalidValue, "header name %q must be an HTTP token: letters, digits and !#$%%&'*+-.^_`|~", k)
		case !httpguts.ValidHeaderFieldValue(h[k]):
			c.add(p, CodeInvalidValue, "header %q has a control character in its value", k)
		case seen[canon] != "":
			c.add(p, CodeInvalidValue, "header %q is also given as %q: header names are case-insensitive", k, seen[canon])
		default:
			seen[canon] = k
		}
	}
}

// fieldTypes says which step types a type-specific field is allowed on.
var fieldTypes = map[string][]StepType{
	"method": {StepHTTP}, "headers": {StepHTTP}, "body": {StepHTTP}, "timeout": {StepHTTP},
	"retries": {StepHTTP, StepTask}, "retry_delay": {StepTask},
}

var taskTypeRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*(\.[a-z0-9_-]+)*\.v[0-9]+$`)

func parseStep(c *collector, path, name string, raw json.RawMessage) *Step {
	st := &Step{Name: name, Needs: []string{}}
	members, ok := objectMembers(raw)
	if !ok {
		c.add(path, CodeInvalidType, "step must be an object")
		return st
	}
	var types []StepType
	present := map[string]bool{}
	for _, m := range members {
		p := path + "." + m.Key
		if c.nullDefault(nullStepDefaults, m.Key, m.Value) {
			continue
		}
		present[m.Key] = true
		switch m.Key {
		case "needs":
			var needs []string
			if err := json.Unmarshal(m.Value, &needs); err != nil {
				c.add(p, CodeInvalidType, "needs must be an array of step names")
			} else if needs != nil {
				st.Needs = needs
			}
		case "if":
			if s, ok := str(c, p, m.Value); ok {
				st.If = s
				if s == "" && !c.stored { // not the same as no condition: say which was meant
					c.add(p, CodeInvalidCondition, "if is empty: give a condition, or leave if out")
				}
			}
		case "url":
			types = append(types, StepHTTP)
			if s, ok := str(c, p, m.Value); ok {
				st.URL = s
			}
		case "method":
			if s, ok := str(c, p, m.Value); ok {
				st.Method = strings.ToUpper(s)
				if !methods[st.Method] {
					c.add(p, CodeInvalidValue, "method %q is not one of GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS", s)
				}
			}
		case "headers":
			if err := json.Unmarshal(m.Value, &st.Headers); err != nil {
				c.add(p, CodeInvalidType, "headers must be an object of string values")
			} else if !c.stored {
				checkHeaders(c, p, st.Headers)
			}
		case "body":
			dec := json.NewDecoder(bytes.NewReader(m.Value))
			dec.UseNumber()
			if err := dec.Decode(&st.Body); err != nil && !errors.Is(err, io.EOF) {
				c.add(p, CodeInvalidJSON, "body: %v", err)
			}
			st.HasBody = true
		case "retries":
			var n int
			if err := json.Unmarshal(m.Value, &n); err != nil || n < 0 || n > 25 {
				c.add(p, CodeInvalidValue, "retries must be a whole number from 0 to 25")
			} else {
				st.Retries, st.RetriesSet = n, true
			}
		case "retry_delay":
			d, err := durationJSON(m.Value, secondUnit, c.stored)
			if err != nil || d < time.Millisecond {
				c.add(p, CodeInvalidDuration, "retry_delay must be a duration of at least 1ms, like \"30s\", or seconds as a number")
			} else {
				st.RetryDelay = d
			}
		case "task":
			types = append(types, StepTask)
			parseTask(c, p, st, m.Value)
		case "timeout":
			d, err := durationJSON(m.Value, millisecondUnit, c.stored)
			if err != nil || d <= 0 || d > maxHTTPTimeout {
				c.add(p, CodeInvalidDuration, "timeout must be a positive duration up to 1h: milliseconds as a number, or a string like \"30s\"")
			} else {
				st.Timeout = d
			}
		case "sleep":
			types = append(types, StepSleep)
			d, err := durationJSON(m.Value, secondUnit, c.stored)
			if err != nil {
				c.add(p, CodeInvalidDuration, "sleep must be a duration like \"30s\", \"5m\", \"2h\", \"1d\" or seconds as a number")
			} else {
				st.Sleep = d
			}
		case "wait_for_webhook":
			types = append(types, StepWebhook)
			parseWait(c, p, st, m.Value)
		default:
			c.add(p, CodeUnknownField, "unknown field %q", m.Key)
		}
	}
	switch len(types) {
	case 0:
		c.add(path, CodeMissingStepType, "step %q has no type: give it a url, task, sleep or wait_for_webhook", name)
	case 1:
		st.Type = types[0]
	default:
		names := make([]string, len(types))
		for i, t := range types {
			names[i] = string(t)
			if t == StepHTTP {
				names[i] = "url"
			}
		}
		c.add(path, CodeConflictingTypes, "step %q has more than one type (%s); a step is exactly one of url, task, sleep, wait_for_webhook", name, strings.Join(names, ", "))
		st.Type = types[0]
	}
	if len(types) == 1 {
		for _, m := range members {
			if allowed, ok := fieldTypes[m.Key]; ok && !slices.Contains(allowed, st.Type) {
				c.add(path+"."+m.Key, CodeFieldNotAllowed, "%s is not allowed on %s steps", m.Key, st.Type)
			}
		}
	}
	if st.Type == StepHTTP {
		if st.Method == "" {
			st.Method = DefaultMethod
		}
		if !present["retries"] {
			st.Retries = DefaultRetries
		}
		if st.Timeout == 0 {
			st.Timeout = DefaultHTTPTimeout
		}
		checkStaticURL(c, path+".url", st.URL)
	}
	return st
}

func parseTask(c *collector, p string, st *Step, raw json.RawMessage) {
	st.TaskPriority = DefaultTaskPriority
	members, ok := objectMembers(raw)
	if !ok {
		c.add(p, CodeInvalidType, "task must be an object like {\"type\": \"billing.invoice.v1\", \"payload\": {...}}")
		return
	}
	for _, m := range members {
		if c.nullDefault(map[string]bool{"priority": true}, m.Key, m.Value) {
			continue
		}
		switch m.Key {
		case "type":
			if s, ok := str(c, p+".type", m.Value); ok {
				st.TaskType = s
				switch {
				case len(s) > MaxTaskTypeLen && !c.stored:
					c.add(p+".type", CodeInvalidValue, "task type is %d bytes long, more than %d", len(s), MaxTaskTypeLen)
				case !taskTypeRE.MatchString(s):
					c.add(p+".type", CodeInvalidValue, "task type %q must be a versioned name like \"billing.invoice.v1\" (lower case, dot-separated, ending in .vN)", s)
				}
			}
		case "payload":
			dec := json.NewDecoder(bytes.NewReader(m.Value))
			dec.UseNumber()
			if err := dec.Decode(&st.Payload); err != nil {
				c.add(p+".payload", CodeInvalidJSON, "payload: %v", err)
			}
			st.HasPayload = true
		case "priority":
			var n int
			if err := json.Unmarshal(m.Value, &n); err != nil || n < 0 || n > 1000 {
				c.add(p+".priority", CodeInvalidValue, "priority must be a whole number from 0 to 1000 (lower runs first)")
			} else {
				st.TaskPriority = n
			}
		default:
			c.add(p+"."+m.Key, CodeUnknownField, "unknown field %q", m.Key)
		}
	}
	if st.TaskType == "" {
		c.add(p+".type", CodeRequired, "task.type is required")
	}
}

// CleanText tells whether s is UTF-8 without NUL: what every database
// stores and compares as text (Postgres refuses the rest).
func CleanText(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// MaxKeyLen bounds an idempotency key: keys are indexed.
const MaxKeyLen = 255

// ValidKey tells whether k can be an idempotency key: at most MaxKeyLen
// bytes of UTF-8 text that an HTTP header carries as it is: no ASCII
// control character but the tab, and no space or tab at either end. A
// header loses those at its ends and cannot hold the others, while a JSON
// body keeps them all, so such a key would name one run through the header
// and another through a batch.
func ValidKey(k string) bool {
	if len(k) > MaxKeyLen || !utf8.ValidString(k) || strings.Trim(k, " \t") != k {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// MaxTaskTypeLen bounds a task type's length: types are indexed, and an
// index entry has a bounded size (Postgres: about 2,700 bytes).
const MaxTaskTypeLen = 255

// ValidTaskType reports whether s is a versioned task type name of at
// most MaxTaskTypeLen bytes.
func ValidTaskType(s string) bool { return len(s) <= MaxTaskTypeLen && taskTypeRE.MatchString(s) }

func parseWait(c *collector, p string, st *Step, raw json.RawMessage) {
	if string(raw) == "true" || string(raw) == "{}" {
		return
	}
	members, ok := objectMembers(raw)
	if !ok {
		c.add(p, CodeInvalidType, "wait_for_webhook must be an object like {\"timeout\": \"1h\"}")
		return
	}
	for _, m := range members {
		if c.nullDefault(map[string]bool{"timeout": true}, m.Key, m.Value) {
			continue
		}
		switch m.Key {
		case "timeout":
			d, err := durationJSON(m.Value, secondUnit, c.stored)
			if err != nil || d <= 0 {
				c.add(p+".timeout", CodeInvalidDuration, "timeout must be a positive duration like \"1h\" or seconds as a number")
			} else {
				st.WaitTimeout = d
			}
		default:
			c.add(p+"."+m.Key, CodeUnknownField, "unknown field %q", m.Key)
		}
	}
}

// checkStaticURL validates URLs that hold no template; templated URLs can only
// be checked once rendered.
func checkStaticURL(c *collector, p, raw string) {
	if raw == "" {
		c.add(p, CodeRequired, "url must not be empty")
		return
	}
	if strings.Contains(raw, "{{") {
		if strings.HasPrefix(raw, "{{") {
			return
		}
		raw = raw[:strings.Index(raw, "{{")]
		if !strings.Contains(raw, "://") {
			return
		}
		raw += "x"
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		c.add(p, CodeInvalidURL, "url %q must be an absolute http or https URL", raw)
	}
}
