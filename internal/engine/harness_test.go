package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/engine"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/status"
)

// This file holds a small run simulator: it plays the part of the runtime,
// feeding engine.Next the current step states, applying its decisions the way
// the runtime does, and "finishing" started steps with outcomes chosen by the
// test, until engine.Evaluate says the run is done.

func parse(t testing.TB, doc string) *spec.Workflow {
	t.Helper()
	w, err := spec.Parse([]byte(doc), spec.DefaultLimits)
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, doc)
	}
	return w
}

func parseFile(t testing.TB, name string) *spec.Workflow {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "spec", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, string(b))
}

func intp(i int) *int { return &i }

// Outcomes a test can give a started step.
func ok(code int, body string) engine.StepState {
	return engine.StepState{Status: status.StepSuccess, StatusCode: intp(code), Body: bodyBytes(body)}
}

func failed(code int, body string) engine.StepState {
	return engine.StepState{Status: status.StepFailed, StatusCode: intp(code), Body: bodyBytes(body)}
}

func timedOut() engine.StepState { return engine.StepState{Status: status.StepTimeout} }

func truncated(code int, body string) engine.StepState {
	s := ok(code, body)
	s.Truncated = true
	return s
}

func bodyBytes(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

// finisher gives the final state of a step the engine started.
type finisher func(step string, d engine.Decision) engine.StepState

// failer is what the simulator needs of a test: *testing.T and *rapid.T both
// qualify.
type failer interface {
	Fatalf(format string, args ...any)
	Fatal(args ...any)
}

func helper(t failer) {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
}

// sim is one simulated run.
type sim struct {
	t      failer
	run    engine.Run
	finish finisher
	// pick chooses which in-flight steps finish this round (all when nil);
	// it must return at least one of them.
	pick func(inFlight []string) []string

	decisions map[string]engine.Decision
	order     []string // steps in decision order
	rounds    int
}

func newSim(t failer, def *spec.Workflow, trigger string, finish finisher) *sim {
	s := &sim{
		t:         t,
		finish:    finish,
		decisions: map[string]engine.Decision{},
		run: engine.Run{
			Def:      def,
			Steps:    map[string]engine.StepState{},
			WaitURLs: map[string]string{},
		},
	}
	if trigger != "" {
		s.run.TriggerBody = []byte(trigger)
	}
	for _, st := range def.Steps {
		if st.Type == spec.StepWebhook {
			s.run.WaitURLs[st.Name] = "https://ferry.test/wh/tok-" + st.Name
		}
	}
	return s
}

func (s *sim) status(name string) string {
	st, ok := s.run.Steps[name]
	if !ok || st.Status == "" {
		return status.StepPending
	}
	return st.Status
}

// apply records one decision after checking the promises every decision
// keeps, and moves the step to the state the runtime would give it.
func (s *sim) apply(d engine.Decision) {
	t := s.t
	helper(t)
	st := s.run.Def.Step(d.Step)
	if st == nil {
		t.Fatalf("decision for unknown step %q", d.Step)
	}
	if prev, dup := s.decisions[d.Step]; dup {
		t.Fatalf("step %q decided twice: %+v then %+v", d.Step, prev, d)
	}
	if got := s.status(d.Step); got != status.StepPending {
		t.Fatalf("decision %+v for step %q in status %q", d, d.Step, got)
	}
	for _, n := range st.Needs {
		if !status.StepTerminal(s.status(n)) {
			t.Fatalf("step %q decided (%s) while its need %q is %q", d.Step, d.Action, n, s.status(n))
		}
	}
	if d.Blocked && d.Action != engine.Skip {
		t.Fatalf("decision %+v is blocked but not a skip", d)
	}
	s.decisions[d.Step] = d
	s.order = append(s.order, d.Step)
	switch d.Action {
	case engine.Skip:
		s.run.Steps[d.Step] = engine.StepState{Status: status.StepSkipped, Blocked: d.Blocked}
	case engine.TemplateError:
		if d.Reason == "" {
			t.Fatalf("template error without a reason: %+v", d)
		}
		s.run.Steps[d.Step] = engine.StepState{Status: status.StepTemplateError}
	case engine.StartHTTP:
		if st.Type != spec.StepHTTP || d.HTTP == nil {
			t.Fatalf("StartHTTP for %s step %q (request %v)", st.Type, d.Step, d.HTTP)
		}
		if d.HTTP.Method != st.Method {
			t.Fatalf("%s: method %q, want %q", d.Step, d.HTTP.Method, st.Method)
		}
		s.run.Steps[d.Step] = engine.StepState{Status: status.StepRunning}
	case engine.StartSleep:
		if st.Type != spec.StepSleep || d.Sleep != st.Sleep {
			t.Fatalf("StartSleep %v for %s step %q (sleep %v)", d.Sleep, st.Type, d.Step, st.Sleep)
		}
		s.run.Steps[d.Step] = engine.StepState{Status: status.StepSleeping}
	case engine.StartWait:
		if st.Type != spec.StepWebhook || d.Timeout != st.WaitTimeout {
			t.Fatalf("StartWait %v for %s step %q (timeout %v)", d.Timeout, st.Type, d.Step, st.WaitTimeout)
		}
		s.run.Steps[d.Step] = engine.StepState{Status: status.StepWaiting}
	default:
		t.Fatalf("unknown action %q", d.Action)
	}
}

func (s *sim) inFlight() []string {
	var out []string
	for _, st := range s.run.Def.Steps {
		switch s.status(st.Name) {
		case status.StepRunning, status.StepSleeping, status.StepWaiting:
			out = append(out, st.Name)
		}
	}
	return out
}

// play runs the simulation to the end and returns the run's outcome.
func (s *sim) play() engine.Outcome {
	t := s.t
	helper(t)
	maxRounds := len(s.run.Def.Steps) + 2
	for {
		s.rounds++
		if s.rounds > maxRounds {
			t.Fatalf("run not finished after %d rounds; states %v", maxRounds, s.summary())
		}
		for _, d := range engine.Next(s.run) {
			s.apply(d)
		}
		if again := engine.Next(s.run); len(again) != 0 {
			t.Fatalf("Next is not idempotent: after applying its decisions it returned %+v", again)
		}
		out := engine.Evaluate(s.run.Def, s.run.Steps)
		flying := s.inFlight()
		if out.Done {
			if len(flying) != 0 {
				t.Fatalf("run done (%s) with steps in flight: %v", out.Status, flying)
			}
			for _, st := range s.run.Def.Steps {
				if !status.StepTerminal(s.status(st.Name)) {
					t.Fatalf("run done but %q is %q", st.Name, s.status(st.Name))
				}
			}
			return out
		}
		if out.Status != status.RunRunning {
			t.Fatalf("Evaluate = %+v: not done but not running", out)
		}
		if len(flying) == 0 {
			t.Fatalf("run stuck: nothing in flight, nothing decided, not done; states %v", s.summary())
		}
		finishing := flying
		if s.pick != nil {
			finishing = s.pick(flying)
			if len(finishing) == 0 {
				t.Fatal("pick chose no step")
			}
		}
		for _, name := range finishing {
			end := s.finish(name, s.decisions[name])
			if !status.StepTerminal(end.Status) {
				t.Fatalf("finisher gave %q a non-terminal status %q", name, end.Status)
			}
			s.run.Steps[name] = end
		}
	}
}

func (s *sim) summary() string {
	var parts []string
	for _, st := range s.run.Def.Steps {
		x := s.status(st.Name)
		if s.run.Steps[st.Name].Blocked {
			x += "(blocked)"
		}
		parts = append(parts, st.Name+"="+x)
	}
	return strings.Join(parts, " ")
}

// statuses returns every step's final status, with "+blocked" appended for
// blocked skips, for compact comparisons.
func (s *sim) statuses() map[string]string {
	out := map[string]string{}
	for _, st := range s.run.Def.Steps {
		x := s.status(st.Name)
		if s.run.Steps[st.Name].Blocked {
			x += "+blocked"
		}
		out[st.Name] = x
	}
	return out
}

// byStep finishes steps from a table, with defaults: HTTP 200 with an empty
// JSON object, sleeps and waits succeed (a wait with an empty payload).
func byStep(m map[string]engine.StepState) finisher {
	return func(step string, d engine.Decision) engine.StepState {
		if st, ok := m[step]; ok {
			return st
		}
		switch d.Action {
		case engine.StartHTTP:
			return ok(200, `{}`)
		case engine.StartWait:
			return engine.StepState{Status: status.StepSuccess, Body: []byte(`{}`)}
		}
		return engine.StepState{Status: status.StepSuccess}
	}
}
