package engine_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/engine"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/status"
)

// hundredSteps is a 100-step DAG: ten layers of ten, each step needing the
// whole previous layer, with templates and conditions on every step.
func hundredSteps(b *testing.B) *spec.Workflow {
	var steps []string
	for l := 0; l < 10; l++ {
		for i := 0; i < 10; i++ {
			var needs []string
			if l > 0 {
				for j := 0; j < 10; j++ {
					needs = append(needs, fmt.Sprintf(`"s%d_%d"`, l-1, j))
				}
			}
			cond, body := "", `{"id": "{{trigger.body.id}}"}`
			if l > 0 {
				cond = fmt.Sprintf(`, "if": "tasks.s%d_%d.status_code == 200"`, l-1, i)
				body = fmt.Sprintf(`{"id": "{{tasks.s%d_%d.body.id}}", "n": "{{trigger.body.n}}"}`, l-1, i)
			}
			steps = append(steps, fmt.Sprintf(`"s%d_%d": {"needs": [%s]%s, "url": "https://example.com/x", "body": %s}`, l, i, strings.Join(needs, ","), cond, body))
		}
	}
	w, err := spec.Parse([]byte(`{"name": "hundred", "tasks": {`+strings.Join(steps, ",")+`}}`), spec.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// BenchmarkNext100Steps evaluates a 100-step run whose first nine layers
// succeeded: the engine starts the last layer, whose templates and
// conditions read 10 of the 90 results.
func BenchmarkNext100Steps(b *testing.B) {
	def := hundredSteps(b)
	code := 200
	states := map[string]engine.StepState{}
	for l := 0; l < 9; l++ {
		for i := 0; i < 10; i++ {
			states[fmt.Sprintf("s%d_%d", l, i)] = engine.StepState{Status: status.StepSuccess, StatusCode: &code, Body: []byte(`{"id": 42, "extra": [1, 2, 3]}`)}
		}
	}
	run := engine.Run{Def: def, TriggerBody: json.RawMessage(`{"id": 1, "n": "x"}`), Steps: states}
	b.ReportAllocs()
	for b.Loop() {
		if d := engine.Next(run); len(d) != 10 {
			b.Fatalf("%d decisions", len(d))
		}
	}
}

// BenchmarkEvaluate100Steps computes the outcome of a finished 100-step run.
func BenchmarkEvaluate100Steps(b *testing.B) {
	def := hundredSteps(b)
	states := map[string]engine.StepState{}
	for _, s := range def.Steps {
		states[s.Name] = engine.StepState{Status: status.StepSuccess}
	}
	b.ReportAllocs()
	for b.Loop() {
		if o := engine.Evaluate(def, states); !o.Done {
			b.Fatal("not done")
		}
	}
}
