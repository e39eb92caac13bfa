package e2e

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/expr"
	"github.com/ferryhq/ferry/internal/spec"
)

var fence = regexp.MustCompile("(?s)```(json|yaml|)\n(.*?)```")

// TestWorkflowFormatDocExamples parses every workflow example in
// docs/workflow-format.md, and every condition in its bare code blocks.
func TestWorkflowFormatDocExamples(t *testing.T) {
	doc, err := os.ReadFile("../../docs/workflow-format.md")
	if err != nil {
		t.Fatal(err)
	}
	workflows, conditions := 0, 0
	for _, m := range fence.FindAllStringSubmatch(string(doc), -1) {
		lang, body := m[1], m[2]
		switch {
		case lang == "json" || lang == "yaml":
			if !strings.Contains(body, "name") {
				continue
			}
			workflows++
			if _, err := spec.Parse([]byte(body), spec.DefaultLimits); err != nil {
				t.Errorf("example does not parse: %v\n%s", err, body)
			}
		case lang == "" && strings.Contains(body, "tasks."):
			for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
				conditions++
				if _, err := expr.ParseCondition(line); err != nil {
					t.Errorf("condition %q: %v", line, err)
				}
			}
		}
	}
	if workflows < 4 || conditions < 4 {
		t.Errorf("found %d workflow examples and %d conditions; the doc lost its examples?", workflows, conditions)
	}
}

// TestReadmeExampleParses keeps the README's first workflow valid.
func TestReadmeExampleParses(t *testing.T) {
	if _, err := spec.Parse([]byte(readmeWorkflow(t)), spec.DefaultLimits); err != nil {
		t.Errorf("README example: %v", err)
	}
}
