package spec_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferryhq/ferry/internal/spec"
)

// FuzzParse checks that no input makes Parse panic, and that everything it
// accepts is a well-formed DAG whose stored Source parses back to the same
// definition.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*"))
	for _, name := range files {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		`{"name":"a","tasks":{"x":{"url":"https://x.test"}}}`,
		`{"name":"a","tasks":{"x":{"sleep":"1d2h"},"y":{"needs":["x"],"wait_for_webhook":true}}}`,
		`{"name":"a","tasks":{"x":{"url":"https://x.test","timeout":"30000"}}}`,
		`{"name":"a","tasks":{"x":{"url":"https://{{trigger.body.h}}/p","body":"{{trigger.body}}"},"y":{"needs":["x"],"if":"!(tasks.x.status == 'success') || tasks.x.body.a[0] >= 1","url":"https://x.test/{{tasks.x.body.id}}"}}}`,
		"name: a\ntasks:\n  x: {sleep: 30}\n  y: {needs: [x], url: 'https://x.test'}\n",
		`{"name":"a","tasks":{"x":{"needs":["y"],"sleep":1},"y":{"needs":["x"],"sleep":1}}}`,
		`{"name":"a","name":"b","tasks":{"x":{"sleep":1}},"tasks":{"y":{"sleep":2}}}`,
		"",
		"null",
		"[]",
		"{}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		w, err := spec.Parse(doc, spec.DefaultLimits)
		if err != nil {
			if !spec.IsValidation(err) {
				t.Fatalf("error is not a validation error: %v", err)
			}
			return
		}
		checkWellFormed(t, w)
		again, err := spec.Parse(w.Source, spec.DefaultLimits)
		if err != nil {
			t.Fatalf("re-parsing Source failed: %v\nsource: %s", err, w.Source)
		}
		if again.Fingerprint() != w.Fingerprint() {
			t.Fatalf("re-parsing Source changed the fingerprint\nsource: %s", w.Source)
		}
	})
}

// checkWellFormed asserts the structural promises of a parsed workflow:
// unique names, needs that exist, and a topological order.
func checkWellFormed(t *testing.T, w *spec.Workflow) {
	t.Helper()
	if len(w.Steps) == 0 {
		t.Fatal("no steps")
	}
	seen := map[string]bool{}
	for _, s := range w.Steps {
		if seen[s.Name] {
			t.Fatalf("step %q twice", s.Name)
		}
		seen[s.Name] = true
		if w.Step(s.Name) != s {
			t.Fatalf("Step(%q) is not the listed step", s.Name)
		}
		switch s.Type {
		case spec.StepHTTP, spec.StepSleep, spec.StepWebhook:
		default:
			t.Fatalf("step %q has type %q", s.Name, s.Type)
		}
		if (s.If == "") != (s.Cond == nil) {
			t.Fatalf("step %q: If %q but Cond %v", s.Name, s.If, s.Cond)
		}
	}
	indeg := map[string]int{}
	dependents := map[string][]string{}
	for _, s := range w.Steps {
		for _, n := range s.Needs {
			if w.Step(n) == nil {
				t.Fatalf("step %q needs unknown %q", s.Name, n)
			}
			if n == s.Name {
				t.Fatalf("step %q needs itself", s.Name)
			}
			indeg[s.Name]++
			dependents[n] = append(dependents[n], s.Name)
		}
	}
	var queue []string
	for _, s := range w.Steps {
		if indeg[s.Name] == 0 {
			queue = append(queue, s.Name)
		}
	}
	done := 0
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		done++
		for _, d := range dependents[n] {
			if indeg[d]--; indeg[d] == 0 {
				queue = append(queue, d)
			}
		}
	}
	if done != len(w.Steps) {
		t.Fatalf("no topological order: %d of %d steps sorted", done, len(w.Steps))
	}
}
