package engine_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/ferryhq/ferry/internal/engine"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/status"
)

// genStep is a generated step, kept alongside its JSON so the test can
// predict what the engine must decide.
type genStep struct {
	name  string
	typ   spec.StepType
	needs []string
	cond  string // a key of conditions, or "" for no `if`
	dep   string // the need the condition reads
	tmpl  string // the need whose body.v the HTTP body reads, or ""
}

// conditions maps a condition kind to its text (%s is the step read) and to
// what it must evaluate to for the state of that step.
var conditions = map[string]struct {
	text string
	eval func(engine.StepState) bool
}{
	"success":     {"tasks.%s.status == 'success'", func(s engine.StepState) bool { return s.Status == status.StepSuccess }},
	"not-success": {"tasks.%s.status != 'success'", func(s engine.StepState) bool { return s.Status != status.StepSuccess }},
	"skipped":     {"tasks.%s.status == 'skipped'", func(s engine.StepState) bool { return s.Status == status.StepSkipped }},
	"timeout":     {"tasks.%s.status == 'timeout'", func(s engine.StepState) bool { return s.Status == status.StepTimeout }},
	"ge400":       {"tasks.%s.status_code >= 400", func(s engine.StepState) bool { return s.StatusCode != nil && *s.StatusCode >= 400 }},
	"code200":     {"tasks.%s.status_code == 200", func(s engine.StepState) bool { return s.StatusCode != nil && *s.StatusCode == 200 }},
	"body-ok":     {"tasks.%s.body.ok == true", func(s engine.StepState) bool { return jsonField(s, "ok") == true }},
}

var conditionKinds = []string{"", "", "success", "not-success", "skipped", "timeout", "ge400", "code200", "body-ok"}

// jsonField reads a top-level field of a step's body the way templates may:
// only untruncated JSON objects have fields. The second result says whether
// the field exists.
func jsonField(s engine.StepState, f string) any {
	v, _ := jsonFieldOK(s, f)
	return v
}

func jsonFieldOK(s engine.StepState, f string) (any, bool) {
	if s.Truncated || len(s.Body) == 0 {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(s.Body))
	var m map[string]any
	if err := dec.Decode(&m); err != nil || dec.More() {
		return nil, false
	}
	v, ok := m[f]
	return v, ok
}

func genWorkflow(t *rapid.T) ([]genStep, string) {
	n := rapid.IntRange(2, 15).Draw(t, "steps")
	var gs []genStep
	var parts []string
	for i := range n {
		g := genStep{name: fmt.Sprintf("s%d", i)}
		g.typ = rapid.SampledFrom([]spec.StepType{spec.StepHTTP, spec.StepHTTP, spec.StepSleep, spec.StepWebhook}).Draw(t, g.name+".type")
		if i > 0 {
			idx := rapid.SliceOfNDistinct(rapid.IntRange(0, i-1), 0, min(i, 3), rapid.ID[int]).Draw(t, g.name+".needs")
			for _, j := range idx {
				g.needs = append(g.needs, gs[j].name)
			}
		}
		obj := map[string]any{}
		if len(g.needs) > 0 {
			obj["needs"] = g.needs
			g.cond = rapid.SampledFrom(conditionKinds).Draw(t, g.name+".if")
			if g.cond != "" {
				g.dep = rapid.SampledFrom(g.needs).Draw(t, g.name+".if-dep")
				obj["if"] = fmt.Sprintf(conditions[g.cond].text, g.dep)
			}
		}
		switch g.typ {
		case spec.StepHTTP:
			obj["url"] = "https://x.test/" + g.name
			if len(g.needs) > 0 && rapid.Bool().Draw(t, g.name+".templated") {
				g.tmpl = rapid.SampledFrom(g.needs).Draw(t, g.name+".tmpl-dep")
				obj["body"] = map[string]any{"v": "{{tasks." + g.tmpl + ".body.v}}"}
			}
		case spec.StepSleep:
			obj["sleep"] = "1s"
		case spec.StepWebhook:
			obj["wait_for_webhook"] = map[string]any{"timeout": "1h"}
		}
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
		parts = append(parts, fmt.Sprintf("%q:%s", g.name, b))
	}
	return gs, `{"name":"prop","tasks":{` + strings.Join(parts, ",") + `}}`
}

var httpOutcomes = []engine.StepState{
	ok(200, `{"v": 1, "ok": true}`),
	ok(201, `{"ok": false}`),
	ok(200, `not json`),
	truncated(200, `{"v": 1, "ok": tr`),
	ok(204, ``),
	failed(500, `{"v": 2, "ok": true}`),
	failed(404, `Not Found`),
	timedOut(),
}

var waitOutcomes = []engine.StepState{
	{Status: status.StepSuccess, Body: []byte(`{"v": 3, "ok": true}`)},
	{Status: status.StepSuccess, Body: []byte(`{"status": "paid"}`)},
	timedOut(),
}

// expect is the documented decision rule, written independently of the
// engine: blocked beats cascade, an `if` is always evaluated, and templates
// are resolved only for HTTP steps that are going to run.
func expect(g genStep, states map[string]engine.StepState) (engine.Action, bool) {
	if g.cond == "" {
		for _, n := range g.needs {
			if status.StepFailure(states[n].Status) {
				return engine.Skip, true
			}
		}
		for _, n := range g.needs {
			if states[n].Status == status.StepSkipped {
				return engine.Skip, false
			}
		}
	} else if !conditions[g.cond].eval(states[g.dep]) {
		return engine.Skip, false
	}
	switch g.typ {
	case spec.StepSleep:
		return engine.StartSleep, false
	case spec.StepWebhook:
		return engine.StartWait, false
	}
	if g.tmpl != "" {
		if _, ok := jsonFieldOK(states[g.tmpl], "v"); !ok {
			return engine.TemplateError, false
		}
	}
	return engine.StartHTTP, false
}

func TestPropertyRandomDAGs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		gs, doc := genWorkflow(t)
		def, err := spec.Parse([]byte(doc), spec.DefaultLimits)
		if err != nil {
			t.Fatalf("generated definition rejected: %v\n%s", err, doc)
		}
		byName := map[string]genStep{}
		for _, g := range gs {
			byName[g.name] = g
		}
		s := newSim(t, def, `{"id": 1}`, func(step string, d engine.Decision) engine.StepState {
			switch d.Action {
			case engine.StartHTTP:
				return rapid.SampledFrom(httpOutcomes).Draw(t, step+".outcome")
			case engine.StartWait:
				return rapid.SampledFrom(waitOutcomes).Draw(t, step+".outcome")
			}
			return engine.StepState{Status: status.StepSuccess}
		})
		s.pick = func(flying []string) []string {
			var out []string
			for _, n := range flying {
				if rapid.Bool().Draw(t, n+".finishes") {
					out = append(out, n)
				}
			}
			if len(out) == 0 {
				out = flying[:1]
			}
			return out
		}
		// Check each decision against the rule at the moment it is made,
		// with the states its needs had then (needs are terminal by then,
		// which the simulator checks, so they cannot change later).
		out := s.play()

		anyBlocked := false
		for _, g := range gs {
			d, ok := s.decisions[g.name]
			if !ok {
				t.Fatalf("%s was never decided", g.name)
			}
			if d.Blocked {
				anyBlocked = true
			}
			wantAction, wantBlocked := expect(g, s.run.Steps)
			if d.Action != wantAction || d.Blocked != wantBlocked {
				t.Fatalf("%s (if %q, needs %v): decision %+v, want %s blocked=%v\nstates: %s\n%s",
					g.name, g.cond, g.needs, d, wantAction, wantBlocked, s.summary(), doc)
			}

			// The documented rules, stated directly.
			if g.cond == "" {
				var skippedNeed, failedNeed bool
				for _, n := range g.needs {
					skippedNeed = skippedNeed || s.status(n) == status.StepSkipped
					failedNeed = failedNeed || status.StepFailure(s.status(n))
				}
				if skippedNeed && d.Action != engine.Skip {
					t.Fatalf("%s: no `if`, a need was skipped, but %+v", g.name, d)
				}
				if failedNeed && (d.Action != engine.Skip || !d.Blocked) {
					t.Fatalf("%s: no `if`, a need failed, but %+v", g.name, d)
				}
			} else {
				if d.Blocked {
					t.Fatalf("%s has an `if` but was blocked: %+v", g.name, d)
				}
				if d.Action == engine.Skip && !strings.HasPrefix(d.Reason, "condition is false") {
					t.Fatalf("%s has an `if` but was skipped for %q", g.name, d.Reason)
				}
			}
		}
		if !out.Done {
			t.Fatalf("run not done: %+v", out)
		}
		if (out.Status == status.RunFailed) != anyBlocked {
			t.Fatalf("run %s, but blocked steps: %v\n%s", out.Status, anyBlocked, s.summary())
		}
		if out.Status != status.RunFailed && out.Status != status.RunCompleted {
			t.Fatalf("run ended %s", out.Status)
		}
		if s.rounds > len(gs)+1 {
			t.Fatalf("%d rounds for %d steps", s.rounds, len(gs))
		}
	})
}

// The same property, but every in-flight step finishes each round and every
// HTTP step fails: the worst case for blocking.
func TestPropertyAllFail(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		gs, doc := genWorkflow(t)
		def, err := spec.Parse([]byte(doc), spec.DefaultLimits)
		if err != nil {
			t.Fatalf("generated definition rejected: %v", err)
		}
		s := newSim(t, def, ``, func(string, engine.Decision) engine.StepState { return failed(500, ``) })
		out := s.play()
		blocked := false
		for _, g := range gs {
			d := s.decisions[g.name]
			blocked = blocked || d.Blocked
			if want, wantBlocked := expect(g, s.run.Steps); d.Action != want || d.Blocked != wantBlocked {
				t.Fatalf("%s: %+v, want %s blocked=%v\n%s", g.name, d, want, wantBlocked, doc)
			}
		}
		if (out.Status == status.RunFailed) != blocked {
			t.Fatalf("outcome %+v, blocked %v", out, blocked)
		}
	})
}
