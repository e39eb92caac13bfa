package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/expr"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/status"
)

// StepState is what the engine knows of one step of a run.
type StepState struct {
	Status     string
	StatusCode *int
	Body       []byte // raw response body or webhook payload
	Headers    map[string]string
	Truncated  bool
	// Blocked marks a step skipped because a dependency failed and the step
	// had no `if` to route around it; a run with a blocked step is failed.
	Blocked bool
}

// Run is the input of a decision: the definition, the trigger and the state
// of every step. Steps absent from the map are pending.
type Run struct {
	Def            *spec.Workflow
	TriggerBody    json.RawMessage
	TriggerHeaders map[string]string
	Steps          map[string]StepState
	WaitURLs       map[string]string
}

// Action says what happens to a step.
type Action string

const (
	Skip          Action = "skip"
	TemplateError Action = "template_error"
	StartHTTP     Action = "start_http"
	StartSleep    Action = "start_sleep"
	StartWait     Action = "start_wait"
	StartTask     Action = "start_task"
)

// HTTPRequest is an HTTP step with its templates resolved.
type HTTPRequest struct {
	URL     string            `json:"url"`
	Method  string            `json:"method"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    []byte            `json:"body,omitempty"`
}

// Decision is one step's next move.
type Decision struct {
	Step    string
	Action  Action
	Reason  string // why a step was skipped, or the template error
	Blocked bool
	HTTP    *HTTPRequest
	Sleep   time.Duration
	Timeout time.Duration   // wait_for_webhook timeout; 0 = none
	Payload json.RawMessage // a task step's payload with templates resolved
}

// Next returns the decisions for every step that can move now, in definition
// order. Skips and template errors are terminal, so their consequences are
// followed to a fixpoint: a skip cascades down a chain in one call.
//
// Only terminal states change what later steps see (their needs, their
// conditions, their templates), so the caller's states are copied only
// before the first skip or template error is recorded; a step that starts
// is only marked decided. (A copy for every call was most of what a
// decision allocated.)
func Next(r Run) []Decision {
	states, copied := r.Steps, false
	var small [64]bool
	decided := small[:0]
	if n := len(r.Def.Steps); n <= len(small) {
		decided = small[:n]
	} else {
		decided = make([]bool, n)
	}
	var out []Decision
	sc := &lazyScope{r: r, states: states}
	terminal := func(name string, s StepState) {
		if !copied {
			states, copied = maps.Clone(states), true
			if states == nil {
				states = map[string]StepState{}
			}
			sc.states = states
		}
		states[name] = s
	}
	for changed := true; changed; {
		changed = false
		for i, st := range r.Def.Steps {
			if decided[i] {
				continue
			}
			cur, ok := states[st.Name]
			if ok && cur.Status != status.StepPending && cur.Status != "" {
				continue
			}
			if !needsTerminal(st, states) {
				continue
			}
			d := decide(st, states, sc)
			decided[i] = true
			out = append(out, d)
			switch d.Action {
			case Skip:
				terminal(st.Name, StepState{Status: status.StepSkipped, Blocked: d.Blocked})
				changed = true
			case TemplateError:
				terminal(st.Name, StepState{Status: status.StepTemplateError})
				changed = true
			}
		}
	}
	return out
}

// lazyScope builds the template scope once per Next call, and only if a
// decision needs it: decoding every finished step's body for each decision
// made a 100-step evaluation a thousand times slower. Within the scope a
// finished step's result (its body decoded) is made when a template or
// condition first reads the step, not for every finished step: a step's
// templates read a few steps, and decoding all of them was four fifths
// of a 100-step evaluation's allocations.
type lazyScope struct {
	r       Run
	states  map[string]StepState
	sc      *expr.Scope
	results map[string]expr.StepResult // the finished steps read so far
}

func (l *lazyScope) get() *expr.Scope {
	if l.sc == nil {
		l.sc = &expr.Scope{
			TriggerBody:    decodeJSON(l.r.TriggerBody),
			TriggerHeaders: l.r.TriggerHeaders,
			WaitURLs:       l.r.WaitURLs,
			TaskResult:     l.result,
		}
	}
	return l.sc
}

// result is the scope's view of a finished step (Scope.TaskResult);
// skipped steps read as status "skipped" with null status_code and body
// (the seed's rule). Only finished steps are kept in results, and a step
// that finishes during the call (terminal, in Next) was not finished
// before, so a kept result is never stale.
func (l *lazyScope) result(name string) (expr.StepResult, bool) {
	if r, ok := l.results[name]; ok {
		return r, true
	}
	s, ok := l.states[name]
	if !ok || !status.StepTerminal(s.Status) {
		return expr.StepResult{}, false
	}
	r := stepResult(s)
	if l.results == nil {
		l.results = map[string]expr.StepResult{}
	}
	l.results[name] = r
	return r, true
}

func needsTerminal(st *spec.Step, states map[string]StepState) bool {
	for _, n := range st.Needs {
		if !status.StepTerminal(states[n].Status) {
			return false
		}
	}
	return true
}

func decide(st *spec.Step, states map[string]StepState, sc *lazyScope) Decision {
	if st.Cond == nil && st.If == "" {
		// A failed need blocks the step whatever else its needs did, so
		// failures are looked for first: whether the run fails must not
		// depend on the order in which needs are listed.
		for _, n := range st.Needs {
			if s := states[n].Status; status.StepFailure(s) {
				return Decision{Step: st.Name, Action: Skip, Blocked: true, Reason: fmt.Sprintf("blocked: dependency %q ended %s", n, s)}
			}
		}
		for _, n := range st.Needs {
			if states[n].Status == status.StepSkipped {
				return Decision{Step: st.Name, Action: Skip, Reason: fmt.Sprintf("dependency %q was skipped", n)}
			}
		}
	} else {
		cond := st.Cond
		if cond == nil {
			c, err := expr.ParseCondition(st.If)
			if err != nil {
				return Decision{Step: st.Name, Action: TemplateError, Reason: fmt.Sprintf("invalid condition: %v", err)}
			}
			cond = c
		}
		if !cond.Eval(sc.get()) {
			return Decision{Step: st.Name, Action: Skip, Reason: "condition is false: " + st.If}
		}
	}
	switch st.Type {
	case spec.StepSleep:
		return Decision{Step: st.Name, Action: StartSleep, Sleep: st.Sleep}
	case spec.StepWebhook:
		return Decision{Step: st.Name, Action: StartWait, Timeout: st.WaitTimeout}
	case spec.StepTask:
		payload, err := renderPayload(st, sc)
		if err != nil {
			return Decision{Step: st.Name, Action: TemplateError, Reason: templateMessage(err)}
		}
		return Decision{Step: st.Name, Action: StartTask, Payload: payload}
	}
	req, err := renderHTTP(st, sc.get())
	if err != nil {
		return Decision{Step: st.Name, Action: TemplateError, Reason: templateMessage(err)}
	}
	return Decision{Step: st.Name, Action: StartHTTP, HTTP: req}
}

// templateMessage keeps the seed's exact sentence for truncated bodies, which
// already names the path and the cause.
func templateMessage(err error) string {
	var re *expr.ResolveError
	if errors.As(err, &re) && strings.HasPrefix(re.Reason, "Cannot read ") {
		return re.Reason
	}
	return err.Error()
}

func renderPayload(st *spec.Step, sc *lazyScope) (json.RawMessage, error) {
	if !st.HasPayload {
		// No scope: building it decodes the trigger's body.
		return json.RawMessage("{}"), nil
	}
	v, err := expr.RenderJSON(st.Payload, sc.get())
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode payload: %w", err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// redactRawURL is u as an error may name it, whether it parses or not:
// its user information and its query's values replaced by REDACTED, its
// fragment dropped, as HTTP attempts' errors name their URL
// (httpstep.RedactURL), since a query often carries an API key and the
// error becomes the step's error and its span's status.
func redactRawURL(u string) string {
	u, _, _ = strings.Cut(u, "#")
	u, query, hasQuery := strings.Cut(u, "?")
	if scheme, rest, ok := strings.Cut(u, "://"); ok {
		authority, path := rest, ""
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			authority, path = rest[:i], rest[i:]
		}
		if i := strings.LastIndexByte(authority, '@'); i >= 0 {
			authority = "REDACTED:REDACTED" + authority[i:]
		}
		u = scheme + "://" + authority + path
	}
	if !hasQuery {
		return u
	}
	// As httpstep.RedactQuery (this package imports no step package): a
	// parameter without a value is replaced whole, a token given as the
	// key being the secret.
	pairs := strings.Split(query, "&")
	for i, p := range pairs {
		if k, _, ok := strings.Cut(p, "="); ok {
			pairs[i] = k + "=REDACTED"
		} else if p != "" {
			pairs[i] = "REDACTED"
		}
	}
	return u + "?" + strings.Join(pairs, "&")
}

// escapeQuery percent-encodes the bytes of u's query that a URL cannot
// carry (a space, a quote, '<', non-ASCII...; a '%' that starts no
// escape), as browsers do: Go sends a query as it is, so a template
// that put a space there made a request line no server reads ("GET
// /a?q=a b HTTP/1.1", a 400). What may be in a query stays, '&', '=' and
// '+' included, and so do escapes. url.Parse has refused control
// characters already.
func escapeQuery(u string) string {
	rest, frag, hasFrag := strings.Cut(u, "#")
	base, q, hasQuery := strings.Cut(rest, "?")
	if !hasQuery {
		return u
	}
	keep := func(i int) bool {
		return queryByte(q[i]) || q[i] == '%' && i+2 < len(q) && isHex(q[i+1]) && isHex(q[i+2])
	}
	i := 0
	for i < len(q) && keep(i) {
		i++
	}
	if i == len(q) {
		return u
	}
	var b strings.Builder
	b.WriteString(base)
	b.WriteByte('?')
	b.WriteString(q[:i])
	for ; i < len(q); i++ {
		if keep(i) {
			b.WriteByte(q[i])
		} else {
			fmt.Fprintf(&b, "%%%02X", q[i])
		}
	}
	if hasFrag {
		b.WriteByte('#')
		b.WriteString(frag)
	}
	return b.String()
}

// queryByte says whether c may stand for itself in a query (RFC 3986:
// pchar, '/' and '?').
func queryByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@/?", c) >= 0
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func renderHTTP(st *spec.Step, sc *expr.Scope) (*HTTPRequest, error) {
	u, err := expr.RenderString(st.URL, sc)
	if err != nil {
		return nil, err
	}
	pu, perr := url.Parse(u)
	var ue *url.Error
	if errors.As(perr, &ue) {
		// Say what is wrong (a '%' that starts no escape, a control
		// character), not that the URL is not absolute; the error's own
		// copy of the URL is left out, unredacted.
		return nil, fmt.Errorf("url %q (after templates) is not a valid URL: %v", redactRawURL(u), ue.Err)
	}
	if perr != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
		return nil, fmt.Errorf("url %q (after templates) is not an absolute http or https URL", redactRawURL(u))
	}
	u = escapeQuery(u)
	req := &HTTPRequest{URL: u, Method: st.Method}
	if len(st.Headers) > 0 {
		req.Headers = make(map[string]string, len(st.Headers))
		for k, v := range st.Headers {
			rv, err := expr.RenderString(v, sc)
			if err != nil {
				return nil, err
			}
			req.Headers[k] = rv
		}
	}
	if st.HasBody {
		v, err := expr.RenderJSON(st.Body, sc)
		if err != nil {
			return nil, err
		}
		if s, ok := v.(string); ok {
			// A string body is sent as written, not as a JSON string.
			req.Body = []byte(s)
		} else {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(v); err != nil {
				return nil, fmt.Errorf("encode body: %w", err)
			}
			req.Body = bytes.TrimRight(buf.Bytes(), "\n")
		}
	}
	return req, nil
}

func stepResult(s StepState) expr.StepResult {
	if s.Status == status.StepSkipped {
		// A skipped step reads as nothing but its status, whatever it
		// holds: a wait step skipped after its callback came early keeps
		// the callback's body, which must not route its dependents.
		return expr.StepResult{Status: s.Status}
	}
	res := expr.StepResult{Status: s.Status, StatusCode: s.StatusCode, Headers: s.Headers, Truncated: s.Truncated}
	if s.Truncated {
		res.BodyRaw = string(s.Body)
	} else if len(s.Body) > 0 {
		if v, ok := tryJSON(s.Body); ok {
			res.Body, res.BodyJSON = v, true
		} else {
			res.BodyRaw = string(s.Body)
		}
	}
	return res
}

func decodeJSON(raw []byte) any {
	v, _ := tryJSON(raw)
	return v
}

func tryJSON(raw []byte) (any, bool) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	// Nothing may follow the value: More is false before a stray } or ],
	// and a body such as {"x":1}} was read as JSON.
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return v, true
}

// Outcome is a run's status computed from its steps.
type Outcome struct {
	Status string // a run status
	Done   bool
	Reason string
}

// Evaluate says whether the run is finished. Following the seed, a run whose
// steps are all terminal is completed whatever their outcomes, because the
// step statuses tell the story; it is failed only when a failure blocked a
// step that had no `if` to route around it, so the design could not proceed.
func Evaluate(def *spec.Workflow, steps map[string]StepState) Outcome {
	var blocked []string
	for _, st := range def.Steps {
		s := steps[st.Name]
		if !status.StepTerminal(s.Status) {
			return Outcome{Status: status.RunRunning}
		}
		if s.Blocked {
			blocked = append(blocked, st.Name)
		}
	}
	if len(blocked) > 0 {
		return Outcome{Status: status.RunFailed, Done: true, Reason: "blocked by a failed dependency: " + strings.Join(blocked, ", ")}
	}
	return Outcome{Status: status.RunCompleted, Done: true}
}
