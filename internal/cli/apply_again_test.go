package cli_test

import (
	"fmt"
	"strings"
	"testing"
)

// TestApplyTwiceReadsWhatTheServerReads: the server reads a definition starting with a
// byte-order mark, trailing commas and comments (as YAML); applying the
// same file a second time reports "unchanged", not already_exists.
// (Found by an audit, for the byte-order mark.)
func TestApplyTwiceReadsWhatTheServerReads(t *testing.T) {
	url := startServer(t)
	for name, doc := range map[string]string{
		"bom.json":     "\ufeff" + `{"name": "wf-bom", "tasks": {"a": {"sleep": "1s"}}}`,
		"bom.yaml":     "\ufeff" + "name: wf-bomy\ntasks:\n  a:\n    sleep: 1s\n",
		"comma.json":   `{"name": "wf-comma", "tasks": {"a": {"sleep": "1s"}},}`,
		"comment.json": "# c\n" + `{"name": "wf-comment", "tasks": {"a": {"sleep": "1s"}}}`,
	} {
		f := writeFile(t, name, doc)
		first := ferryCLI(t, url, "apply", "-f", f)
		second := ferryCLI(t, url, "apply", "-f", f)
		if first.code != 0 || second.code != 0 || !strings.Contains(second.stdout, "unchanged") {
			t.Errorf("%s: first %+v; second %+v", name, first, second)
		}
	}
}

// TestWorkflowsPageHintAndLimit: `ferry workflows --cursor C` (no --limit) shows a
// default page (50); the hint for the next page must not shrink it to 1.
func TestWorkflowsPageHintAndLimit(t *testing.T) {
	url := startServer(t)
	for i := range 102 {
		f := writeFile(t, fmt.Sprintf("w%d.json", i), fmt.Sprintf(`{"name": "wf-%03d", "tasks": {"a": {"sleep": "1s"}}}`, i))
		ok(t, url, "apply", "-f", f)
	}
	r := ferryCLI(t, url, "workflows", "--cursor", "wf-000")
	rows := strings.Count(r.stdout, "\n") - 1
	if strings.Contains(r.stderr, "--limit 1 ") {
		t.Errorf("page of %d rows; hint: %q (following it shows 1 row a page)", rows, strings.TrimSpace(r.stderr))
	}
	if !strings.Contains(r.stderr, "more workflows: ferry workflows --cursor ") {
		t.Errorf("hint %q, want the next page with the same default size", strings.TrimSpace(r.stderr))
	}
	for _, cmd := range [][]string{{"workflows", "--limit", "-1"}, {"workflows", "--limit", "0"}, {"runs", "wf-000", "--limit", "-1"}} {
		if r := ferryCLI(t, url, cmd...); r.code == 0 || !strings.Contains(r.stderr, "--limit must be from 1 to 500") {
			t.Errorf("%v accepted (help: 1-500): code %d, stderr %q", cmd, r.code, strings.TrimSpace(r.stderr))
		}
	}
}
