package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/cli"
)

// The request examples of the docs (every curl command in README.md,
// docs/api.md and docs/workers.md) are sent, as written, to a real server,
// and what it answers is held against the documented answer: the status
// (a "**201 Created**" line or an HTTP block after the command) and the
// JSON's shape: the same fields at every level, the same values except ids,
// times, tokens and timings. Each example names the state it needs (a
// workflow, a run, a claimed task) in docSetups; an example without one
// fails, so a new example gets tested too.

// docExample is one ```sh block with curl commands, and the answer the doc
// shows for it.
type docExample struct {
	file   string
	line   int
	cmds   [][]string // argv of each curl command in the block
	status int        // the documented HTTP status; 0 when none is shown
	resp   string     // the documented JSON answer; "" when none is shown
}

func (x docExample) String() string { return fmt.Sprintf("%s:%d", x.file, x.line) }

// key names the example by its first command's method and path.
func (x docExample) key() string {
	method, u, _, _ := parseCurl(x.cmds[0])
	if i := strings.IndexAny(u, "?"); i >= 0 {
		u = u[:i]
	}
	for _, host := range []string{"$FERRY_URL", "localhost:8080", "https://ferry.example.com"} {
		u = strings.TrimPrefix(u, host)
	}
	return method + " " + u
}

var (
	blockRe  = regexp.MustCompile("(?ms)^[ \t]*```(\\w*)\n(.*?)^[ \t]*```")
	statusRe = regexp.MustCompile(`\*\*(\d{3})\s+[A-Za-z][A-Za-z \n]*\*\*`)
	httpRe   = regexp.MustCompile(`^HTTP/1\.1 (\d{3})`)
)

// docExamples extracts the curl examples of a markdown file.
func docExamples(t *testing.T, file string) []docExample {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("../..", file))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	var out []docExample
	var cur *docExample
	prev := 0
	for _, m := range blockRe.FindAllStringSubmatchIndex(doc, -1) {
		between := doc[prev:m[0]]
		prev = m[1]
		lang, body := doc[m[2]:m[3]], dedent(doc[m[4]:m[5]])
		if cur != nil && cur.status == 0 {
			if s := statusRe.FindStringSubmatch(between); s != nil {
				cur.status, _ = strconv.Atoi(s[1])
			}
		}
		switch {
		case lang == "sh" && strings.Contains(body, "curl "):
			if cur != nil {
				out = append(out, *cur)
			}
			cur = &docExample{file: file, line: strings.Count(doc[:m[0]], "\n") + 1}
			for _, argv := range shellWords(t, body) {
				if len(argv) > 0 && argv[0] == "curl" {
					cur.cmds = append(cur.cmds, argv)
				}
			}
		case cur == nil:
		case lang == "http" && cur.status == 0:
			head, rest, _ := strings.Cut(body, "\n\n")
			if s := httpRe.FindStringSubmatch(head); s != nil {
				cur.status, _ = strconv.Atoi(s[1])
				cur.resp = rest
			}
		case lang == "json" && cur.status != 0 && cur.resp == "":
			cur.resp = body
		}
	}
	if cur != nil {
		out = append(out, *cur)
	}
	return out
}

// dedent drops the indentation a block has inside a list item.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	indent := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if n := len(l) - len(strings.TrimLeft(l, " ")); indent < 0 || n < indent {
			indent = n
		}
	}
	for i, l := range lines {
		if len(l) >= indent && indent > 0 {
			lines[i] = l[indent:]
		}
	}
	return strings.Join(lines, "\n")
}

// shellWords splits a shell script into commands and their words, as sh
// would for what the docs write: quotes, backslash-newline, comments.
func shellWords(t *testing.T, s string) [][]string {
	t.Helper()
	var cmds [][]string
	var words []string
	var w strings.Builder
	inWord := false
	end := func() {
		if inWord {
			words = append(words, w.String())
			w.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s) && s[i+1] == '\n':
			i++
		case c == '\n':
			end()
			if len(words) > 0 {
				cmds = append(cmds, words)
				words = nil
			}
		case c == ' ' || c == '\t':
			end()
		case c == '#' && !inWord:
			for i < len(s) && s[i] != '\n' {
				i++
			}
			i--
		case c == '\'' || c == '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				t.Fatalf("unterminated quote in %q", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			inWord = true
			i += j + 1
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	end()
	if len(words) > 0 {
		cmds = append(cmds, words)
	}
	return cmds
}

// parseCurl reads the curl options the docs use.
func parseCurl(argv []string) (method, u string, headers [][2]string, data string) {
	hasData := false
	for i := 1; i < len(argv); i++ {
		switch a := argv[i]; a {
		case "-X":
			i++
			method = argv[i]
		case "-H":
			i++
			k, v, _ := strings.Cut(argv[i], ":")
			headers = append(headers, [2]string{strings.TrimSpace(k), strings.TrimSpace(v)})
		case "-d", "--data-binary", "--data":
			i++
			data, hasData = argv[i], true
		case "-o":
			i++
		case "-s", "-S", "-sS", "-i":
		default:
			if strings.HasPrefix(a, "-") {
				panic("curl option the docs test does not know: " + a)
			}
			u = a
		}
	}
	if method == "" {
		method = "GET"
		if hasData {
			method = "POST"
		}
	}
	return method, u, headers, data
}

// docState is what an example's setup made: its doc → real substitutions,
// and the files its commands read (-d @FILE).
type docState struct {
	subst map[string]string
	files map[string]string
}

// docSetups prepares the state each example needs, by key (method and
// path as written). The examples' own requests give the definitions and
// inputs, so the state is the one the doc describes.
func docSetups(all []docExample) map[string]func(e *env, s *docState) {
	body := func(key string) string {
		for _, x := range all {
			if x.key() == key && x.status/100 == 2 {
				_, _, _, d := parseCurl(x.cmds[0])
				return d
			}
		}
		panic("no example " + key)
	}
	const (
		docRun       = "0195f3a2-8a10-7c3d-b1e2-3f4a5b6c7d8e"
		docTask      = "01a200be-4ad5-73b4-8c9a-fa7428228c3c"
		docTask2     = "01a200be-4ad5-73b4-8c9a-fa7428228c3d"
		docToken     = "B2VCYOQIRKJ6WZ7H4D5SRKFQDD"
		docFailTask  = "01a200be-6f25-79e2-b02e-1b6ac0313e2e"
		docFailToken = "4HRHEUJVG3H7RCJTW4LBMN4L32"
	)
	// The workflow as the doc creates it (its URLs, so its fingerprint),
	// for the examples that run nothing...
	orderProcessing := func(e *env, s *docState) {
		e.mustCall(201, "POST", "/api/v1/workflows", body("POST /api/v1/workflows"))
	}
	// ...and calling the upstream, for those that run it.
	runnable := func(e *env, s *docState) { e.createWorkflow(body("POST /api/v1/workflows")) }
	completedRun := func(e *env, s *docState) {
		runnable(e, s)
		id := e.trigger("order-processing", body("POST /api/v1/workflows/order-processing/trigger"))
		e.waitStatus(id, "completed")
		s.subst[docRun] = id
	}
	// A run waiting for its callback (the doc's cancel answer).
	waitingRun := func(e *env, s *docState) string {
		e.createWorkflow(`{"name": "checkout-flow", "tasks": {"payment-result": {"wait_for_webhook": {"timeout": "1h"}}}}`)
		id := e.trigger("checkout-flow", `{"amount": 4200}`)
		e.waitStep(id, "payment-result", "waiting")
		s.subst[docRun] = id
		return id
	}
	claimed := func(e *env, s *docState, create, docID, docTok string) {
		id := e.mustCall(201, "POST", "/api/v1/tasks", create)["data"].(map[string]any)["id"].(string)
		var typ struct{ Type string }
		_ = json.Unmarshal([]byte(create), &typ)
		got := e.mustCall(200, "POST", "/api/v1/tasks/claim", `{"types": ["`+typ.Type+`"]}`)["data"].([]any)
		if len(got) != 1 || got[0].(map[string]any)["id"] != id {
			e.t.Fatalf("claim: %v", got)
		}
		s.subst[docID] = id
		if docTok != "" {
			s.subst[docTok] = got[0].(map[string]any)["lease_token"].(string)
		}
	}
	invoice := func(e *env, s *docState) {
		claimed(e, s, body("POST /api/v1/tasks"), docTask, docToken)
	}
	return map[string]func(e *env, s *docState){
		// README.md
		"POST /api/v1/workflows": func(e *env, s *docState) {
			s.files["order-processing.json"] = body("POST /api/v1/workflows")
			s.files["order-processing.yaml"] = orderProcessingYAML
		},
		// docs/api.md
		"GET /api/v1/workflows":                  orderProcessing,
		"GET /api/v1/workflows/order-processing": orderProcessing,
		"PUT /api/v1/workflows/order-processing": func(e *env, s *docState) {
			orderProcessing(e, s)
			s.files["order-processing.json"] = body("POST /api/v1/workflows")
		},
		"DELETE /api/v1/workflows/order-processing":       orderProcessing,
		"POST /api/v1/workflows/order-processing/trigger": runnable,
		"POST /api/v1/workflows/order-processing/trigger-batch": func(e *env, s *docState) {
			// The answer shows the keyed run still running: its charge
			// is held until the test ends.
			hold := make(chan struct{})
			e.t.Cleanup(func() { close(hold) })
			e.up.handle("/api/charge", func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-hold:
				case <-r.Context().Done():
				}
			})
			runnable(e, s)
			e.trigger("order-processing", body("POST /api/v1/workflows/order-processing/trigger"), "Idempotency-Key", "order-123")
		},
		"GET /api/v1/workflows/order-processing/runs":           completedRun,
		"GET /api/v1/workflows/order-processing/runs/" + docRun: completedRun,
		"GET /api/v1/runs/" + docRun + "/events":                completedRun,
		"POST /api/v1/runs/" + docRun + "/cancel":               func(e *env, s *docState) { waitingRun(e, s) },
		"POST /wh/wh_CCFS5TA5A763Y2LCXACEAPT3CK": func(e *env, s *docState) {
			id := waitingRun(e, s)
			cb := task(e.run(id), "payment-result")["callback_url"].(string)
			s.subst["wh_CCFS5TA5A763Y2LCXACEAPT3CK"] = cb[strings.LastIndex(cb, "/")+1:]
		},
		"GET /healthz":      nil,
		"GET /metrics":      nil,
		"GET /openapi.yaml": nil,
		// docs/workers.md
		"POST /api/v1/tasks":                           nil,
		"POST /api/v1/tasks/claim":                     func(e *env, s *docState) { e.mustCall(201, "POST", "/api/v1/tasks", body("POST /api/v1/tasks")) },
		"POST /api/v1/tasks/" + docTask + "/heartbeat": invoice,
		"POST /api/v1/tasks/" + docTask + "/complete":  invoice,
		"POST /api/v1/tasks/complete": func(e *env, s *docState) {
			invoice(e, s)
			claimed(e, s, `{"type": "billing.invoice.v1", "payload": {"order_id": 43}}`, docTask2, "")
		},
		"POST /api/v1/tasks/" + docFailTask + "/fail": func(e *env, s *docState) {
			claimed(e, s, `{"type": "email.send.v1", "payload": {"to": "a@example.com"}, "max_attempts": 3, "retry_delay": "2s"}`, docFailTask, docFailToken)
		},
		"PUT /api/v1/task-types/billing.invoice.v1": nil,
	}
}

// orderProcessingYAML is api.md's create example in YAML (the file its
// YAML curl sends).
const orderProcessingYAML = `name: order-processing
trigger: api
tasks:
  charge:
    url: https://myapp.com/api/charge
    method: POST
    headers:
      Authorization: "Bearer {{trigger.body.token}}"
    body:
      order_id: "{{trigger.body.order_id}}"
    retries: 3
    timeout: 30000
  send-receipt:
    needs: [charge]
    if: tasks.charge.status_code == 200
    url: https://myapp.com/api/send-receipt
    method: POST
    body:
      email: "{{trigger.body.email}}"
`

func TestDocRequestExamples(t *testing.T) {
	var all []docExample
	for _, f := range []string{"README.md", "docs/api.md", "docs/workers.md"} {
		all = append(all, docExamples(t, f)...)
	}
	if len(all) < 25 {
		t.Fatalf("found %d curl examples; the docs lost theirs?", len(all))
	}
	setups := docSetups(all)
	for _, x := range all {
		t.Run(x.String(), func(t *testing.T) {
			setup, ok := setups[x.key()]
			if !ok {
				t.Fatalf("example %s (%s) has no setup in docSetups", x, x.key())
			}
			e := newEnv(t, "sqlite:"+filepath.Join(t.TempDir(), "ferry.db"))
			e.up.handle("/api/charge", jsonReply(200, `{"charge_id": "ch_123", "amount": 4200}`))
			e.up.handle("/api/send-receipt", jsonReply(200, `{"sent": true}`))
			s := &docState{subst: map[string]string{}, files: map[string]string{}}
			if x.file == "README.md" {
				s.files["order.json"] = strings.ReplaceAll(readmeWorkflow(t), "https://httpbin.org", e.up.URL)
			}
			if setup != nil {
				setup(e, s)
			}
			for i, argv := range x.cmds {
				status, raw, ctype := e.curl(s, argv)
				last := i == len(x.cmds)-1
				switch {
				case last && x.status != 0 && status != x.status:
					t.Fatalf("%s: status %d, documented %d: %s", strings.Join(argv, " "), status, x.status, raw)
				case status/100 != 2 && (!last || x.status == 0):
					t.Fatalf("%s: status %d: %s", strings.Join(argv, " "), status, raw)
				}
				if !last || x.resp == "" {
					continue
				}
				var want, got any
				if err := json.Unmarshal([]byte(x.resp), &want); err != nil {
					t.Fatalf("documented answer is not JSON: %v\n%s", err, x.resp)
				}
				if !strings.HasPrefix(ctype, "application/json") {
					t.Fatalf("answer's Content-Type is %q", ctype)
				}
				if err := json.Unmarshal(raw, &got); err != nil {
					t.Fatalf("answer is not JSON: %v\n%s", err, raw)
				}
				for _, p := range docShapeDiff("", want, got) {
					t.Errorf("documented answer differs: %s", p)
				}
				if t.Failed() {
					t.Logf("answer: %s", raw)
				}
			}
		})
	}
}

// curl sends one documented curl command to the test server.
func (e *env) curl(s *docState, argv []string) (int, []byte, string) {
	e.t.Helper()
	method, u, headers, data := parseCurl(argv)
	sub := func(v string) string {
		v = strings.NewReplacer("$FERRY_URL", e.url, "$FERRY_API_KEY", apiKey,
			"https://ferry.example.com", e.url, "localhost:8080", strings.TrimPrefix(e.url, "http://")).Replace(v)
		for from, to := range s.subst {
			v = strings.ReplaceAll(v, from, to)
		}
		return v
	}
	u = sub(u)
	if !strings.Contains(u, "://") {
		u = "http://" + u
	}
	if strings.HasPrefix(data, "@") {
		f, ok := s.files[data[1:]]
		if !ok {
			e.t.Fatalf("%s reads %s, which the example's setup does not provide", strings.Join(argv, " "), data)
		}
		data = f
	}
	data = sub(data)
	var body io.Reader
	if data != "" {
		body = strings.NewReader(data)
	}
	if _, err := url.Parse(u); err != nil {
		e.t.Fatal(err)
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if data != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // as curl -d sends it
	}
	for _, h := range headers {
		req.Header.Set(h[0], sub(h[1]))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, resp.Header.Get("Content-Type")
}

var docVarying = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`), "<id>"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), "<time>"},
	{regexp.MustCompile(`https?://[^/"]+/wh/wh_[A-Z2-7]{26}`), "<callback>"},
	{regexp.MustCompile(`^[A-Z2-7]{26}$`), "<lease token>"},
}

// docShapeDiff lists where a documented JSON answer and a real one differ:
// fields missing or extra at any level, and values, but for ids, times,
// tokens and timings, which differ from run to run.
func docShapeDiff(at string, want, got any) []string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: documented an object, got %v", at, short(got))}
		}
		var out []string
		var keys []string
		for k := range w {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if _, ok := g[k]; !ok {
				out = append(out, fmt.Sprintf("%s: documented field %q is missing", at, k))
				continue
			}
			out = append(out, docShapeDiff(at+"."+k, w[k], g[k])...)
		}
		if !strings.HasSuffix(at, ".headers") { // an HTTP response's headers: the doc shows some
			for k := range g {
				if _, ok := w[k]; !ok {
					out = append(out, fmt.Sprintf("%s: field %q is not documented", at, k))
				}
			}
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{fmt.Sprintf("%s: documented %d items, got %v", at, len(w), short(got))}
		}
		var out []string
		for i := range w {
			out = append(out, docShapeDiff(fmt.Sprintf("%s[%d]", at, i), w[i], g[i])...)
		}
		return out
	case string:
		g, ok := got.(string)
		if !ok {
			return []string{fmt.Sprintf("%s: documented %q, got %v", at, w, short(got))}
		}
		norm := func(s string) string {
			for _, v := range docVarying {
				s = v.re.ReplaceAllString(s, v.repl)
			}
			return s
		}
		if norm(w) != norm(g) {
			return []string{fmt.Sprintf("%s: documented %q, got %q", at, w, g)}
		}
	case float64:
		if _, ok := got.(float64); !ok {
			return []string{fmt.Sprintf("%s: documented %v, got %v", at, w, short(got))}
		}
		if k := at[strings.LastIndex(at, ".")+1:]; k != "duration_ms" && k != "retry_in_ms" && w != got {
			return []string{fmt.Sprintf("%s: documented %v, got %v", at, w, got)}
		}
	default:
		if want != got {
			return []string{fmt.Sprintf("%s: documented %v, got %v", at, short(want), short(got))}
		}
	}
	return nil
}

func short(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 200 {
		b = append(b[:200], "…"...)
	}
	return string(b)
}

// readmeWorkflow is the README's order.json.
func readmeWorkflow(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<<'EOF'\n(.*?)\nEOF").FindStringSubmatch(string(doc))
	if m == nil {
		t.Fatal("README has no workflow heredoc")
	}
	return m[1]
}

// TestReadmeCLIExample runs the README's ferry commands, in order, against
// a server: apply, trigger, runs, run, cancel.
func TestReadmeCLIExample(t *testing.T) {
	e := newEnv(t, "sqlite:"+filepath.Join(t.TempDir(), "ferry.db"))
	dir := t.TempDir()
	order := filepath.Join(dir, "order.json")
	if err := os.WriteFile(order, []byte(e.seed(strings.ReplaceAll(readmeWorkflow(t), "https://httpbin.org", "https://myapp.com"))), 0o600); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	runID, n := "", 0
	for _, m := range blockRe.FindAllStringSubmatch(string(doc), -1) {
		for _, argv := range shellWords(t, m[2]) {
			if argv[0] != "./ferry" {
				continue
			}
			n++
			args := []string{"--server", e.url, "--api-key", apiKey}
			for _, a := range argv[1:] {
				switch a {
				case "order.json":
					a = order
				case "<run_id>":
					if runID == "" {
						t.Fatalf("%v: no run triggered before", argv)
					}
					a = runID
				}
				args = append(args, a)
			}
			var out, errb bytes.Buffer
			if code := cli.Execute(context.Background(), args, &out, &errb); code != 0 {
				t.Fatalf("%s: exit %d: %s%s", strings.Join(argv, " "), code, out.String(), errb.String())
			}
			if argv[1] == "trigger" {
				f := strings.Fields(out.String())
				if len(f) != 3 || f[0] != "run" {
					t.Fatalf("trigger printed %q", out.String())
				}
				runID = f[1]
			}
		}
	}
	if n < 5 {
		t.Fatalf("found %d ferry commands in README.md", n)
	}
}

// TestDocErrorExamples provokes every one-line error answer that
// docs/api.md and docs/workers.md show, and holds the server's answer
// against it.
func TestDocErrorExamples(t *testing.T) {
	send := func(e *env, method, path, key, body string) (int, []byte) {
		req, _ := http.NewRequest(method, e.url+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, raw
	}
	var lastRun string // the run waiting made
	waiting := func(e *env) string {
		e.createWorkflow(`{"name": "checkout-flow", "tasks": {"payment-result": {"wait_for_webhook": {"timeout": "1h"}}}}`)
		id := e.trigger("checkout-flow", `{}`)
		lastRun = id
		cb := task(e.waitStep(id, "payment-result", "waiting"), "payment-result")["callback_url"].(string)
		return cb[strings.Index(cb, "/wh/"):]
	}
	const sleepy = `{"name": "order-processing", "tasks": {"a": {"sleep": "1h"}}}`
	provoke := map[string]func(e *env) (int, []byte){
		`{"error": {"code": "unauthorized", "message": "missing API key: send Authorization: Bearer <key>"}}`: func(e *env) (int, []byte) {
			return send(e, "GET", "/api/v1/workflows", "", "")
		},
		`{"error": {"code": "unauthorized", "message": "invalid API key"}}`: func(e *env) (int, []byte) {
			return send(e, "GET", "/api/v1/workflows", "fry_nope", "")
		},
		`{"error": {"code": "already_exists", "message": "workflow \"order-processing\" already exists"}}`: func(e *env) (int, []byte) {
			e.createWorkflow(sleepy)
			return send(e, "POST", "/api/v1/workflows", apiKey, sleepy)
		},
		`{"error": {"code": "not_found", "message": "workflow \"order-processing\": not found"}}`: func(e *env) (int, []byte) {
			return send(e, "GET", "/api/v1/workflows/order-processing", apiKey, "")
		},
		`{"error": {"code": "workflow_disabled", "message": "workflow \"order-processing\": workflow is disabled"}}`: func(e *env) (int, []byte) {
			e.createWorkflow(`{"name": "order-processing", "enabled": false, "tasks": {"a": {"sleep": "1h"}}}`)
			return send(e, "POST", "/api/v1/workflows/order-processing/trigger", apiKey, "{}")
		},
		`{"error": {"code": "not_found", "message": "run \"0195f3a2-8a10-7c3d-b1e2-3f4a5b6c7d8e\" does not belong to workflow \"checkout-flow\""}}`: func(e *env) (int, []byte) {
			e.createWorkflow(`{"name": "checkout-flow", "tasks": {"a": {"sleep": "1h"}}}`)
			e.createWorkflow(sleepy)
			id := e.trigger("order-processing", "{}")
			return send(e, "GET", "/api/v1/workflows/checkout-flow/runs/"+id, apiKey, "")
		},
		`{"error": {"code": "run_finished", "message": "run 0195f3a2-8a10-7c3d-b1e2-3f4a5b6c7d8e is completed: run already finished"}}`: func(e *env) (int, []byte) {
			e.createWorkflow(`{"name": "order-processing", "tasks": {"charge": {"url": "https://myapp.com/api/charge"}}}`)
			id := e.trigger("order-processing", "{}")
			e.waitStatus(id, "completed")
			return send(e, "POST", "/api/v1/runs/"+id+"/cancel", apiKey, "")
		},
		`{"error": {"code": "already_delivered", "message": "step payment-result: webhook already delivered"}}`: func(e *env) (int, []byte) {
			wh := waiting(e)
			if code, raw := send(e, "POST", wh, "", `{"status": "paid"}`); code != 202 {
				t.Fatalf("first callback: %d %s", code, raw)
			}
			return send(e, "POST", wh, "", `{"status": "paid"}`)
		},
		`{"error": {"code": "step_finished", "message": "step payment-result is timeout and no longer accepts callbacks: step already finished"}}`: func(e *env) (int, []byte) {
			wh := waiting(e)
			e.clock.Advance(2 * time.Hour) // past the wait's timeout
			// The message the example shows is the one once the timer has
			// ended the step (before that: "timed out at …"): wait for it,
			// or the example races the timer loop.
			e.waitStep(lastRun, "payment-result", "timeout")
			return send(e, "POST", wh, "", `{"status": "paid"}`)
		},
		`{"error": {"code": "not_found", "message": "unknown callback token"}}`: func(e *env) (int, []byte) {
			return send(e, "POST", "/wh/wh_CCFS5TA5A763Y2LCXACEAPT3CK", "", "{}")
		},
		`{"error": {"code": "invalid_request", "message": "unknown field \"prio\"", "details": [{"path": "prio", "code": "invalid_request", "message": "unknown field \"prio\""}]}}`: func(e *env) (int, []byte) {
			return send(e, "POST", "/api/v1/tasks", apiKey, `{"type": "billing.invoice.v1", "prio": 1}`)
		},
		`{"error": {"code": "stale_lease", "message": "task 01a200be-4ad5-73b4-8c9a-fa7428228c3c: stale lease token"}}`: func(e *env) (int, []byte) {
			id := e.mustCall(201, "POST", "/api/v1/tasks", `{"type": "billing.invoice.v1"}`)["data"].(map[string]any)["id"].(string)
			e.mustCall(200, "POST", "/api/v1/tasks/claim", `{"types": ["billing.%"]}`)
			return send(e, "POST", "/api/v1/tasks/"+id+"/heartbeat", apiKey, `{"lease_token": "B2VCYOQIRKJ6WZ7H4D5SRKFQDD"}`)
		},
	}
	// GET /healthz's 503 needs a database that cannot be reached.
	untested := map[string]bool{`{"error": "database unreachable", "status": "unavailable"}`: true}
	codes := map[string]int{"unauthorized": 401, "not_found": 404, "already_exists": 409, "workflow_disabled": 409,
		"run_finished": 409, "already_delivered": 409, "step_finished": 409, "invalid_request": 400, "stale_lease": 409}
	n := 0
	for _, f := range []string{"docs/api.md", "docs/workers.md"} {
		raw, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, `{"error": `) || untested[line] {
				continue
			}
			n++
			t.Run(fmt.Sprintf("%s_%d", f, n), func(t *testing.T) {
				p, ok := provoke[line]
				if !ok {
					t.Fatalf("no way to provoke the documented error %s", line)
				}
				var want struct {
					Error struct{ Code string }
				}
				if err := json.Unmarshal([]byte(line), &want); err != nil {
					t.Fatal(err)
				}
				e := newEnv(t, "sqlite:"+filepath.Join(t.TempDir(), "ferry.db"))
				code, body := p(e)
				if code != codes[want.Error.Code] {
					t.Errorf("status %d for %s", code, want.Error.Code)
				}
				var w, g any
				_ = json.Unmarshal([]byte(line), &w)
				if err := json.Unmarshal(body, &g); err != nil {
					t.Fatalf("answer is not JSON: %s", body)
				}
				for _, d := range docShapeDiff("", w, g) {
					t.Errorf("documented error differs: %s", d)
				}
			})
		}
	}
	if n < 10 {
		t.Fatalf("found %d documented errors", n)
	}
}
