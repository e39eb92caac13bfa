package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

const testKey = ferrytest.Key

// startServer runs a real engine and returns its URL.
func startServer(t *testing.T) string {
	t.Helper()
	return ferrytest.Start(t).URL
}

type result struct {
	stdout, stderr string
	code           int
}

// ferryCLI runs the ferry command line against the server at url.
func ferryCLI(t *testing.T, url string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	all := append([]string{"--server", url, "--api-key", testKey}, args...)
	code := cli.Execute(context.Background(), all, &out, &errb)
	return result{out.String(), errb.String(), code}
}

// ok runs a command that must succeed and returns its standard output.
func ok(t *testing.T, url string, args ...string) string {
	t.Helper()
	r := ferryCLI(t, url, args...)
	if r.code != 0 {
		t.Fatalf("ferry %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

var runLine = regexp.MustCompile(`^run (\S+) (\S+)$`)

// triggerRun triggers a workflow and returns the run id from the first line.
func triggerRun(t *testing.T, url string, args ...string) string {
	t.Helper()
	out := ok(t, url, append([]string{"trigger"}, args...)...)
	first, _, _ := strings.Cut(out, "\n")
	m := runLine.FindStringSubmatch(first)
	if m == nil {
		t.Fatalf("trigger first line %q is not \"run <id> <status>\"", first)
	}
	return m[1]
}

// stepRows returns the rows of the step table of `ferry run` output, keyed
// by step name, and the names in order.
func stepRows(t *testing.T, out string) (map[string][]string, []string) {
	t.Helper()
	rows := map[string][]string{}
	var order []string
	inTable := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && f[0] == "STEP":
			inTable = true
			want := []string{"STEP", "TYPE", "STATUS", "CODE", "DURATION", "ATTEMPT", "ERROR"}
			if strings.Join(f, " ") != strings.Join(want, " ") {
				t.Fatalf("step table header = %q", line)
			}
		case inTable && len(f) == 0:
			inTable = false
		case inTable:
			if len(f) < 7 {
				t.Fatalf("short step row %q", line)
			}
			rows[f[0]] = f
			order = append(order, f[0])
		}
	}
	return rows, order
}

// waitFor polls `ferry run ID` until cond holds on its output.
func waitFor(t *testing.T, url, id string, cond func(out string) bool) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out := ok(t, url, "run", id)
		if cond(out) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: condition not met before deadline; last output:\n%s", id, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestApply(t *testing.T) {
	url := startServer(t)

	jsonFile := writeFile(t, "order.json", `{"name": "order-processing", "tasks": {"charge": {"sleep": "1s"}}}`)
	for _, want := range []string{
		"workflow order-processing created (version 1)\n",
		"workflow order-processing unchanged (version 1)\n",
	} {
		if got := ok(t, url, "apply", "-f", jsonFile); got != want {
			t.Fatalf("apply json: got %q, want %q", got, want)
		}
	}
	if err := os.WriteFile(jsonFile, []byte(`{"name": "order-processing", "tasks": {"charge": {"sleep": "2s"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := ok(t, url, "apply", "-f", jsonFile), "workflow order-processing updated (version 2)\n"; got != want {
		t.Fatalf("apply changed json: got %q, want %q", got, want)
	}
	if got, want := ok(t, url, "apply", "-f", jsonFile), "workflow order-processing unchanged (version 2)\n"; got != want {
		t.Fatalf("apply json again: got %q, want %q", got, want)
	}

	yamlDoc := "# a comment\nname: nightly\ntasks:\n  first:\n    sleep: 5s\n  second:\n    needs: [first]\n    sleep: 1s\n"
	yamlFile := writeFile(t, "nightly.yaml", yamlDoc)
	for _, want := range []string{
		"workflow nightly created (version 1)\n",
		"workflow nightly unchanged (version 1)\n",
	} {
		if got := ok(t, url, "apply", "-f", yamlFile); got != want {
			t.Fatalf("apply yaml: got %q, want %q", got, want)
		}
	}
	if err := os.WriteFile(yamlFile, []byte(strings.Replace(yamlDoc, "5s", "6s", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := ok(t, url, "apply", "-f", yamlFile), "workflow nightly updated (version 2)\n"; got != want {
		t.Fatalf("apply changed yaml: got %q, want %q", got, want)
	}

	// -f - reads standard input.
	root := cli.NewRoot()
	var out bytes.Buffer
	root.SetArgs([]string{"--server", url, "--api-key", testKey, "apply", "-f", "-"})
	root.SetIn(strings.NewReader(strings.Replace(yamlDoc, "5s", "6s", 1)))
	root.SetOut(&out)
	root.SetErr(&out)
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "workflow nightly unchanged (version 2)\n"; got != want {
		t.Fatalf("apply stdin: got %q, want %q", got, want)
	}

	// The list: a header and one row per workflow, by name.
	list := ok(t, url, "workflows")
	lines := strings.Split(strings.TrimSpace(list), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "NAME VERSION TASKS ENABLED UPDATED" {
		t.Fatalf("workflows:\n%s", list)
	}
	if f := strings.Fields(lines[1]); f[0] != "nightly" || f[1] != "2" || f[2] != "2" || f[3] != "true" {
		t.Fatalf("nightly row %q", lines[1])
	}
	if f := strings.Fields(lines[2]); f[0] != "order-processing" || f[1] != "2" || f[2] != "1" {
		t.Fatalf("order-processing row %q", lines[2])
	}
	// One page at a time: the rest is announced on stderr.
	r := ferryCLI(t, url, "workflows", "--limit", "1")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stderr, "--cursor nightly") {
		t.Fatalf("workflows --limit 1: %+v", r)
	}

	var wfs []map[string]any
	if err := json.Unmarshal([]byte(ok(t, url, "workflows", "-o", "json")), &wfs); err != nil || len(wfs) != 2 || wfs[0]["name"] != "nightly" {
		t.Fatalf("workflows -o json: %v %v", wfs, err)
	}

	show := ok(t, url, "workflow", "nightly")
	for _, want := range []string{"name          nightly", "version       2", `"sleep": "6s"`} {
		if !strings.Contains(show, want) {
			t.Fatalf("workflow output lacks %q:\n%s", want, show)
		}
	}
	var wf map[string]any
	if err := json.Unmarshal([]byte(ok(t, url, "workflow", "nightly", "-o", "json")), &wf); err != nil || wf["version"] != 2.0 || wf["tasks"] == nil {
		t.Fatalf("workflow -o json: %v %v", wf, err)
	}

	if got := ok(t, url, "delete", "nightly"); got != "workflow nightly deleted\n" {
		t.Fatalf("delete: %q", got)
	}
	// With -o json, the API's data as JSON: a 204 has none (it printed
	// the table form's sentence, which no JSON reader takes).
	if got := ok(t, url, "delete", "order-processing", "-o", "json"); got != "" {
		t.Fatalf("delete -o json: %q, want nothing", got)
	}
	r = ferryCLI(t, url, "workflow", "nightly")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "error: not_found: ") || r.stdout != "" {
		t.Fatalf("show deleted: %+v", r)
	}
}

func TestTriggerRunCancel(t *testing.T) {
	url := startServer(t)
	def := writeFile(t, "slow.json", `{"name": "slow", "tasks": {
		"zz-nap": {"sleep": "1h"},
		"aa-after": {"needs": ["zz-nap"], "sleep": "1s"},
		"mm-last": {"needs": ["aa-after"], "sleep": "1s"}
	}}`)
	ok(t, url, "apply", "-f", def)

	id := triggerRun(t, url, "slow", "-d", `{"order_id": 7}`)
	out := waitFor(t, url, id, func(out string) bool {
		rows, _ := stepRows(t, out)
		return rows["zz-nap"] != nil && rows["zz-nap"][2] == "sleeping"
	})
	for _, want := range []string{"run       " + id, "workflow  slow (", "version   1", "status    running"} {
		if !strings.Contains(out, want) {
			t.Fatalf("run header lacks %q:\n%s", want, out)
		}
	}
	rows, order := stepRows(t, out)
	if strings.Join(order, ",") != "zz-nap,aa-after,mm-last" {
		t.Fatalf("steps not in definition order: %v\n%s", order, out)
	}
	for _, name := range []string{"aa-after", "mm-last"} {
		if rows[name][1] != "sleep" || rows[name][2] != "pending" {
			t.Fatalf("step %s row %v", name, rows[name])
		}
	}

	// The same idempotency key twice gives the same run.
	k1 := triggerRun(t, url, "slow", "--idempotency-key", "abc")
	r := ferryCLI(t, url, "trigger", "slow", "--idempotency-key", "abc")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "run "+k1+" ") || !strings.Contains(r.stderr, "existing run") {
		t.Fatalf("repeated idempotency key: %+v (first run %s)", r, k1)
	}

	runs := ok(t, url, "runs", "slow")
	if !strings.HasPrefix(runs, "RUN ID ") || !strings.Contains(runs, id) || !strings.Contains(runs, k1) {
		t.Fatalf("runs:\n%s", runs)
	}

	if got, want := ok(t, url, "cancel", id), "run "+id+" cancelled\n"; got != want {
		t.Fatalf("cancel: got %q, want %q", got, want)
	}
	out = ok(t, url, "run", id)
	rows, _ = stepRows(t, out)
	if !strings.Contains(out, "status    cancelled") || len(rows) != 3 {
		t.Fatalf("cancelled run:\n%s", out)
	}
	for name, row := range rows {
		if row[2] != "cancelled" {
			t.Fatalf("step %s after cancel: %v", name, row)
		}
	}
	r = ferryCLI(t, url, "cancel", id)
	if r.code != 1 || !strings.Contains(r.stderr, "error: run_finished: ") {
		t.Fatalf("cancel twice: %+v", r)
	}

	events := ok(t, url, "events", id)
	if !strings.Contains(events, "run_started") || !strings.Contains(events, "run_cancelled") {
		t.Fatalf("events:\n%s", events)
	}
	var evs []struct {
		Seq  int64  `json:"seq"`
		Type string `json:"type"`
	}
	if err := json.Unmarshal([]byte(ok(t, url, "events", id, "--after", "1", "-o", "json")), &evs); err != nil || len(evs) == 0 || evs[0].Seq != 2 {
		t.Fatalf("events --after 1 -o json: %+v %v", evs, err)
	}

	// -o json keeps the tasks object in definition order.
	js := ok(t, url, "run", id, "-o", "json")
	if !json.Valid([]byte(js)) || !(strings.Index(js, `"zz-nap"`) < strings.Index(js, `"aa-after"`) && strings.Index(js, `"aa-after"`) < strings.Index(js, `"mm-last"`)) {
		t.Fatalf("run -o json:\n%s", js)
	}

	// --wait gives up after --timeout on a run that cannot finish in time.
	r = ferryCLI(t, url, "trigger", "slow", "--wait", "--timeout", "300ms")
	if r.code != 1 || !runLine.MatchString(strings.SplitN(r.stdout, "\n", 2)[0]) || !strings.Contains(r.stderr, "still running after 300ms") {
		t.Fatalf("--wait --timeout: %+v", r)
	}
}

func TestHTTPWorkflow(t *testing.T) {
	var calls, bodies = make(chan string, 10), make(chan string, 10)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b bytes.Buffer
		_, _ = b.ReadFrom(r.Body)
		calls <- r.Method + " " + r.URL.Path
		bodies <- b.String()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"charged": true}`)
	}))
	t.Cleanup(upstream.Close)
	url := startServer(t)

	def := writeFile(t, "pay.yaml", fmt.Sprintf("name: pay\ntasks:\n  charge:\n    url: %s/charge\n    body: {amount: 5}\n", upstream.URL))
	if got := ok(t, url, "apply", "-f", def); got != "workflow pay created (version 1)\n" {
		t.Fatalf("apply: %q", got)
	}
	input := writeFile(t, "input.json", `{"order_id": 42}`)
	out := ok(t, url, "trigger", "pay", "-d", "@"+input, "--wait", "--timeout", "2m")
	first, rest, _ := strings.Cut(out, "\n")
	m := runLine.FindStringSubmatch(first)
	if m == nil {
		t.Fatalf("first line %q", first)
	}
	id := m[1]
	if !strings.Contains(rest, "status    completed") {
		t.Fatalf("trigger --wait output:\n%s", out)
	}
	if got := <-calls; got != "POST /charge" {
		t.Fatalf("upstream saw %q", got)
	}
	if got := <-bodies; got != `{"amount":5}` {
		t.Fatalf("upstream body %q", got)
	}

	out = ok(t, url, "run", id)
	rows, order := stepRows(t, out)
	if len(order) != 1 {
		t.Fatalf("run:\n%s", out)
	}
	if row := rows["charge"]; row[1] != "http" || row[2] != "success" || row[3] != "200" || row[5] != "1" || row[6] != "-" {
		t.Fatalf("charge row %v\n%s", row, out)
	}
	var run struct {
		Status string `json:"status"`
		Input  struct {
			OrderID int `json:"order_id"`
		} `json:"input"`
		Tasks map[string]struct {
			StatusCode int             `json:"status_code"`
			Body       json.RawMessage `json:"body"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal([]byte(ok(t, url, "run", id, "-o", "json")), &run); err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	_ = json.Compact(&body, run.Tasks["charge"].Body)
	if run.Status != "completed" || run.Input.OrderID != 42 || run.Tasks["charge"].StatusCode != 200 || body.String() != `{"charged":true}` {
		t.Fatalf("run -o json: %+v", run)
	}
}

func TestErrors(t *testing.T) {
	url := startServer(t)

	bad := writeFile(t, "bad.json", `{"name": "orders", "tasks": {
		"charge": {"url": "https://pay.example.com/charge"},
		"send-receipt": {"needs": ["chrage"], "url": "https://mail.example.com/send"}
	}}`)
	r := ferryCLI(t, url, "apply", "-f", bad)
	if r.code != 1 || r.stdout != "" {
		t.Fatalf("invalid definition: %+v", r)
	}
	want := "error: invalid_workflow: the workflow definition is invalid\n  tasks.send-receipt.needs[0]: unknown step \"chrage\"; did you mean \"charge\"?\n"
	if r.stderr != want {
		t.Fatalf("stderr:\n%s\nwant:\n%s", r.stderr, want)
	}

	badYAML := writeFile(t, "bad.yaml", "name: orders\ntasks:\n  a:\n    sleep: soon\n")
	r = ferryCLI(t, url, "apply", "-f", badYAML)
	if r.code != 1 || !strings.Contains(r.stderr, "\n  tasks.a.sleep: ") {
		t.Fatalf("invalid yaml definition: %+v", r)
	}

	var out, errb bytes.Buffer
	code := cli.Execute(context.Background(), []string{"--server", url, "--api-key", "wrong", "workflows"}, &out, &errb)
	if code != 1 || errb.String() != "error: unauthorized: invalid API key\n" {
		t.Fatalf("wrong key: exit %d stderr %q", code, errb.String())
	}

	t.Setenv("FERRY_API_KEY", "")
	errb.Reset()
	code = cli.Execute(context.Background(), []string{"--server", url, "workflows"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "no API key") {
		t.Fatalf("no key: exit %d stderr %q", code, errb.String())
	}
	t.Setenv("FERRY_API_KEY", testKey)
	if out := ok(t, url, "workflows"); !strings.HasPrefix(out, "NAME") {
		t.Fatalf("key from FERRY_API_KEY: %q", out)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"workflows", "-o", "yaml"}, `--output "yaml"`},
		{[]string{"run"}, "usage: ferry run RUN_ID"},
		// An empty argument: runs "" asked for the runs of a workflow
		// named "runs", events "" for the events of run "events".
		{[]string{"runs", ""}, "an empty argument: usage: ferry runs NAME|ID"},
		{[]string{"events", ""}, "an empty argument: usage: ferry events RUN_ID"},
		{[]string{"trigger", " "}, "an empty argument: usage: ferry trigger NAME|ID"},
		{[]string{"run", ""}, "an empty argument: usage: ferry run RUN_ID"},
		{[]string{"apply"}, `required flag(s) "file" not set`},
		{[]string{"apply", "-f", filepath.Join(t.TempDir(), "missing.json")}, "no such file"},
		{[]string{"trigger", "nope", "-d", "{bad"}, "--data is not valid JSON"},
		{[]string{"trigger", "nope"}, "error: not_found: "},
		{[]string{"runs", "nope"}, "error: not_found: "},
		{[]string{"run", "0190f0f0-0000-7000-8000-000000000000"}, "error: not_found: "},
		{[]string{"workflows", "--limit", "9999"}, "error: invalid_parameter: limit must be"},
		{[]string{"events", "x", "--after", "-1"}, "--after must not be negative"},
		{[]string{"migrate", "--database", "sqlite:" + filepath.Join(t.TempDir(), "never.db")}, "only applies to client commands"},
	} {
		r := ferryCLI(t, url, c.args...)
		if r.code != 1 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("ferry %s: exit %d stderr %q, want %q", strings.Join(c.args, " "), r.code, r.stderr, c.want)
		}
	}
}
