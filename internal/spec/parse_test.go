package spec_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryhq/ferry/internal/spec"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustParse(t testing.TB, doc []byte) *spec.Workflow {
	t.Helper()
	w, err := spec.Parse(doc, spec.DefaultLimits)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return w
}

func compactJSON(t testing.TB, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func mustStep(t testing.TB, w *spec.Workflow, name string) *spec.Step {
	t.Helper()
	s := w.Step(name)
	if s == nil {
		t.Fatalf("step %q missing", name)
	}
	return s
}

func stepNames(w *spec.Workflow) []string {
	var out []string
	for _, s := range w.Steps {
		out = append(out, s.Name)
	}
	return out
}

func TestParseSeedOrderProcessing(t *testing.T) {
	w := mustParse(t, readTestdata(t, "order-processing.json"))
	if w.Name != "order-processing" || w.Trigger != "api" || !w.Enabled {
		t.Errorf("name/trigger/enabled = %q/%q/%v", w.Name, w.Trigger, w.Enabled)
	}
	if w.MaxDuration != 30*24*time.Hour {
		t.Errorf("MaxDuration = %v, want 30d", w.MaxDuration)
	}
	if diff := cmp.Diff([]string{"charge", "send-receipt", "notify-warehouse", "handle-failure"}, stepNames(w)); diff != "" {
		t.Errorf("step order (-want +got):\n%s", diff)
	}
	charge := mustStep(t, w, "charge")
	if charge.Type != spec.StepHTTP || charge.Method != "POST" || charge.Retries != 5 || charge.Timeout != 30*time.Second {
		t.Errorf("charge = %+v", charge)
	}
	if len(charge.Needs) != 0 || charge.Needs == nil {
		t.Errorf("charge.Needs = %#v, want empty non-nil", charge.Needs)
	}
	if charge.If != "" || charge.Cond != nil {
		t.Errorf("charge has a condition: %q", charge.If)
	}
	if !charge.HasBody || cmp.Diff(map[string]any{"order_id": "{{trigger.body.order_id}}"}, charge.Body) != "" {
		t.Errorf("charge.Body = %#v", charge.Body)
	}
	for _, n := range []string{"send-receipt", "notify-warehouse", "handle-failure"} {
		s := mustStep(t, w, n)
		if diff := cmp.Diff([]string{"charge"}, s.Needs); diff != "" {
			t.Errorf("%s.Needs: %s", n, diff)
		}
		if s.If == "" || s.Cond == nil {
			t.Errorf("%s: condition not parsed", n)
		}
	}
	if got := mustStep(t, w, "notify-warehouse"); got.HasBody || got.Body != nil {
		t.Errorf("notify-warehouse has a body: %#v", got.Body)
	}
	if up := w.Upstream("send-receipt"); !up["charge"] || len(up) != 1 {
		t.Errorf("Upstream(send-receipt) = %v", up)
	}
}

func TestParseSeedTrialExpiry(t *testing.T) {
	w := mustParse(t, readTestdata(t, "trial-expiry.json"))
	want := map[string]struct {
		typ   spec.StepType
		needs []string
		sleep time.Duration
	}{
		"start-trial":   {spec.StepHTTP, []string{}, 0},
		"wait-13-days":  {spec.StepSleep, []string{"start-trial"}, 13 * 24 * time.Hour},
		"send-reminder": {spec.StepHTTP, []string{"wait-13-days"}, 0},
		"wait-1-day":    {spec.StepSleep, []string{"send-reminder"}, 24 * time.Hour},
		"expire-trial":  {spec.StepHTTP, []string{"wait-1-day"}, 0},
	}
	if len(w.Steps) != len(want) {
		t.Fatalf("%d steps", len(w.Steps))
	}
	for name, wt := range want {
		s := mustStep(t, w, name)
		if s.Type != wt.typ || s.Sleep != wt.sleep {
			t.Errorf("%s: type %q sleep %v, want %q %v", name, s.Type, s.Sleep, wt.typ, wt.sleep)
		}
		if diff := cmp.Diff(wt.needs, s.Needs); diff != "" {
			t.Errorf("%s.Needs (-want +got):\n%s", name, diff)
		}
		if s.Type == spec.StepSleep && (s.Method != "" || s.Retries != 0 || s.Timeout != 0) {
			t.Errorf("%s: sleep step got HTTP defaults: %+v", name, s)
		}
	}
	if up := w.Upstream("expire-trial"); len(up) != 4 {
		t.Errorf("Upstream(expire-trial) = %v, want the 4 earlier steps", up)
	}
	if got := spec.FormatDuration(mustStep(t, w, "wait-13-days").Sleep); got != "13d" {
		t.Errorf("FormatDuration = %q", got)
	}
}

func TestParseSeedCheckoutFlow(t *testing.T) {
	w := mustParse(t, readTestdata(t, "checkout-flow.json"))
	pr := mustStep(t, w, "payment-result")
	if pr.Type != spec.StepWebhook || pr.WaitTimeout != time.Hour {
		t.Errorf("payment-result = %q timeout %v", pr.Type, pr.WaitTimeout)
	}
	if pr.Method != "" || pr.HasBody {
		t.Errorf("wait step got HTTP fields: %+v", pr)
	}
	for _, n := range []string{"fulfill-order", "handle-timeout"} {
		s := mustStep(t, w, n)
		if s.Type != spec.StepHTTP || cmp.Diff([]string{"payment-result"}, s.Needs) != "" || s.Cond == nil {
			t.Errorf("%s = %+v", n, s)
		}
	}
}

func TestParseSeedAPICreate(t *testing.T) {
	w := mustParse(t, readTestdata(t, "api-create.json"))
	charge := mustStep(t, w, "charge")
	if charge.Retries != 3 {
		t.Errorf("Retries = %d, want 3", charge.Retries)
	}
	if charge.Timeout != 30*time.Second {
		t.Errorf("timeout 30000 (ms) = %v, want 30s", charge.Timeout)
	}
	if diff := cmp.Diff(map[string]string{"Authorization": "Bearer {{trigger.body.token}}"}, charge.Headers); diff != "" {
		t.Errorf("Headers: %s", diff)
	}
	sr := mustStep(t, w, "send-receipt")
	if sr.Retries != 5 || sr.Timeout != 30*time.Second || sr.Method != "POST" {
		t.Errorf("send-receipt defaults: retries %d timeout %v method %q", sr.Retries, sr.Timeout, sr.Method)
	}
}

func TestParseDefaultsAndUnits(t *testing.T) {
	w := mustParse(t, []byte(`{"name":"d","tasks":{
		"a":{"url":"https://x.test/a","timeout":1500,"retries":0},
		"b":{"url":"https://x.test/b","timeout":"2m"},
		"c":{"sleep":90},
		"d":{"sleep":"1d12h"},
		"e":{"wait_for_webhook":{}},
		"f":{"wait_for_webhook":{"timeout":120}},
		"g":{"url":"https://x.test/g","method":"get"}
	},"max_duration":"2d"}`))
	checks := []struct {
		name      string
		got, want any
	}{
		{"a.Timeout (ms number)", mustStep(t, w, "a").Timeout, 1500 * time.Millisecond},
		{"a.Retries explicit 0", mustStep(t, w, "a").Retries, 0},
		{"a.Method default", mustStep(t, w, "a").Method, "POST"},
		{"b.Timeout string", mustStep(t, w, "b").Timeout, 2 * time.Minute},
		{"c.Sleep (s number)", mustStep(t, w, "c").Sleep, 90 * time.Second},
		{"d.Sleep compound", mustStep(t, w, "d").Sleep, 36 * time.Hour},
		{"e.WaitTimeout none", mustStep(t, w, "e").WaitTimeout, time.Duration(0)},
		{"f.WaitTimeout (s number)", mustStep(t, w, "f").WaitTimeout, 2 * time.Minute},
		{"g.Method upper-cased", mustStep(t, w, "g").Method, "GET"},
		{"MaxDuration", w.MaxDuration, 48 * time.Hour},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestParseDuration(t *testing.T) {
	good := map[string]time.Duration{
		"30s": 30 * time.Second, "5m": 5 * time.Minute, "2h": 2 * time.Hour, "1d": 24 * time.Hour,
		"13d": 13 * 24 * time.Hour, "1.5d": 36 * time.Hour, ".5d": 12 * time.Hour, "1.d": 24 * time.Hour, "+1d": 24 * time.Hour, "007d": 7 * 24 * time.Hour, "1h30m": 90 * time.Minute, "500ms": 500 * time.Millisecond,
		"1d2h": 26 * time.Hour, " 1h ": time.Hour, "0s": 0,
		// Days reach as far as hours do (the bound was half of it).
		"106000d": 106000 * 24 * time.Hour, "106751d": 106751 * 24 * time.Hour,
	}
	for in, want := range good {
		got, err := spec.ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "3 days", "soon", "30", "-1s", "-1d", "d", "1d2", "NaNd", "Infd", "+Infd", "1e300d", "1e6d", "106751d24h", "1d-1s",
		// Days are a decimal number, as Go's units are: not the other
		// forms of a Go float literal (which read "1_0d" as 10 days and
		// "0x1p4d" as 16, where "1_0h" and "0x1p4h" are refused).
		"1_0d", "0x1p4d", "0x10d", "1e3d", "1E2d", "0b1d", "0o7d", "1.5e0d", "1d_", ".d", "+d", "++1d"} {
		if got, err := spec.ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", in, got)
		}
	}
}

func TestFingerprintYAMLMatchesJSON(t *testing.T) {
	j := mustParse(t, readTestdata(t, "checkout-flow.json"))
	y := mustParse(t, readTestdata(t, "checkout-flow.yaml"))
	if j.Fingerprint() != y.Fingerprint() {
		t.Errorf("YAML and JSON fingerprints differ:\n%s\n%s", j.Fingerprint(), y.Fingerprint())
	}
	if !strings.HasPrefix(j.Fingerprint(), "sha256:") {
		t.Errorf("Fingerprint = %q", j.Fingerprint())
	}
	// Source is JSON even when YAML was submitted, and parses back to the
	// same definition.
	again := mustParse(t, y.Source)
	if again.Fingerprint() != y.Fingerprint() {
		t.Errorf("re-parsing Source changed the fingerprint")
	}
}

func TestFingerprintStability(t *testing.T) {
	base := `{"name":"fp","trigger":"api","tasks":{
		"a":{"url":"https://x.test/a","method":"POST","body":{"k":"{{trigger.body.k}}","n":1}},
		"b":{"needs":["a"],"if":"tasks.a.status_code == 200","url":"https://x.test/b"}}}`
	fp := mustParse(t, []byte(base)).Fingerprint()

	same := map[string]string{
		"whitespace":      compactJSON(t, base),
		"more whitespace": strings.ReplaceAll(strings.ReplaceAll(base, `":"`, "\" :\n\t \""), `","`, "\" ,\r\n \""),
		"top-level key order": `{"tasks":{
			"a":{"url":"https://x.test/a","method":"POST","body":{"k":"{{trigger.body.k}}","n":1}},
			"b":{"needs":["a"],"if":"tasks.a.status_code == 200","url":"https://x.test/b"}},
			"trigger":"api","name":"fp"}`,
		"step key order": `{"name":"fp","trigger":"api","tasks":{
			"a":{"body":{"n":1,"k":"{{trigger.body.k}}"},"method":"POST","url":"https://x.test/a"},
			"b":{"url":"https://x.test/b","if":"tasks.a.status_code == 200","needs":["a"]}}}`,
		"defaults spelled out": `{"name":"fp","trigger":"api","enabled":true,"max_duration":"30d","tasks":{
			"a":{"url":"https://x.test/a","method":"post","retries":5,"timeout":30000,"needs":[],"headers":{},"body":{"k":"{{trigger.body.k}}","n":1}},
			"b":{"needs":["a"],"if":"tasks.a.status_code == 200","url":"https://x.test/b","method":"POST","timeout":"30s"}}}`,
		"trigger omitted": `{"name":"fp","tasks":{
			"a":{"url":"https://x.test/a","body":{"k":"{{trigger.body.k}}","n":1}},
			"b":{"needs":["a"],"if":"tasks.a.status_code == 200","url":"https://x.test/b"}}}`,
		"yaml": `
name: fp
tasks:
  a: {url: "https://x.test/a", body: {k: "{{trigger.body.k}}", n: 1}}
  b:
    needs: [a]
    if: tasks.a.status_code == 200
    url: https://x.test/b
`,
	}
	for name, doc := range same {
		if got := mustParse(t, []byte(doc)).Fingerprint(); got != fp {
			t.Errorf("%s: fingerprint changed", name)
		}
	}

	different := map[string]string{
		"url":       strings.Replace(base, "https://x.test/b", "https://x.test/c", 1),
		"method":    strings.Replace(base, `"method":"POST"`, `"method":"PUT"`, 1),
		"body":      strings.Replace(base, `"n":1`, `"n":2`, 1),
		"condition": strings.Replace(base, "== 200", "== 201", 1),
		"name":      strings.Replace(base, `"fp"`, `"fp2"`, 1),
		"retries":   strings.Replace(base, `"url":"https://x.test/b"`, `"url":"https://x.test/b","retries":4`, 1),
		"needs":     strings.Replace(base, `"needs":["a"],"if":"tasks.a.status_code == 200",`, ``, 1),
	}
	for name, doc := range different {
		if got := mustParse(t, []byte(doc)).Fingerprint(); got == fp {
			t.Errorf("changing the %s kept the fingerprint", name)
		}
	}
}

// TestFingerprintStabilityOfDefaultsAndHeaderCase holds the fingerprint to
// what a step does: a task step's payload written as {}, the payload a step
// without one is handed, and header names in another case, which go out as
// the same header, mean the same definition (a resubmission spelling either
// out stored a new version).
func TestFingerprintStabilityOfDefaultsAndHeaderCase(t *testing.T) {
	base := `{"name":"fp","tasks":{
		"a":{"url":"https://x.test/a","headers":{"Content-Type":"text/plain","X-Api-Key":"{{trigger.body.k}}"}},
		"t":{"needs":["a"],"task":{"type":"media.resize.v1"}}}}`
	fp := mustParse(t, []byte(base)).Fingerprint()
	same := map[string]string{
		"payload {}":  strings.Replace(base, `"type":"media.resize.v1"`, `"type":"media.resize.v1","payload":{}`, 1),
		"header case": strings.Replace(base, `"Content-Type":"text/plain","X-Api-Key"`, `"content-type":"text/plain","X-API-KEY"`, 1),
		"yaml": `
name: fp
tasks:
  a:
    url: https://x.test/a
    headers: {content-type: text/plain, x-api-key: "{{trigger.body.k}}"}
  t:
    needs: [a]
    task: {type: media.resize.v1, payload: {}}
`,
	}
	for name, doc := range same {
		if got := mustParse(t, []byte(doc)).Fingerprint(); got != fp {
			t.Errorf("%s: fingerprint changed", name)
		}
	}
	different := map[string]string{
		"payload":      strings.Replace(base, `"type":"media.resize.v1"`, `"type":"media.resize.v1","payload":{"k":1}`, 1),
		"payload null": strings.Replace(base, `"type":"media.resize.v1"`, `"type":"media.resize.v1","payload":null`, 1),
		"payload []":   strings.Replace(base, `"type":"media.resize.v1"`, `"type":"media.resize.v1","payload":[]`, 1),
		"header value": strings.Replace(base, `"text/plain"`, `"Text/Plain"`, 1),
		"header name":  strings.Replace(base, `"X-Api-Key"`, `"X-Api-Keys"`, 1),
		"body {}":      strings.Replace(base, `"url":"https://x.test/a",`, `"url":"https://x.test/a","body":{},`, 1),
	}
	for name, doc := range different {
		if got := mustParse(t, []byte(doc)).Fingerprint(); got == fp {
			t.Errorf("changing the %s kept the fingerprint", name)
		}
	}
}

// errKey is what the validation table compares: the location and the code.
type errKey struct{ Path, Code string }

func validationErrors(t *testing.T, err error) []spec.FieldError {
	t.Helper()
	var ve *spec.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
	}
	if !spec.IsValidation(err) {
		t.Errorf("IsValidation = false")
	}
	return ve.Errors
}

func TestValidation(t *testing.T) {
	const ok = `"url":"https://x.test/ok"`
	tasks := func(s string) string { return `{"name":"wf","tasks":{` + s + `}}` }
	cases := []struct {
		name   string
		doc    string
		lim    spec.Limits
		want   []errKey
		msgHas map[string]string // path -> substring of that error's message
	}{
		{
			name: "unknown need with typo",
			doc:  tasks(`"charge":{` + ok + `},"send-receipt":{"needs":["chrage"],` + ok + `}`),
			want: []errKey{{"tasks.send-receipt.needs[0]", spec.CodeUnknownNeed}},
			msgHas: map[string]string{
				"tasks.send-receipt.needs[0]": `did you mean "charge"?`,
			},
		},
		{
			name: "unknown need without suggestion",
			doc:  tasks(`"charge":{` + ok + `},"b":{"needs":["zzzzzzzzzzzz"],` + ok + `}`),
			want: []errKey{{"tasks.b.needs[0]", spec.CodeUnknownNeed}},
		},
		{
			name:   "cycle",
			doc:    tasks(`"a":{"needs":["b"],` + ok + `},"b":{"needs":["a"],` + ok + `}`),
			want:   []errKey{{"tasks.b.needs", spec.CodeCycle}},
			msgHas: map[string]string{"tasks.b.needs": "b → a → b"},
		},
		{
			name:   "longer cycle",
			doc:    tasks(`"a":{"needs":["c"],` + ok + `},"b":{"needs":["a"],` + ok + `},"c":{"needs":["b"],` + ok + `},"d":{"needs":["a"],` + ok + `}`),
			want:   []errKey{{"tasks.b.needs", spec.CodeCycle}},
			msgHas: map[string]string{"tasks.b.needs": "b → c → a → b"},
		},
		{
			name: "self need",
			doc:  tasks(`"a":{"needs":["a"],` + ok + `}`),
			want: []errKey{{"tasks.a.needs[0]", spec.CodeSelfNeed}},
		},
		{
			name: "duplicate need",
			doc:  tasks(`"a":{` + ok + `},"b":{"needs":["a","a"],` + ok + `}`),
			want: []errKey{{"tasks.b.needs[1]", spec.CodeDuplicateNeed}},
		},
		{
			name: "no step type",
			doc:  tasks(`"a":{"needs":[]}`),
			want: []errKey{{"tasks.a", spec.CodeMissingStepType}},
		},
		{
			name: "url and sleep",
			doc:  tasks(`"a":{"url":"https://x.test","sleep":"1s"}`),
			want: []errKey{{"tasks.a", spec.CodeConflictingTypes}},
		},
		{
			name: "sleep and wait",
			doc:  tasks(`"a":{"sleep":"1s","wait_for_webhook":{}}`),
			want: []errKey{{"tasks.a", spec.CodeConflictingTypes}},
		},
		{
			name: "http-only fields on a sleep step",
			doc:  tasks(`"a":{"sleep":"1s","method":"GET","headers":{"X":"y"}}`),
			want: []errKey{{"tasks.a.method", spec.CodeFieldNotAllowed}, {"tasks.a.headers", spec.CodeFieldNotAllowed}},
		},
		{
			name: "http-only field on a wait step",
			doc:  tasks(`"a":{"wait_for_webhook":{"timeout":"1h"},"retries":2}`),
			want: []errKey{{"tasks.a.retries", spec.CodeFieldNotAllowed}},
		},
		{
			name: "sleep in words",
			doc:  tasks(`"a":{"sleep":"3 days"}`),
			want: []errKey{{"tasks.a.sleep", spec.CodeInvalidDuration}},
		},
		{
			name: "negative sleep",
			doc:  tasks(`"a":{"sleep":-1}`),
			want: []errKey{{"tasks.a.sleep", spec.CodeInvalidDuration}},
		},
		{
			name: "bare number string sleep",
			doc:  tasks(`"a":{"sleep":"30"}`),
			want: []errKey{{"tasks.a.sleep", spec.CodeInvalidDuration}},
		},
		{
			name: "bare number string timeout",
			doc:  tasks(`"a":{"url":"https://x.test","timeout":"30000"}`),
			want: []errKey{{"tasks.a.timeout", spec.CodeInvalidDuration}},
		},
		{
			name: "fractional day sleep and number wait timeout",
			doc:  tasks(`"a":{"sleep":"1.5d"},"b":{"wait_for_webhook":{"timeout":3600}}`),
		},
		{
			name: "zero timeout",
			doc:  tasks(`"a":{"url":"https://x.test","timeout":0}`),
			want: []errKey{{"tasks.a.timeout", spec.CodeInvalidDuration}},
		},
		{
			name: "timeout over an hour",
			doc:  tasks(`"a":{"url":"https://x.test","timeout":"2h"}`),
			want: []errKey{{"tasks.a.timeout", spec.CodeInvalidDuration}},
		},
		{
			name: "wait timeout soon",
			doc:  tasks(`"a":{"wait_for_webhook":{"timeout":"soon"}}`),
			want: []errKey{{"tasks.a.wait_for_webhook.timeout", spec.CodeInvalidDuration}},
		},
		{
			name: "wait unknown field",
			doc:  tasks(`"a":{"wait_for_webhook":{"timeout":"1h","secret":"x"}}`),
			want: []errKey{{"tasks.a.wait_for_webhook.secret", spec.CodeUnknownField}},
		},
		{
			name: "bad max_duration",
			doc:  `{"name":"wf","max_duration":"forever","tasks":{"a":{` + ok + `}}}`,
			want: []errKey{{"max_duration", spec.CodeInvalidDuration}},
		},
		{
			name: "bad if syntax",
			doc:  tasks(`"a":{` + ok + `},"b":{"needs":["a"],"if":"tasks.a.status ==",` + ok + `}`),
			want: []errKey{{"tasks.b.if", spec.CodeInvalidCondition}},
		},
		{
			name: "if reads a sibling",
			doc:  tasks(`"a":{` + ok + `},"b":{` + ok + `},"c":{"needs":["a"],"if":"tasks.b.status == 'success'",` + ok + `}`),
			want: []errKey{{"tasks.c.if", spec.CodeNotUpstream}},
		},
		{
			name: "body template reads a sibling",
			doc:  tasks(`"a":{` + ok + `},"b":{` + ok + `},"c":{"needs":["a"],` + ok + `,"body":{"x":"{{tasks.b.body.x}}"}}`),
			want: []errKey{{"tasks.c.body", spec.CodeNotUpstream}},
		},
		{
			name: "template reads a downstream step",
			doc:  tasks(`"a":{"url":"https://x.test/{{tasks.b.body.id}}"},"b":{"needs":["a"],` + ok + `}`),
			want: []errKey{{"tasks.a.url", spec.CodeNotUpstream}},
		},
		{
			name: "template reads its own step",
			doc:  tasks(`"a":{` + ok + `,"headers":{"X":"{{tasks.a.status}}"}}`),
			want: []errKey{{"tasks.a.headers.X", spec.CodeNotUpstream}},
		},
		{
			name: "template reads a transitive upstream step",
			doc:  tasks(`"a":{` + ok + `},"b":{"needs":["a"],"sleep":"1s"},"c":{"needs":["b"],` + ok + `,"body":"{{tasks.a.body}}"}`),
		},
		{
			name: "unknown step in template",
			doc:  tasks(`"charge":{` + ok + `},"b":{"needs":["charge"],` + ok + `,"body":{"x":"{{tasks.chrage.body.x}}"}}`),
			want: []errKey{{"tasks.b.body", spec.CodeUnknownStep}},
			msgHas: map[string]string{
				"tasks.b.body": `did you mean "charge"?`,
			},
		},
		{
			name: "unknown namespace",
			doc:  tasks(`"a":{"url":"https://x.test/{{foo.bar}}"}`),
			want: []errKey{{"tasks.a.url", spec.CodeUnknownNamespace}},
		},
		{
			name: "unknown trigger field",
			doc:  tasks(`"a":{` + ok + `,"body":"{{trigger.query.x}}"}`),
			want: []errKey{{"tasks.a.body", spec.CodeUnknownNamespace}},
		},
		{
			name: "wait url of an http step",
			doc:  tasks(`"x":{` + ok + `},"a":{` + ok + `,"body":{"cb":"{{wait.x.url}}"}}`),
			want: []errKey{{"tasks.a.body", spec.CodeNotAWaitStep}},
		},
		{
			name: "wait url of a downstream wait step is fine",
			doc:  tasks(`"a":{` + ok + `,"body":{"cb":"{{wait.w.url}}"}},"w":{"needs":["a"],"wait_for_webhook":{}}`),
		},
		{
			name: "unclosed template",
			doc:  tasks(`"a":{"url":"https://x.test/{{trigger.body.id"}`),
			want: []errKey{{"tasks.a.url", spec.CodeInvalidTemplate}},
		},
		{
			name: "unknown task field in template",
			doc:  tasks(`"a":{` + ok + `},"b":{"needs":["a"],` + ok + `,"body":"{{tasks.a.output}}"}`),
			want: []errKey{{"tasks.b.body", spec.CodeInvalidTemplate}},
		},
		{
			name: "nothing under a status, a status code or a header value",
			doc:  tasks(`"a":{` + ok + `},"b":{"needs":["a"],` + ok + `,"body":"{{tasks.a.status.code}}","headers":{"X":"{{tasks.a.headers.etag.v}}","Y":"{{trigger.headers.x-id.n}}"},"if":"tasks.a.status_code[0] == 1"}`),
			want: []errKey{{"tasks.b.body", spec.CodeInvalidTemplate}, {"tasks.b.headers.X", spec.CodeInvalidTemplate}, {"tasks.b.headers.Y", spec.CodeInvalidTemplate}, {"tasks.b.if", spec.CodeInvalidTemplate}},
		},
		{
			name: "what is under a body, and a header by name",
			doc:  tasks(`"a":{` + ok + `},"b":{"needs":["a"],` + ok + `,"body":"{{tasks.a.body.items[0].id}}","headers":{"X":"{{tasks.a.headers.etag}}","Y":"{{trigger.headers.x-id}}"},"if":"tasks.a.status == 'success'"}`),
		},
		{
			name: "unknown top-level field",
			doc:  `{"name":"wf","tasks":{"a":{` + ok + `}},"steps":{}}`,
			want: []errKey{{"steps", spec.CodeUnknownField}},
		},
		{
			name: "unknown step field",
			doc:  tasks(`"a":{` + ok + `,"retry":3}`),
			want: []errKey{{"tasks.a.retry", spec.CodeUnknownField}},
		},
		{
			name: "unsupported trigger",
			doc:  `{"name":"wf","trigger":"cron","tasks":{"a":{` + ok + `}}}`,
			want: []errKey{{"trigger", spec.CodeUnsupportedTrigger}},
		},
		{
			name: "too large",
			doc:  tasks(`"a":{` + ok + `},"b":{` + ok + `},"c":{` + ok + `}`),
			lim:  spec.Limits{MaxBytes: 100},
			want: []errKey{{"", spec.CodeTooLarge}},
		},
		{
			name: "too many steps",
			doc:  tasks(`"a":{` + ok + `},"b":{` + ok + `},"c":{` + ok + `}`),
			lim:  spec.Limits{MaxSteps: 2},
			want: []errKey{{"tasks", spec.CodeTooManySteps}},
		},
		{
			name: "invalid JSON",
			doc:  `{"name":"wf","tasks":{`,
			want: []errKey{{"", spec.CodeInvalidJSON}},
		},
		{
			name: "invalid YAML",
			doc:  "name: wf\ntasks: [\n",
			want: []errKey{{"", spec.CodeInvalidJSON}},
		},
		{
			name: "not an object",
			doc:  `["wf"]`,
			want: []errKey{{"", spec.CodeInvalidType}},
		},
		{
			name: "name missing",
			doc:  `{"tasks":{"a":{` + ok + `}}}`,
			want: []errKey{{"name", spec.CodeRequired}},
		},
		{
			name: "name not a string",
			doc:  `{"name":7,"tasks":{"a":{` + ok + `}}}`,
			want: []errKey{{"name", spec.CodeInvalidType}},
		},
		{
			name: "name is a UUID",
			doc:  `{"name":"6ba7b810-9dad-11d1-80b4-00c04fd430c8","tasks":{"a":{` + ok + `}}}`,
			want: []errKey{{"name", spec.CodeInvalidName}},
		},
		{
			name: "name with a space",
			doc:  `{"name":"my flow","tasks":{"a":{` + ok + `}}}`,
			want: []errKey{{"name", spec.CodeInvalidName}},
		},
		{
			name: "tasks missing",
			doc:  `{"name":"wf"}`,
			want: []errKey{{"tasks", spec.CodeRequired}},
		},
		{
			name: "tasks empty",
			doc:  `{"name":"wf","tasks":{}}`,
			want: []errKey{{"tasks", spec.CodeRequired}},
		},
		{
			name: "step name with a dot",
			doc:  tasks(`"a.b":{` + ok + `}`),
			want: []errKey{{"tasks.a.b", spec.CodeInvalidName}},
		},
		{
			name: "step defined twice",
			doc:  tasks(`"a":{` + ok + `},"a":{` + ok + `}`),
			want: []errKey{{"tasks.a", spec.CodeInvalidName}},
		},
		{
			name: "method FETCH",
			doc:  tasks(`"a":{` + ok + `,"method":"FETCH"}`),
			want: []errKey{{"tasks.a.method", spec.CodeInvalidValue}},
		},
		{
			name: "retries out of range",
			doc:  tasks(`"a":{` + ok + `,"retries":26}`),
			want: []errKey{{"tasks.a.retries", spec.CodeInvalidValue}},
		},
		{
			name: "static url not http",
			doc:  tasks(`"a":{"url":"ftp://x.test/file"}`),
			want: []errKey{{"tasks.a.url", spec.CodeInvalidURL}},
		},
		{
			name: "relative url",
			doc:  tasks(`"a":{"url":"/api/charge"}`),
			want: []errKey{{"tasks.a.url", spec.CodeInvalidURL}},
		},
		{
			name: "templated url with bad scheme",
			doc:  tasks(`"a":{"url":"ftp://x.test/{{trigger.body.id}}"}`),
			want: []errKey{{"tasks.a.url", spec.CodeInvalidURL}},
		},
		{
			name: "templated host is checked at run time",
			doc:  tasks(`"a":{"url":"https://{{trigger.body.host}}/x"}`),
		},
		{
			name: "empty url",
			doc:  tasks(`"a":{"url":""}`),
			want: []errKey{{"tasks.a.url", spec.CodeRequired}},
		},
		{
			name: "needs not an array",
			doc:  tasks(`"a":{` + ok + `},"b":{"needs":"a",` + ok + `}`),
			want: []errKey{{"tasks.b.needs", spec.CodeInvalidType}},
		},
		{
			name: "step not an object",
			doc:  tasks(`"a":"https://x.test"`),
			want: []errKey{{"tasks.a", spec.CodeInvalidType}},
		},
		{
			name: "every problem at once",
			doc: `{"trigger":"webhook","extra":1,"tasks":{
				"charge":{"url":"https://x.test/charge","method":"FETCH","colour":"red"},
				"send-receipt":{"needs":["chrage"],"url":"https://x.test/r","timeout":0},
				"nap":{"sleep":"3 days","body":{}},
				"a":{"needs":["b"],"sleep":"1s"},
				"b":{"needs":["a"],"sleep":"1s"},
				"odd":{"needs":["charge"],"if":"tasks.charge.status_code ==","url":"https://x.test/{{foo.bar}}","body":{"s":"{{tasks.nap.body}}","w":"{{wait.charge.url}}"}}
			}}`,
			want: []errKey{
				{"trigger", spec.CodeUnsupportedTrigger},
				{"extra", spec.CodeUnknownField},
				{"name", spec.CodeRequired},
				{"tasks.charge.method", spec.CodeInvalidValue},
				{"tasks.charge.colour", spec.CodeUnknownField},
				{"tasks.send-receipt.timeout", spec.CodeInvalidDuration},
				{"tasks.nap.sleep", spec.CodeInvalidDuration},
				{"tasks.nap.body", spec.CodeFieldNotAllowed},
				{"tasks.send-receipt.needs[0]", spec.CodeUnknownNeed},
				{"tasks.b.needs", spec.CodeCycle},
				{"tasks.odd.if", spec.CodeInvalidCondition},
				{"tasks.odd.url", spec.CodeUnknownNamespace},
				{"tasks.odd.body", spec.CodeNotUpstream},
				{"tasks.odd.body", spec.CodeNotAWaitStep},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := spec.Parse([]byte(tc.doc), tc.lim)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse succeeded (%d steps), want %v", len(w.Steps), tc.want)
			}
			if w != nil {
				t.Errorf("Parse returned a workflow along with an error")
			}
			fes := validationErrors(t, err)
			var got []errKey
			for _, fe := range fes {
				got = append(got, errKey{fe.Path, fe.Code})
				if fe.Message == "" {
					t.Errorf("%s/%s: empty message", fe.Path, fe.Code)
				}
			}
			sortKeys := cmp.Transformer("sort", func(in []errKey) []errKey {
				out := append([]errKey(nil), in...)
				for i := range out {
					for j := i + 1; j < len(out); j++ {
						if out[j].Path < out[i].Path || (out[j].Path == out[i].Path && out[j].Code < out[i].Code) {
							out[i], out[j] = out[j], out[i]
						}
					}
				}
				return out
			})
			if diff := cmp.Diff(tc.want, got, sortKeys); diff != "" {
				t.Errorf("errors (-want +got):\n%s\nall: %v", diff, err)
			}
			for p, sub := range tc.msgHas {
				found := false
				for _, fe := range fes {
					if fe.Path == p && strings.Contains(fe.Message, sub) {
						found = true
					}
				}
				if !found {
					t.Errorf("no error at %q with message containing %q; got %v", p, sub, err)
				}
			}
		})
	}
}

func TestValidationErrorText(t *testing.T) {
	_, err := spec.Parse([]byte(`{"name":"wf","tasks":{"charge":{"url":"https://x.test"},"r":{"needs":["chrage"],"url":"https://x.test"}}}`), spec.Limits{})
	want := `invalid workflow: tasks.r.needs[0]: unknown step "chrage"; did you mean "charge"?`
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}

// A "billion laughs" document: each level aliases the previous one nine
// times, so a few hundred bytes of YAML stand for 9^9 strings.
func TestParseYAMLAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("name: bomb\nl0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i <= 8; i++ {
		fmt.Fprintf(&b, "l%d: &a%d [", i, i)
		for j := 0; j < 9; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]\n")
	}
	b.WriteString("tasks: {s: {sleep: 1}}\n")
	done := make(chan error, 1)
	go func() {
		_, err := spec.Parse([]byte(b.String()), spec.DefaultLimits)
		done <- err
	}()
	select {
	case err := <-done:
		fes := validationErrors(t, err)
		if len(fes) != 1 || fes[0].Code != spec.CodeInvalidJSON {
			t.Errorf("err = %v, want one invalid_json error", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Parse is still expanding YAML aliases after 20s")
	}
}

func TestParseYAMLAliasesWithinReason(t *testing.T) {
	doc := `
name: shared
tasks:
  a:
    url: https://x.test/a
    headers: &h {Authorization: "Bearer {{trigger.body.token}}", X-Source: ferry}
  b:
    needs: [a]
    url: https://x.test/b
    headers: *h
  c:
    needs: [b]
    sleep: 30
`
	w := mustParse(t, []byte(doc))
	if diff := cmp.Diff(mustStep(t, w, "a").Headers, mustStep(t, w, "b").Headers); diff != "" {
		t.Errorf("aliased headers differ: %s", diff)
	}
	if got := mustStep(t, w, "c").Sleep; got != 30*time.Second {
		t.Errorf("YAML sleep: 30 = %v, want 30s", got)
	}
}

// Typo suggestions compare names pairwise; names as long as the document
// allows must not make that quadratic work take seconds.
func TestParseLongUnknownNamesAreCheap(t *testing.T) {
	a := strings.Repeat("a", 60_000)
	b := strings.Repeat("b", 60_000)
	doc := `{"name":"x","tasks":{"` + a + `":{"sleep":1,"needs":["` + b + `"],"if":"tasks.` + b + `.status == 1"}}}`
	done := make(chan error, 1)
	go func() {
		_, err := spec.Parse([]byte(doc), spec.DefaultLimits)
		done <- err
	}()
	select {
	case err := <-done:
		var got []errKey
		for _, fe := range validationErrors(t, err) {
			got = append(got, errKey{Code: fe.Code})
		}
		want := []errKey{{Code: spec.CodeInvalidName}, {Code: spec.CodeUnknownNeed}, {Code: spec.CodeUnknownStep}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("codes (-want +got):\n%s", diff)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Parse took over 5s on a 180 KB definition")
	}
}

func TestSuggestions(t *testing.T) {
	cases := map[string]string{
		"chrage":          `did you mean "charge"?`,
		"send-reciept":    `did you mean "send-receipt"?`,
		"charge-customer": "",
		"qqqqqqqqq":       "",
	}
	for need, want := range cases {
		_, err := spec.Parse([]byte(`{"name":"s","tasks":{"charge":{"sleep":1},"send-receipt":{"sleep":1},"z":{"needs":["`+need+`"],"sleep":1}}}`), spec.Limits{})
		fes := validationErrors(t, err)
		if len(fes) != 1 {
			t.Fatalf("%s: %v", need, err)
		}
		if got := strings.Contains(fes[0].Message, "did you mean"); got != (want != "") || (want != "" && !strings.Contains(fes[0].Message, want)) {
			t.Errorf("need %q: message %q, want suggestion %q", need, fes[0].Message, want)
		}
	}
}

// The YAML parser's work grows with the square of how deeply flow
// collections nest: 25,000 "[" took it 5 s and 1.3 GB, 250 KB was killed
// for memory. Deeper than spec.MaxYAMLNesting is refused before it parses,
// also behind an apostrophe in a plain scalar; brackets in quoted scalars
// do not count.
func TestParseYAMLDeepNestingRefused(t *testing.T) {
	deep := strings.Repeat("[", 30_000)
	for name, doc := range map[string]string{
		"sequences":            "name: deep\ntasks:\n  a:\n    url: http://x.test/\n    body: " + deep + "\n",
		"mappings":             "name: deep\ntasks:\n  a:\n    url: http://x.test/\n    body: " + strings.Repeat("{a: ", 30_000) + "\n",
		"after an apostrophe":  "name: deep\ndescription: it's\ntasks:\n  a:\n    url: http://x.test/\n    body: " + deep + "\n",
		"after a # in a value": "name: deep\ndescription: a#b\ntasks:\n  a:\n    url: http://x.test/\n    body: " + deep + "\n",
		"after a stray quote":  "name: deep\ndescription: say \"hi\ntasks:\n  a:\n    url: http://x.test/\n    body: " + deep + "\n",
		"after rock 'n roll":   "name: deep\ndescription: rock 'n roll\ntasks:\n  a:\n    url: http://x.test/\n    body: " + deep + "\n",
		"after a-\"":           "name: deep\ndescription: a-\"\ntasks:\n  a:\n    url: http://x.test/\n    body: " + deep + "\n",
		"after a block scalar": "name: deep\ndescription: |\n  he said \"no\ntasks:\n  a:\n    url: http://x.test/\n    body: " + deep + "\n",
		"a comment in a flow":  "name: deep\ntasks:\n  a:\n    url: http://x.test/\n    body: [a,# \"\n      " + deep + "\n",
		"block entries":        "name: deep\ntasks:\n  a:\n    url: http://x.test/\n    body:\n      " + strings.Repeat("- ", 100_000) + "x\n",
	} {
		_, err := spec.Parse([]byte(doc), spec.DefaultLimits)
		fes := validationErrors(t, err)
		if len(fes) != 1 || fes[0].Code != spec.CodeInvalidJSON || !strings.Contains(fes[0].Message, "nested more than 100 levels") {
			t.Errorf("%s: err = %v, want one invalid_json error about the nesting", name, err)
		}
	}
	quoted := "name: quoted\ndescription: \"" + strings.Repeat("[", 500) + "\"\nnote: '" + strings.Repeat("{", 500) + "'\ntasks:\n  a:\n    sleep: 1\n    body: " + strings.Repeat("[", 50) + strings.Repeat("]", 50) + "\n"
	if _, err := spec.Parse([]byte(strings.Replace(quoted, "note: ", "# note: ", 1)), spec.DefaultLimits); err != nil && strings.Contains(err.Error(), "nested") {
		t.Errorf("brackets in quoted scalars and comments counted: %v", err)
	}
}

// A definition that is not UTF-8 is invalid, not stored as it is; a task
// type longer than spec.MaxTaskTypeLen is refused where it is named (it
// is indexed, and an index entry is bounded).
func TestParseRefusesNonUTF8AndLongTaskTypes(t *testing.T) {
	_, err := spec.Parse([]byte("{\"name\": \"x\", \"description\": \"\xff\", \"tasks\": {\"a\": {\"sleep\": 1}}}"), spec.DefaultLimits)
	if fes := validationErrors(t, err); len(fes) != 1 || fes[0].Code != spec.CodeInvalidJSON {
		t.Errorf("non-UTF-8: err = %v, want one invalid_json error", err)
	}
	long := strings.Repeat("a", spec.MaxTaskTypeLen) + ".v1"
	_, err = spec.Parse([]byte(`{"name": "x", "tasks": {"a": {"task": {"type": "`+long+`"}}}}`), spec.DefaultLimits)
	if fes := validationErrors(t, err); len(fes) != 1 || fes[0].Path != "tasks.a.task.type" {
		t.Errorf("a %d-byte task type: err = %v, want one error at tasks.a.task.type", len(long), err)
	}
	if spec.ValidTaskType(long) || !spec.ValidTaskType(strings.Repeat("a", spec.MaxTaskTypeLen-3)+".v1") {
		t.Errorf("ValidTaskType: the bound is %d bytes", spec.MaxTaskTypeLen)
	}
}

// A version stored before the checks added since (UTF-8, an empty if, a
// task type's length) is read as it was (spec.Limits.Stored), so its runs
// go on; submitted again, it is refused.
func TestParseStoredVersionUnderOlderRules(t *testing.T) {
	long := strings.Repeat("a", spec.MaxTaskTypeLen) + ".v1"
	doc := []byte("{\"name\": \"old\", \"description\": \"\xff\", \"tasks\": {\"a\": {\"task\": {\"type\": \"" + long + "\"}}, \"b\": {\"needs\": [\"a\"], \"if\": \"\", \"sleep\": 1}}}")
	w, err := spec.Parse(doc, spec.Limits{Stored: true})
	if err != nil {
		t.Fatalf("the stored version: %v", err)
	}
	if b := mustStep(t, w, "b"); b.If != "" {
		t.Errorf("b's if = %q, want none", b.If)
	}
	if _, err := spec.Parse(doc, spec.DefaultLimits); err == nil {
		t.Error("the same definition submitted was accepted")
	}
}

// Days are a decimal number: a submitted "1e3d" or "1_0d" is refused
// where it is, and a version stored when any Go float literal was read
// as days reads as it did, so its runs go on.
func TestParseDurationDaysDecimal(t *testing.T) {
	doc := []byte(`{"name": "old", "max_duration": "1e3d", "tasks": {"a": {"sleep": "1_0d"}, "b": {"wait_for_webhook": {"timeout": "0x1p4d"}}, "c": {"task": {"type": "a.v1"}, "retry_delay": "1E1d"}}}`)
	_, err := spec.Parse(doc, spec.DefaultLimits)
	var paths []string
	for _, fe := range validationErrors(t, err) {
		paths = append(paths, fe.Path)
	}
	sort.Strings(paths)
	if want := []string{"max_duration", "tasks.a.sleep", "tasks.b.wait_for_webhook.timeout", "tasks.c.retry_delay"}; !slices.Equal(paths, want) {
		t.Errorf("submitted: errors at %v, want %v", paths, want)
	}
	w, err := spec.Parse(doc, spec.Limits{Stored: true})
	if err != nil {
		t.Fatalf("the stored version: %v", err)
	}
	const day = 24 * time.Hour
	if w.MaxDuration != 1000*day || mustStep(t, w, "a").Sleep != 10*day || mustStep(t, w, "b").WaitTimeout != 16*day || mustStep(t, w, "c").RetryDelay != 10*day {
		t.Errorf("the stored version read as %v, %v, %v, %v", w.MaxDuration, mustStep(t, w, "a").Sleep, mustStep(t, w, "b").WaitTimeout, mustStep(t, w, "c").RetryDelay)
	}
}

// YAML's .inf and .nan have no JSON form: refused where they are, as an
// invalid value, not as a document that is not JSON.
func TestParseYAMLNonFiniteNumbers(t *testing.T) {
	for doc, path := range map[string]string{
		"name: y\ntasks:\n  a:\n    sleep: .inf\n":                                   "tasks.a.sleep",
		"name: y\ntasks:\n  a:\n    url: http://x.test/\n    body: {x: [1, .nan]}\n": "tasks.a.body.x[1]",
		"name: y\nmax_duration: -.inf\ntasks:\n  a:\n    sleep: 1\n":                 "max_duration",
	} {
		_, err := spec.Parse([]byte(doc), spec.DefaultLimits)
		if fes := validationErrors(t, err); len(fes) != 1 || fes[0].Code != spec.CodeInvalidValue || fes[0].Path != path {
			t.Errorf("%q: err = %v, want one invalid_value at %s", doc, err, path)
		}
	}
}

// A definition is one YAML document: a file of several is refused rather
// than read as its first (the decoder drops the rest), while one document
// with its own "---" and "..." markers, comments or a directive is read.
func TestParseYAMLOneDocument(t *testing.T) {
	for _, doc := range []string{
		"name: a\ntasks: {s: {sleep: 1}}\n---\nname: b\ntasks: {s: {sleep: 1}}\n",
		"---\nname: a\ntasks: {s: {sleep: 1}}\n---\nname: b\n",
		"name: a\ntasks: {s: {sleep: 1}}\n...\nname: b\n",
	} {
		_, err := spec.Parse([]byte(doc), spec.DefaultLimits)
		if fes := validationErrors(t, err); len(fes) != 1 || fes[0].Code != spec.CodeInvalidJSON || !strings.Contains(fes[0].Message, "2 documents") {
			t.Errorf("%q: err = %v, want one invalid_json error about 2 documents", doc, err)
		}
	}
	for _, doc := range []string{
		"---\nname: one\ntasks: {s: {sleep: 1}}\n",
		"# a comment\n---\nname: one\ntasks: {s: {sleep: 1}}\n...\n# the end\n",
		"%YAML 1.2\n---\nname: one\ntasks: {s: {sleep: 1}}\n",
	} {
		if _, err := spec.Parse([]byte(doc), spec.DefaultLimits); err != nil {
			t.Errorf("%q: %v", doc, err)
		}
	}
}

// A header the step could never send is refused when the definition is
// submitted, at its path, in JSON and YAML alike: it used to be stored
// and fail every run's step (a name with a newline or a space, a value
// with a control character), and two names differing only in case sent
// whichever map order put last. A stored version is read as it was.
func TestParseHeadersRefusedAtCreate(t *testing.T) {
	docs := map[string][]byte{
		"json": []byte(`{"name":"h","tasks":{"a":{"url":"https://x.test","headers":{"Bad\nName":"v","With Space":"v","X-Ok":"a\u0007b","X-Tab":"a\tb {{trigger.body.k}}","x-dup":"1","X-Dup":"2"}}}}`),
		"yaml": []byte("name: h\ntasks:\n  a:\n    url: https://x.test\n    headers:\n      \"Bad\\nName\": v\n      With Space: v\n      X-Ok: \"a\\ab\"\n      X-Tab: \"a\\tb {{trigger.body.k}}\"\n      x-dup: \"1\"\n      X-Dup: \"2\"\n"),
	}
	for name, doc := range docs {
		t.Run(name, func(t *testing.T) {
			_, err := spec.Parse(doc, spec.DefaultLimits)
			var got []string
			for _, fe := range validationErrors(t, err) {
				if fe.Code != spec.CodeInvalidValue {
					t.Errorf("%s: code %s, want %s", fe.Path, fe.Code, spec.CodeInvalidValue)
				}
				got = append(got, fe.Path)
			}
			sort.Strings(got)
			if want := []string{"tasks.a.headers.Bad\nName", "tasks.a.headers.With Space", "tasks.a.headers.X-Ok", "tasks.a.headers.x-dup"}; !slices.Equal(got, want) {
				t.Errorf("errors at %q, want %q", got, want)
			}
			if _, err := spec.Parse(doc, spec.Limits{Stored: true}); err != nil {
				t.Errorf("the stored version: %v", err)
			}
		})
	}
}

// A version stored before paths under a status, a status code or a
// header value were refused reads as it was, so its runs go on.
func TestParseStoredPathUnderAStatus(t *testing.T) {
	doc := []byte(`{"name":"old","tasks":{"a":{"url":"https://x.test"},"b":{"needs":["a"],"url":"https://x.test","body":"{{tasks.a.status.code}}","if":"trigger.headers.x.y == 1"}}}`)
	if _, err := spec.Parse(doc, spec.Limits{Stored: true}); err != nil {
		t.Fatalf("the stored version: %v", err)
	}
	if _, err := spec.Parse(doc, spec.DefaultLimits); err == nil {
		t.Error("the same definition submitted was accepted")
	}
}

// An optional setting given as null is the default, as left out: the
// same steps and the same fingerprint (a YAML key with no value is null).
// A null retries was 0 retries and a null priority 0; a null trigger,
// max_duration, method, timeout, retry_delay or wait timeout was refused
// as if it were "". Versions stored when null retries and priority read
// as 0 read so still.
func TestParseNullSettingsAreDefaults(t *testing.T) {
	withNulls := `{"name": "n", "description": null, "trigger": null, "max_duration": null, "enabled": null, "tasks": {
		"a": {"url": "https://x.test/a", "method": null, "headers": null, "retries": null, "timeout": null, "needs": null, "if": null},
		"b": {"needs": ["a"], "task": {"type": "a.b.v1", "priority": null}, "retries": null, "retry_delay": null},
		"c": {"wait_for_webhook": {"timeout": null}}}}`
	without := `{"name": "n", "tasks": {
		"a": {"url": "https://x.test/a"},
		"b": {"needs": ["a"], "task": {"type": "a.b.v1"}},
		"c": {"wait_for_webhook": {}}}}`
	got, want := mustParse(t, []byte(withNulls)), mustParse(t, []byte(without))
	if got.Fingerprint() != want.Fingerprint() {
		t.Errorf("fingerprint with nulls %s, without %s", got.Fingerprint(), want.Fingerprint())
	}
	a, b := mustStep(t, got, "a"), mustStep(t, got, "b")
	checks := []struct {
		name      string
		got, want any
	}{
		{"Trigger", got.Trigger, "api"},
		{"MaxDuration", got.MaxDuration, spec.DefaultMaxDuration},
		{"Enabled", got.Enabled, true},
		{"a.Method", a.Method, "POST"},
		{"a.Retries", a.Retries, spec.DefaultRetries},
		{"a.Timeout", a.Timeout, spec.DefaultHTTPTimeout},
		{"b.RetriesSet", b.RetriesSet, false},
		{"b.TaskPriority", b.TaskPriority, spec.DefaultTaskPriority},
		{"b.RetryDelay", b.RetryDelay, time.Duration(0)},
		{"c.WaitTimeout", mustStep(t, got, "c").WaitTimeout, time.Duration(0)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if a.If != "" {
		t.Errorf("a null if read as %q, want no condition (the seed: null or omitted runs unconditionally)", a.If)
	}
	// An empty condition is still refused: say which was meant.
	if _, err := spec.Parse([]byte(`{"name": "n", "tasks": {"a": {"sleep": "1s", "if": ""}}}`), spec.DefaultLimits); err == nil {
		t.Error("an empty if was accepted")
	}
	// A type marker is no setting: a null one is still refused.
	if _, err := spec.Parse([]byte(`{"name": "n", "tasks": {"a": {"sleep": null}}}`), spec.DefaultLimits); err == nil {
		t.Error("a null sleep was accepted")
	}

	old, err := spec.Parse([]byte(withNulls), spec.Limits{Stored: true})
	if err != nil {
		t.Fatalf("the stored version: %v", err)
	}
	if a, b := mustStep(t, old, "a"), mustStep(t, old, "b"); a.Retries != 0 || !b.RetriesSet || b.Retries != 0 || b.TaskPriority != 0 {
		t.Errorf("stored: a.Retries %d, b.RetriesSet %v, b.Retries %d, b.TaskPriority %d; want 0, true, 0, 0 as they were read", a.Retries, b.RetriesSet, b.Retries, b.TaskPriority)
	}
}
