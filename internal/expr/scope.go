package expr

import (
	"fmt"
	"sort"
	"strings"
)

// StepResult is what later steps may read about a finished step.
type StepResult struct {
	Status     string            // "success", "failed", "timeout", "skipped", ...
	StatusCode *int              // nil when there is none (skipped, sleep, webhook...)
	Body       any               // decoded JSON when BodyJSON; otherwise nil
	BodyRaw    string            // raw body text, used when !BodyJSON
	BodyJSON   bool              // Body holds the parsed JSON body
	Headers    map[string]string // response headers; lookup ignores case
	Truncated  bool              // body exceeded the size limit, was cut and never parsed
}

// Scope is everything a template or condition can read. Nothing here
// mutates it, so one Scope may be shared by concurrent evaluations, unless
// its TaskResult is not safe for concurrent use (the engine's memoizes
// into a map: its Scope belongs to one decision round).
type Scope struct {
	TriggerBody    any                   // decoded JSON of the trigger payload
	TriggerHeaders map[string]string     // lookup ignores case
	Tasks          map[string]StepResult // finished (terminal) steps only
	WaitURLs       map[string]string     // step name -> callback URL
	// TaskResult, when set, is asked for a step Tasks does not hold, and
	// answers as Tasks would (finished steps only). It lets the caller
	// decode a step's body only once a template or condition reads that
	// step. A Scope with TaskResult is as safe for concurrent use as
	// TaskResult is.
	TaskResult func(step string) (StepResult, bool)
}

// Lookup resolves p leniently, as conditions need: anything missing, and
// anything reached through null or a scalar, is nil.
func (s *Scope) Lookup(p Path) any {
	v, err := s.resolve(p)
	if err != nil {
		return nil
	}
	return v
}

// Resolve resolves p strictly, as templates need: anything missing is a
// *ResolveError. A null status_code, and the empty body of a step that
// produced none (skipped, sleep), resolve to nil without error. Objects and
// arrays are returned as copies.
func (s *Scope) Resolve(p Path) (any, error) {
	v, err := s.resolve(p)
	if err != nil {
		return nil, err
	}
	return deepCopy(v), nil
}

func (s *Scope) resolve(p Path) (any, error) {
	fail := func(format string, args ...any) (any, error) {
		return nil, &ResolveError{Path: p.String(), Reason: fmt.Sprintf(format, args...)}
	}
	if s == nil {
		return fail("nothing to resolve against")
	}
	if len(p) == 0 {
		return fail("empty path")
	}
	names := p.Names()
	switch names[0] {
	case "trigger":
		if len(p) < 2 {
			return fail("use trigger.body or trigger.headers")
		}
		switch names[1] {
		case "body":
			return walk(p, 2, s.TriggerBody)
		case "headers":
			return headers(p, 2, s.TriggerHeaders, "the trigger")
		}
		return fail("unknown field %q of trigger; use body or headers", names[1])
	case "tasks":
		return s.resolveTask(p, fail)
	case "wait":
		if len(p) != 3 || names[2] != "url" {
			return fail("use wait.<step>.url")
		}
		u, ok := s.WaitURLs[names[1]]
		if !ok {
			return fail("step %q has no callback URL (not a wait step, or it has not started)", names[1])
		}
		return u, nil
	}
	return fail("unknown namespace %q; use trigger, tasks or wait", names[0])
}

func (s *Scope) resolveTask(p Path, fail func(string, ...any) (any, error)) (any, error) {
	names := p.Names()
	if len(p) < 3 {
		return fail("use tasks.<step>.status, .status_code, .body or .headers")
	}
	step := names[1]
	r, ok := s.Tasks[step]
	if !ok && s.TaskResult != nil {
		r, ok = s.TaskResult(step)
	}
	if !ok {
		return fail("step %q has not finished or does not exist", step)
	}
	switch names[2] {
	case "status":
		return walk(p, 3, r.Status)
	case "status_code":
		if r.StatusCode == nil {
			return walk(p, 3, nil)
		}
		return walk(p, 3, *r.StatusCode)
	case "headers":
		return headers(p, 3, r.Headers, fmt.Sprintf("step %q", step))
	case "body":
		return r.body(p, step, fail)
	}
	return fail("unknown field %q of step %q; use status, status_code, body or headers", names[2], step)
}

func (r StepResult) body(p Path, step string, fail func(string, ...any) (any, error)) (any, error) {
	switch {
	case r.Truncated:
		if len(p) > 3 {
			// Users see this text verbatim; it names the exact sub-path
			// so they know which reference to drop.
			return fail("Cannot read '%s' because the response from '%s' exceeded the 256KB limit and was truncated", p[2:].String(), step)
		}
		return r.BodyRaw, nil
	case r.BodyJSON:
		return walk(p, 3, r.Body)
	case r.BodyRaw == "" && r.Body == nil:
		// No body at all (skipped, sleep, 204): null, like a JSON null body.
		return walk(p, 3, nil)
	case len(p) > 3:
		return fail("the response body of step %q is not JSON, so %q cannot be read; use tasks.%s.body for the raw text", step, p[2:].String(), step)
	}
	return r.BodyRaw, nil
}

// headers resolves the segment at i as a header name, case-insensitively.
// Without a name the whole set is returned as a JSON object.
func headers(p Path, i int, h map[string]string, owner string) (any, error) {
	if len(p) == i {
		m := make(map[string]any, len(h))
		for k, v := range h {
			m[k] = v
		}
		return m, nil
	}
	if p[i].Bracket {
		return nil, &ResolveError{Path: p.String(), Reason: "headers are named, not indexed"}
	}
	v, ok := lookupFold(h, p[i].Name)
	if !ok {
		return nil, &ResolveError{Path: p.String(), Reason: fmt.Sprintf("%s has no header %q", owner, p[i].Name)}
	}
	return walk(p, i+1, v)
}

func lookupFold(h map[string]string, name string) (string, bool) {
	if v, ok := h[name]; ok {
		return v, true
	}
	// Pick the smallest matching key so that a map holding both "X-A" and
	// "x-a" answers the same way every time.
	var keys []string
	for k := range h {
		if strings.EqualFold(k, name) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return "", false
	}
	sort.Strings(keys)
	return h[keys[0]], true
}

// walk follows p[i:] through decoded JSON starting at v.
func walk(p Path, i int, v any) (any, error) {
	for ; i < len(p); i++ {
		seg := p[i]
		where := p[:i]
		fail := func(format string, args ...any) (any, error) {
			return nil, &ResolveError{Path: p.String(), Reason: fmt.Sprintf(format, args...)}
		}
		switch x := v.(type) {
		case map[string]any:
			if seg.Bracket {
				return fail("%s is an object, not an array", where)
			}
			e, ok := x[seg.Name]
			if !ok {
				return fail("%s has no field %q", where, seg.Name)
			}
			v = e
		case []any:
			if seg.Index < 0 {
				return fail("%s is an array; use an index such as [0], not %q", where, seg.Name)
			}
			if seg.Index >= len(x) {
				return fail("index %d is out of range: %s has %d elements", seg.Index, where, len(x))
			}
			v = x[seg.Index]
		case nil:
			return fail("%s is null", where)
		default:
			return fail("%s is a %s and has no fields", where, kind(x))
		}
	}
	return v, nil
}

func kind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	}
	if _, ok := toNumber(v); ok {
		return "number"
	}
	return fmt.Sprintf("%T", v)
}
