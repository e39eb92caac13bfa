package spec

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/ferryhq/ferry/internal/expr"
)

func checkGraph(c *collector, w *Workflow) {
	names := make([]string, len(w.Steps))
	for i, s := range w.Steps {
		names[i] = s.Name
	}
	for _, s := range w.Steps {
		seen := map[string]bool{}
		for i, n := range s.Needs {
			p := fmt.Sprintf("tasks.%s.needs[%d]", s.Name, i)
			switch {
			case n == s.Name:
				c.add(p, CodeSelfNeed, "step %q cannot need itself", n)
			case w.index[n] == nil:
				if hint := suggest(n, names); hint != "" {
					c.add(p, CodeUnknownNeed, "unknown step %q; did you mean %q?", n, hint)
				} else {
					c.add(p, CodeUnknownNeed, "unknown step %q", n)
				}
			case seen[n]:
				c.add(p, CodeDuplicateNeed, "step %q is listed twice", n)
			}
			seen[n] = true
		}
	}
	if cyc := findCycle(w); cyc != nil {
		c.add("tasks."+cyc[0]+".needs", CodeCycle, "dependency cycle: %s", strings.Join(cyc, " → "))
	}
}

// findCycle returns one cycle as a closed list of step names (a, b, a), or
// nil. Unknown and self needs are reported elsewhere and ignored here.
func findCycle(w *Workflow) []string {
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var found []string
	var visit func(n string) bool
	visit = func(n string) bool {
		color[n] = grey
		stack = append(stack, n)
		for _, d := range w.index[n].Needs {
			if d == n || w.index[d] == nil {
				continue
			}
			switch color[d] {
			case grey:
				i := len(stack) - 1
				for stack[i] != d {
					i--
				}
				// needs point from dependent to dependency; show the
				// cycle in execution order.
				cyc := append([]string(nil), stack[i:]...)
				for l, r := 0, len(cyc)-1; l < r; l, r = l+1, r-1 {
					cyc[l], cyc[r] = cyc[r], cyc[l]
				}
				found = append(cyc, cyc[0])
				return true
			case white:
				if visit(d) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[n] = black
		return false
	}
	for _, s := range w.Steps {
		if color[s.Name] == white && visit(s.Name) {
			return found
		}
	}
	return nil
}

// Upstream returns every step that name transitively needs.
func (w *Workflow) Upstream(name string) map[string]bool {
	out := map[string]bool{}
	var walk func(string)
	walk = func(n string) {
		st := w.index[n]
		if st == nil {
			return
		}
		for _, d := range st.Needs {
			if !out[d] && d != name {
				out[d] = true
				walk(d)
			}
		}
	}
	walk(name)
	return out
}

func checkExpressions(c *collector, w *Workflow) {
	for _, s := range w.Steps {
		up := w.Upstream(s.Name)
		base := "tasks." + s.Name
		if s.If != "" {
			cond, err := expr.ParseCondition(s.If)
			if err != nil {
				c.add(base+".if", CodeInvalidCondition, "%v", err)
			} else {
				s.Cond = cond
				checkRefs(c, w, base+".if", s, up, cond.Refs())
			}
		}
		if s.Type == StepTask && s.HasPayload {
			refs, err := expr.TemplateRefs(s.Payload)
			if err != nil {
				c.add(base+".task.payload", CodeInvalidTemplate, "%v", err)
			} else {
				checkRefs(c, w, base+".task.payload", s, up, refs)
			}
		}
		if s.Type != StepHTTP {
			continue
		}
		checkTemplateString(c, w, base+".url", s, up, s.URL)
		keys := make([]string, 0, len(s.Headers))
		for k := range s.Headers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			checkTemplateString(c, w, base+".headers."+k, s, up, s.Headers[k])
		}
		if s.HasBody {
			refs, err := expr.TemplateRefs(s.Body)
			if err != nil {
				c.add(base+".body", CodeInvalidTemplate, "%v", err)
			} else {
				checkRefs(c, w, base+".body", s, up, refs)
			}
		}
	}
}

func checkTemplateString(c *collector, w *Workflow, p string, s *Step, up map[string]bool, text string) {
	t, err := expr.ParseTemplate(text)
	if err != nil {
		c.add(p, CodeInvalidTemplate, "%v", err)
		return
	}
	checkRefs(c, w, p, s, up, t.Refs())
}

// checkRefs rejects references that can never resolve: unknown namespaces,
// unknown steps, and steps that are not upstream (they might not have run
// when this step starts: the seed's "impossible dependency chains").
func checkRefs(c *collector, w *Workflow, p string, s *Step, up map[string]bool, refs []expr.Path) {
	for _, r := range refs {
		segs := r.Names()
		text := r.String()
		if len(segs) == 0 {
			continue
		}
		switch segs[0] {
		case "trigger":
			if len(segs) < 2 || (segs[1] != "body" && segs[1] != "headers") {
				c.add(p, CodeUnknownNamespace, "%q: trigger exposes only trigger.body and trigger.headers", text)
			} else if segs[1] == "headers" && len(segs) > 3 && !c.stored {
				c.add(p, CodeInvalidTemplate, "%q: a header's value is a string, with nothing under it", text)
			}
		case "tasks":
			if len(segs) < 3 {
				c.add(p, CodeInvalidTemplate, "%q: use tasks.<step>.status, .status_code, .body or .headers", text)
				continue
			}
			ref := segs[1]
			switch {
			case w.index[ref] == nil:
				c.add(p, CodeUnknownStep, "%q refers to unknown step %q%s", text, ref, didYouMean(ref, w))
			case ref == s.Name:
				c.add(p, CodeNotUpstream, "%q: a step cannot read its own result", text)
			case !up[ref]:
				c.add(p, CodeNotUpstream, "%q: step %q is not upstream of %q; add it to needs (directly or through another step)", text, ref, s.Name)
			}
			// What can never hold more is refused here, not found missing
			// when a run gets there (a template_error, or a condition
			// reading null). Versions stored before are read as they were.
			switch segs[2] {
			case "status", "status_code":
				if len(segs) > 3 && !c.stored {
					c.add(p, CodeInvalidTemplate, "%q: %s is a %s, with nothing under it", text, segs[2], map[string]string{"status": "string", "status_code": "number"}[segs[2]])
				}
			case "headers":
				if len(segs) > 4 && !c.stored {
					c.add(p, CodeInvalidTemplate, "%q: a header's value is a string, with nothing under it", text)
				}
			case "body":
			default:
				c.add(p, CodeInvalidTemplate, "%q: unknown field %q; use status, status_code, body or headers", text, segs[2])
			}
		case "wait":
			if len(segs) != 3 || segs[2] != "url" {
				c.add(p, CodeInvalidTemplate, "%q: use wait.<step>.url", text)
				continue
			}
			target := w.index[segs[1]]
			switch {
			case target == nil:
				c.add(p, CodeUnknownStep, "%q refers to unknown step %q%s", text, segs[1], didYouMean(segs[1], w))
			case target.Type != StepWebhook:
				c.add(p, CodeNotAWaitStep, "%q: step %q is not a wait_for_webhook step", text, segs[1])
			}
		default:
			c.add(p, CodeUnknownNamespace, "%q: unknown namespace %q; use trigger, tasks or wait", text, segs[0])
		}
	}
}

func didYouMean(n string, w *Workflow) string {
	names := make([]string, len(w.Steps))
	for i, s := range w.Steps {
		names[i] = s.Name
	}
	if h := suggest(n, names); h != "" {
		return fmt.Sprintf("; did you mean %q?", h)
	}
	return ""
}

// IsValidation reports whether err is a definition validation error.
func IsValidation(err error) bool {
	var v *ValidationError
	return errors.As(err, &v)
}
