package engine_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryhq/ferry/internal/engine"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/status"
)

// jsonEqual compares two JSON texts by meaning.
func jsonEqual(t testing.TB, label string, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Errorf("%s: body %q is not JSON: %v", label, got, err)
		return
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: bad want %q: %v", label, want, err)
	}
	if diff := cmp.Diff(w, g); diff != "" {
		t.Errorf("%s: body (-want +got):\n%s\ngot %s", label, diff, got)
	}
}

func TestSeedScenarios(t *testing.T) {
	const (
		ok      = status.StepSuccess
		skipped = status.StepSkipped
		failed_ = status.StepFailed
		timeout = status.StepTimeout
	)
	type scenario struct {
		name    string
		file    string
		trigger string
		results map[string]engine.StepState
		want    map[string]string // final step statuses
		run     string            // final run status
		// bodies are the expected JSON bodies of started HTTP steps.
		bodies map[string]string
		// order, when set, is the expected decision order.
		order []string
	}
	cases := []scenario{
		{
			name:    "order-processing charge 200",
			file:    "order-processing.json",
			trigger: `{"order_id": 123}`,
			results: map[string]engine.StepState{"charge": okState(200, `{"amount": 42.5, "currency": "EUR"}`)},
			want:    map[string]string{"charge": ok, "send-receipt": ok, "notify-warehouse": ok, "handle-failure": skipped},
			run:     status.RunCompleted,
			bodies: map[string]string{
				"charge":       `{"order_id": 123}`,
				"send-receipt": `{"order_id": 123, "amount": 42.5}`,
			},
			order: []string{"charge", "send-receipt", "notify-warehouse", "handle-failure"},
		},
		{
			name:    "order-processing charge 500",
			file:    "order-processing.json",
			trigger: `{"order_id": 123}`,
			results: map[string]engine.StepState{"charge": failedState(500, `{"error": "card declined"}`)},
			want:    map[string]string{"charge": failed_, "send-receipt": skipped, "notify-warehouse": skipped, "handle-failure": ok},
			run:     status.RunCompleted,
		},
		{
			name:    "order-processing charge timed out",
			file:    "order-processing.json",
			trigger: `{"order_id": 123}`,
			results: map[string]engine.StepState{"charge": timedOut()},
			// status_code is null, and null != 200.
			want: map[string]string{"charge": timeout, "send-receipt": skipped, "notify-warehouse": skipped, "handle-failure": ok},
			run:  status.RunCompleted,
		},
		{
			name:    "trial-expiry all succeed",
			file:    "trial-expiry.json",
			trigger: `{"user_id": "u_1"}`,
			want:    map[string]string{"start-trial": ok, "wait-13-days": ok, "send-reminder": ok, "wait-1-day": ok, "expire-trial": ok},
			run:     status.RunCompleted,
			bodies: map[string]string{
				"start-trial":   `{"user_id": "u_1"}`,
				"send-reminder": `{"template": "trial-ending-soon", "user_id": "u_1"}`,
				"expire-trial":  `{"user_id": "u_1"}`,
			},
			order: []string{"start-trial", "wait-13-days", "send-reminder", "wait-1-day", "expire-trial"},
		},
		{
			name:    "trial-expiry activation fails",
			file:    "trial-expiry.json",
			trigger: `{"user_id": "u_1"}`,
			results: map[string]engine.StepState{"start-trial": failedState(503, ``)},
			want: map[string]string{
				"start-trial": failed_, "wait-13-days": skipped + "+blocked",
				"send-reminder": skipped, "wait-1-day": skipped, "expire-trial": skipped,
			},
			run: status.RunFailed,
		},
		{
			name:    "trial-expiry reminder fails midway",
			file:    "trial-expiry.json",
			trigger: `{"user_id": "u_1"}`,
			results: map[string]engine.StepState{"send-reminder": failedState(500, ``)},
			want: map[string]string{
				"start-trial": ok, "wait-13-days": ok, "send-reminder": failed_,
				"wait-1-day": skipped + "+blocked", "expire-trial": skipped,
			},
			run: status.RunFailed,
		},
		{
			name:    "checkout paid",
			file:    "checkout-flow.json",
			trigger: `{"amount": 99.95, "order_id": 7}`,
			results: map[string]engine.StepState{
				"payment-result": {Status: status.StepSuccess, Body: []byte(`{"status": "paid", "payment_id": "pay_1"}`)},
			},
			want: map[string]string{"create-checkout": ok, "payment-result": ok, "fulfill-order": ok, "handle-timeout": skipped},
			run:  status.RunCompleted,
			bodies: map[string]string{
				"create-checkout": `{"amount": 99.95, "callback_url": "https://ferry.test/wh/tok-payment-result"}`,
				"fulfill-order":   `{"order_id": 7, "payment_id": "pay_1"}`,
			},
		},
		{
			name:    "checkout declined",
			file:    "checkout-flow.json",
			trigger: `{"amount": 99.95, "order_id": 7}`,
			results: map[string]engine.StepState{
				"payment-result": {Status: status.StepSuccess, Body: []byte(`{"status": "declined"}`)},
			},
			want: map[string]string{"create-checkout": ok, "payment-result": ok, "fulfill-order": skipped, "handle-timeout": skipped},
			run:  status.RunCompleted,
		},
		{
			name:    "checkout webhook timed out",
			file:    "checkout-flow.json",
			trigger: `{"amount": 99.95, "order_id": 7}`,
			results: map[string]engine.StepState{"payment-result": timedOut()},
			// fulfill-order reads body.status of a null body: its condition
			// is false (a skip), not a template error.
			want: map[string]string{"create-checkout": ok, "payment-result": timeout, "fulfill-order": skipped, "handle-timeout": ok},
			run:  status.RunCompleted,
		},
		{
			name:    "checkout create fails",
			file:    "checkout-flow.json",
			trigger: `{"amount": 99.95, "order_id": 7}`,
			results: map[string]engine.StepState{"create-checkout": failedState(500, `oops`)},
			// The wait step has no `if`: blocked. Its dependents have one,
			// so they are evaluated against a skipped step.
			want: map[string]string{"create-checkout": failed_, "payment-result": skipped + "+blocked", "fulfill-order": skipped, "handle-timeout": skipped},
			run:  status.RunFailed,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			def := parseFile(t, tc.file)
			s := newSim(t, def, tc.trigger, byStep(tc.results))
			out := s.play()
			if diff := cmp.Diff(tc.want, s.statuses()); diff != "" {
				t.Errorf("step statuses (-want +got):\n%s", diff)
			}
			if out.Status != tc.run || !out.Done {
				t.Errorf("outcome = %+v, want %s", out, tc.run)
			}
			if (out.Status == status.RunFailed) != (out.Reason != "") {
				t.Errorf("outcome reason %q for status %s", out.Reason, out.Status)
			}
			for step, want := range tc.bodies {
				d := s.decisions[step]
				if d.HTTP == nil {
					t.Errorf("%s: no request (decision %+v)", step, d)
					continue
				}
				jsonEqual(t, step, d.HTTP.Body, want)
			}
			if tc.order != nil {
				if diff := cmp.Diff(tc.order, s.order); diff != "" {
					t.Errorf("decision order (-want +got):\n%s", diff)
				}
			}
			for name, d := range s.decisions {
				if d.Action == engine.Skip && d.Reason == "" {
					t.Errorf("%s skipped without a reason", name)
				}
			}
		})
	}
}

func okState(code int, body string) engine.StepState     { return ok(code, body) }
func failedState(code int, body string) engine.StepState { return failed(code, body) }

func TestSeedRequests(t *testing.T) {
	def := parseFile(t, "api-create.json")
	s := newSim(t, def, `{"order_id": 123, "email": "alice@example.com", "token": "sk_live_xxx"}`, byStep(nil))
	if out := s.play(); out.Status != status.RunCompleted {
		t.Fatalf("outcome %+v", out)
	}
	want := &engine.HTTPRequest{
		URL:     "https://myapp.com/api/charge",
		Method:  "POST",
		Headers: map[string]string{"Authorization": "Bearer sk_live_xxx"},
		Body:    []byte(`{"order_id":123}`),
	}
	if diff := cmp.Diff(want, s.decisions["charge"].HTTP); diff != "" {
		t.Errorf("charge request (-want +got):\n%s", diff)
	}
	if got := string(s.decisions["send-receipt"].HTTP.Body); got != `{"email":"alice@example.com"}` {
		t.Errorf("send-receipt body = %s", got)
	}
}

func TestSkipReasons(t *testing.T) {
	def := parseFile(t, "order-processing.json")
	s := newSim(t, def, `{"order_id": 1}`, byStep(map[string]engine.StepState{"charge": ok(201, `{}`)}))
	s.play()
	for _, n := range []string{"send-receipt", "notify-warehouse"} {
		d := s.decisions[n]
		if d.Action != engine.Skip || d.Blocked || d.Reason != "condition is false: tasks.charge.status_code == 200" {
			t.Errorf("%s: %+v", n, d)
		}
	}
	if d := s.decisions["handle-failure"]; d.Action != engine.StartHTTP {
		t.Errorf("handle-failure: %+v", d)
	}
}

const chainDoc = `{"name":"chain","tasks":{
	"root":{"url":"https://x.test/root"},
	"a":{"needs":["root"],"if":"tasks.root.status_code == 200","url":"https://x.test/a"},
	"b":{"needs":["a"],"url":"https://x.test/b"},
	"c":{"needs":["b"],"sleep":"1s"}
}}`

func TestCascadeSkipThroughChain(t *testing.T) {
	def := parse(t, chainDoc)
	s := newSim(t, def, ``, byStep(map[string]engine.StepState{"root": failed(500, ``)}))
	out := s.play()
	want := map[string]string{"root": status.StepFailed, "a": status.StepSkipped, "b": status.StepSkipped, "c": status.StepSkipped}
	if diff := cmp.Diff(want, s.statuses()); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if out.Status != status.RunCompleted {
		t.Errorf("outcome %+v, want completed: a routed around the failure and the rest cascaded", out)
	}
	if got := s.decisions["b"].Reason; got != `dependency "a" was skipped` {
		t.Errorf("b reason = %q", got)
	}
	// a, b and c are all decided in the round where root finished.
	if s.rounds != 2 {
		t.Errorf("rounds = %d, want 2 (the cascade follows in one Next call)", s.rounds)
	}
}

func TestCascadeInOneCall(t *testing.T) {
	def := parse(t, chainDoc)
	ds := engine.Next(engine.Run{Def: def, Steps: map[string]engine.StepState{"root": ok(404, ``)}})
	var got []string
	for _, d := range ds {
		got = append(got, d.Step+":"+string(d.Action))
	}
	want := []string{"a:skip", "b:skip", "c:skip"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decisions (-want +got):\n%s", diff)
	}
}

// TestScopeReadsStepsDecidedInTheSameCall: steps are read into the
// templates' scope when first read, from the run's state as it stands in
// the call: a step skipped earlier in the same Next reads as skipped
// (status "skipped", null body) to the decisions after it, and a finished
// step read by several decisions reads the same each time.
func TestScopeReadsStepsDecidedInTheSameCall(t *testing.T) {
	def := parse(t, `{"name":"lazy","tasks":{
		"root":{"url":"https://x.test/root"},
		"a":{"needs":["root"],"if":"tasks.root.body.x == 2","url":"https://x.test/a"},
		"b":{"needs":["a"],"if":"tasks.a.status == 'skipped'","url":"https://x.test/b","body":{"x":"{{tasks.root.body.x}}","a":"{{tasks.a.body}}"}},
		"c":{"needs":["a"],"url":"https://x.test/c","body":{"x":"{{tasks.root.body.x}}"}}
	}}`)
	ds := decideAll(t, engine.Run{Def: def, Steps: map[string]engine.StepState{"root": ok(200, `{"x": 1}`)}})
	if ds["a"].Action != engine.Skip || ds["b"].Action != engine.StartHTTP || ds["c"].Action != engine.Skip {
		t.Fatalf("decisions a %s, b %s (%s), c %s; want skip, start, skip", ds["a"].Action, ds["b"].Action, ds["b"].Reason, ds["c"].Action)
	}
	jsonEqual(t, "b", ds["b"].HTTP.Body, `{"x": 1, "a": null}`)
}

func TestFailureBlocksAndFailsRun(t *testing.T) {
	def := parse(t, `{"name":"blk","tasks":{
		"a":{"url":"https://x.test/a"},
		"b":{"needs":["a"],"url":"https://x.test/b"},
		"c":{"needs":["b"],"url":"https://x.test/c"},
		"d":{"needs":["a"],"if":"tasks.a.status == 'failed'","url":"https://x.test/d"}
	}}`)
	for _, end := range []engine.StepState{failed(500, ``), timedOut(), {Status: status.StepCancelled}} {
		t.Run(end.Status, func(t *testing.T) {
			s := newSim(t, def, ``, byStep(map[string]engine.StepState{"a": end}))
			out := s.play()
			want := map[string]string{"a": end.Status, "b": "skipped+blocked", "c": "skipped", "d": status.StepSkipped}
			if end.Status == status.StepFailed {
				want["d"] = status.StepSuccess
			}
			if diff := cmp.Diff(want, s.statuses()); diff != "" {
				t.Errorf("statuses (-want +got):\n%s", diff)
			}
			if out.Status != status.RunFailed || !strings.Contains(out.Reason, "b") {
				t.Errorf("outcome %+v, want failed naming b", out)
			}
			if r := s.decisions["b"].Reason; r != `blocked: dependency "a" ended `+end.Status {
				t.Errorf("b reason = %q", r)
			}
		})
	}
}

func TestTemplateErrorBlocksDependents(t *testing.T) {
	def := parse(t, `{"name":"te","tasks":{
		"a":{"url":"https://x.test/a"},
		"b":{"needs":["a"],"url":"https://x.test/b","body":{"x":"{{tasks.a.body.missing}}"}},
		"c":{"needs":["b"],"url":"https://x.test/c"}
	}}`)
	s := newSim(t, def, ``, byStep(nil))
	out := s.play()
	want := map[string]string{"a": status.StepSuccess, "b": status.StepTemplateError, "c": "skipped+blocked"}
	if diff := cmp.Diff(want, s.statuses()); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if out.Status != status.RunFailed {
		t.Errorf("outcome %+v", out)
	}
}

func TestIfOnSkippedDependency(t *testing.T) {
	def := parse(t, `{"name":"sk","tasks":{
		"root":{"url":"https://x.test/root"},
		"a":{"needs":["root"],"if":"tasks.root.status_code == 200","url":"https://x.test/a"},
		"on-skip":{"needs":["a"],"if":"tasks.a.status == 'skipped'","url":"https://x.test/s","body":{"code":"{{tasks.a.status_code}}","st":"{{tasks.a.status}}","b":"{{tasks.a.body}}"}},
		"on-200":{"needs":["a"],"if":"tasks.a.status_code == 200","url":"https://x.test/t"},
		"not-null":{"needs":["a"],"if":"tasks.a.status_code != null","url":"https://x.test/u"}
	}}`)
	s := newSim(t, def, ``, byStep(map[string]engine.StepState{"root": ok(202, `{}`)}))
	out := s.play()
	want := map[string]string{"root": "success", "a": "skipped", "on-skip": "success", "on-200": "skipped", "not-null": "skipped"}
	if diff := cmp.Diff(want, s.statuses()); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if out.Status != status.RunCompleted {
		t.Errorf("outcome %+v", out)
	}
	// A skipped step reads as status "skipped", status_code null, body null.
	jsonEqual(t, "on-skip", s.decisions["on-skip"].HTTP.Body, `{"code": null, "st": "skipped", "b": null}`)
}

// A step is undecided until every need is terminal, whatever its `if`.
func TestWaitsForAllNeeds(t *testing.T) {
	def := parse(t, `{"name":"join","tasks":{
		"a":{"url":"https://x.test/a"},
		"b":{"sleep":"1h"},
		"c":{"needs":["a","b"],"if":"tasks.a.status == 'success'","url":"https://x.test/c"},
		"d":{"needs":["a","b"],"url":"https://x.test/d"}
	}}`)
	for _, st := range []string{status.StepRunning, status.StepSleeping, status.StepWaiting, status.StepPending, ""} {
		ds := engine.Next(engine.Run{Def: def, Steps: map[string]engine.StepState{"a": ok(200, `{}`), "b": {Status: st}}})
		for _, d := range ds {
			if d.Step == "c" || d.Step == "d" {
				t.Errorf("b %q: %s decided early: %+v", st, d.Step, d)
			}
		}
	}
	ds := engine.Next(engine.Run{Def: def, Steps: map[string]engine.StepState{"a": ok(200, `{}`), "b": {Status: status.StepSuccess}}})
	if len(ds) != 2 || ds[0].Step != "c" || ds[1].Step != "d" || ds[0].Action != engine.StartHTTP || ds[1].Action != engine.StartHTTP {
		t.Errorf("decisions %+v", ds)
	}
	// Nothing started yet: a and b move together, in definition order.
	ds = engine.Next(engine.Run{Def: def})
	if len(ds) != 2 || ds[0].Action != engine.StartHTTP || ds[1].Action != engine.StartSleep || ds[1].Sleep != time.Hour {
		t.Errorf("first decisions %+v", ds)
	}
}

// Blocking must not depend on the order in which needs are listed: a no-`if`
// step with a failed need is blocked even when another need was skipped.
func TestBlockedRegardlessOfNeedsOrder(t *testing.T) {
	for _, needs := range []string{`["x","f"]`, `["f","x"]`} {
		def := parse(t, `{"name":"ord","tasks":{
			"f":{"url":"https://x.test/f"},
			"x":{"needs":["f"],"if":"tasks.f.status == 'success'","url":"https://x.test/x"},
			"j":{"needs":`+needs+`,"url":"https://x.test/j"}
		}}`)
		s := newSim(t, def, ``, byStep(map[string]engine.StepState{"f": failed(500, ``)}))
		out := s.play()
		if d := s.decisions["j"]; d.Action != engine.Skip || !d.Blocked {
			t.Errorf("needs %s: j = %+v, want a blocked skip", needs, d)
		}
		if out.Status != status.RunFailed {
			t.Errorf("needs %s: outcome %+v, want failed", needs, out)
		}
	}
}

func TestEvaluate(t *testing.T) {
	def := parse(t, chainDoc)
	all := func(s string) map[string]engine.StepState {
		m := map[string]engine.StepState{}
		for _, st := range def.Steps {
			m[st.Name] = engine.StepState{Status: s}
		}
		return m
	}
	cases := []struct {
		name  string
		steps map[string]engine.StepState
		want  engine.Outcome
	}{
		{"nothing started", nil, engine.Outcome{Status: status.RunRunning}},
		{"all succeeded", all(status.StepSuccess), engine.Outcome{Status: status.RunCompleted, Done: true}},
		{"all failed but none blocked", all(status.StepFailed), engine.Outcome{Status: status.RunCompleted, Done: true}},
		{"one running", func() map[string]engine.StepState {
			m := all(status.StepSuccess)
			m["c"] = engine.StepState{Status: status.StepSleeping}
			return m
		}(), engine.Outcome{Status: status.RunRunning}},
		{"blocked", func() map[string]engine.StepState {
			m := all(status.StepSkipped)
			m["root"] = engine.StepState{Status: status.StepFailed}
			m["b"] = engine.StepState{Status: status.StepSkipped, Blocked: true}
			return m
		}(), engine.Outcome{Status: status.RunFailed, Done: true, Reason: "blocked by a failed dependency: b"}},
	}
	for _, tc := range cases {
		if got := engine.Evaluate(def, tc.steps); got != tc.want {
			t.Errorf("%s: Evaluate = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// decideAll runs Next once and indexes the decisions by step.
func decideAll(t *testing.T, r engine.Run) map[string]engine.Decision {
	t.Helper()
	out := map[string]engine.Decision{}
	for _, d := range engine.Next(r) {
		out[d.Step] = d
	}
	return out
}

func TestTemplates(t *testing.T) {
	const doc = `{"name":"tpl","tasks":{
		"charge":{"url":"https://x.test/charge"},
		"hook":{"wait_for_webhook":{"timeout":"1h"}},
		"single":{"needs":["charge"],"url":"https://x.test/s","body":{"amount":"{{tasks.charge.body.amount}}","big":"{{trigger.body.big}}","obj":"{{ tasks.charge.body.obj }}","flag":"{{tasks.charge.body.flag}}","nothing":"{{tasks.charge.body.nothing}}","code":"{{tasks.charge.status_code}}"}},
		"text":{"needs":["charge"],"url":"https://x.test/t","body":{"msg":"Paid {{tasks.charge.body.amount}} {{tasks.charge.body.currency}} ({{tasks.charge.body.obj}}, {{tasks.charge.status_code}})"}},
		"missing":{"needs":["charge"],"url":"https://x.test/m","body":{"x":"{{tasks.charge.body.missing}}"}},
		"url":{"needs":["charge"],"url":"https://x.test/orders/{{trigger.body.order_id}}?amount={{tasks.charge.body.amount}}","method":"PUT"},
		"headers":{"needs":["charge"],"url":"https://x.test/h","headers":{"Authorization":"Bearer {{trigger.body.token}}","X-Count":"{{trigger.body.order_id}}","X-Req":"{{trigger.headers.x-request-id}}","X-Charge":"{{tasks.charge.headers.content-type}}"}},
		"strbody":{"needs":["charge"],"url":"https://x.test/sb","body":"order={{trigger.body.order_id}}&note=<b>&amount={{tasks.charge.body.amount}}"},
		"strsingle":{"needs":["charge"],"url":"https://x.test/ss","body":"{{trigger.body.token}}"},
		"numsingle":{"needs":["charge"],"url":"https://x.test/ns","body":"{{trigger.body.order_id}}"},
		"callback":{"url":"https://x.test/cb","body":{"callback_url":"{{wait.hook.url}}"}},
		"arr":{"needs":["charge"],"url":"https://x.test/arr","body":["{{tasks.charge.body.obj.items[1]}}","{{tasks.charge.body.obj.items.0}}",{"{{trigger.body.token}}":true}]}
	}}`
	def := parse(t, doc)
	r := engine.Run{
		Def:            def,
		TriggerBody:    []byte(`{"order_id": 123, "token": "sk_1", "big": 12345678901234567890}`),
		TriggerHeaders: map[string]string{"X-Request-Id": "req-9"},
		Steps: map[string]engine.StepState{
			"charge": {Status: status.StepSuccess, StatusCode: intp(200), Body: []byte(`{"amount": 42.50, "currency": "EUR", "obj": {"items": [1, 2]}, "flag": false, "nothing": null}`), Headers: map[string]string{"Content-Type": "application/json"}},
		},
		WaitURLs: map[string]string{"hook": "https://ferry.test/wh/abc"},
	}
	ds := decideAll(t, r)
	body := func(step string) string {
		t.Helper()
		d, ok := ds[step]
		if !ok || d.Action != engine.StartHTTP {
			t.Fatalf("%s: decision %+v", step, d)
		}
		return string(d.HTTP.Body)
	}
	// A single placeholder keeps the value's JSON type, numbers exactly as
	// received (42.50 stays 42.50; a big integer is not rounded).
	if got, want := body("single"), `{"amount":42.50,"big":12345678901234567890,"code":200,"flag":false,"nothing":null,"obj":{"items":[1,2]}}`; got != want {
		t.Errorf("single:\n got %s\nwant %s", got, want)
	}
	if got, want := body("text"), `{"msg":"Paid 42.50 EUR ({\"items\":[1,2]}, 200)"}`; got != want {
		t.Errorf("text:\n got %s\nwant %s", got, want)
	}
	if got, want := body("strbody"), `order=123&note=<b>&amount=42.50`; got != want {
		t.Errorf("string body sent verbatim:\n got %q\nwant %q", got, want)
	}
	if got, want := body("strsingle"), `sk_1`; got != want {
		t.Errorf("string body from one string placeholder = %q, want %q", got, want)
	}
	if got, want := body("numsingle"), `123`; got != want {
		t.Errorf("body from one number placeholder = %q, want %q", got, want)
	}
	if got, want := body("callback"), `{"callback_url":"https://ferry.test/wh/abc"}`; got != want {
		t.Errorf("callback = %s", got)
	}
	if got, want := body("arr"), `[2,1,{"sk_1":true}]`; got != want {
		t.Errorf("arr = %s, want %s", got, want)
	}
	if d := ds["url"]; d.Action != engine.StartHTTP || d.HTTP.URL != "https://x.test/orders/123?amount=42.50" || d.HTTP.Method != "PUT" || d.HTTP.Body != nil {
		t.Errorf("url: %+v %+v", d, d.HTTP)
	}
	wantHeaders := map[string]string{"Authorization": "Bearer sk_1", "X-Count": "123", "X-Req": "req-9", "X-Charge": "application/json"}
	if d := ds["headers"]; d.HTTP == nil || cmp.Diff(wantHeaders, d.HTTP.Headers) != "" {
		t.Errorf("headers: %+v", d)
	}
	d := ds["missing"]
	if d.Action != engine.TemplateError || !strings.HasPrefix(d.Reason, "Failed to resolve {{tasks.charge.body.missing}}") {
		t.Errorf("missing: %+v", d)
	}
	if d.HTTP != nil {
		t.Errorf("template error carries a request")
	}
	// The wait step and the callback step start in the same call.
	if ds["hook"].Action != engine.StartWait || ds["hook"].Timeout != time.Hour {
		t.Errorf("hook: %+v", ds["hook"])
	}
}

func TestTemplateErrors(t *testing.T) {
	cases := []struct {
		name    string
		body    string // the "use" step's body
		charge  engine.StepState
		trigger string
		want    string // exact reason, or prefix ending in "*"
	}{
		{
			name:   "truncated body field",
			body:   `{"amount":"{{tasks.charge.body.amount}}"}`,
			charge: truncated(200, `{"amount": 4`),
			want:   `Cannot read 'body.amount' because the response from 'charge' exceeded the 256KB limit and was truncated`,
		},
		{
			name:   "truncated body nested field",
			body:   `"total={{tasks.charge.body.order.items[0].price}}"`,
			charge: truncated(200, `{"order":`),
			want:   `Cannot read 'body.order.items[0].price' because the response from 'charge' exceeded the 256KB limit and was truncated`,
		},
		{
			name:   "non-JSON body field",
			body:   `{"f":"{{tasks.charge.body.f}}"}`,
			charge: ok(200, `<html>ok</html>`),
			want:   `Failed to resolve {{tasks.charge.body.f}}: *`,
		},
		{
			name:   "missing nested field",
			body:   `{"f":"{{tasks.charge.body.a.b}}"}`,
			charge: ok(200, `{"a": {"c": 1}}`),
			want:   `Failed to resolve {{tasks.charge.body.a.b}}: *`,
		},
		{
			name:   "field of an empty body",
			body:   `{"f":"{{tasks.charge.body.id}}"}`,
			charge: ok(204, ``),
			want:   `Failed to resolve {{tasks.charge.body.id}}: *`,
		},
		{
			name:   "index out of range",
			body:   `["{{tasks.charge.body[3]}}"]`,
			charge: ok(200, `[1,2]`),
			want:   `Failed to resolve {{tasks.charge.body[3]}}: *`,
		},
		{
			name:    "missing trigger field",
			body:    `{"id":"{{trigger.body.order_id}}"}`,
			charge:  ok(200, `{}`),
			trigger: `{"orderId": 1}`,
			want:    `Failed to resolve {{trigger.body.order_id}}: *`,
		},
		{
			name:    "no trigger body",
			body:    `{"id":"{{trigger.body.order_id}}"}`,
			charge:  ok(200, `{}`),
			trigger: ``,
			want:    `Failed to resolve {{trigger.body.order_id}}: *`,
		},
		{
			name:   "missing response header",
			body:   `"{{tasks.charge.headers.x-missing}}"`,
			charge: ok(200, `{}`),
			want:   `Failed to resolve {{tasks.charge.headers.x-missing}}: *`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			def := parse(t, `{"name":"te","tasks":{"charge":{"url":"https://x.test/c"},"use":{"needs":["charge"],"url":"https://x.test/u","body":`+tc.body+`}}}`)
			ds := decideAll(t, engine.Run{Def: def, TriggerBody: []byte(tc.trigger), Steps: map[string]engine.StepState{"charge": tc.charge}})
			d := ds["use"]
			if d.Action != engine.TemplateError {
				t.Fatalf("decision %+v, want a template error", d)
			}
			if p, ok := strings.CutSuffix(tc.want, "*"); ok {
				if !strings.HasPrefix(d.Reason, p) {
					t.Errorf("reason %q, want prefix %q", d.Reason, p)
				}
			} else if d.Reason != tc.want {
				t.Errorf("reason\n got %q\nwant %q", d.Reason, tc.want)
			}
		})
	}
}

func TestRawBodies(t *testing.T) {
	def := parse(t, `{"name":"raw","tasks":{"x":{"url":"https://x.test/x"},"use":{"needs":["x"],"url":"https://x.test/u","body":{"raw":"{{tasks.x.body}}","len":"body={{tasks.x.body}}"}}}}`)
	for _, tc := range []struct {
		name  string
		state engine.StepState
		want  string
	}{
		{"non-JSON body reads raw", ok(200, `plain "text"`), `{"len":"body=plain \"text\"","raw":"plain \"text\""}`},
		{"truncated body reads raw", truncated(200, `{"a": [1, 2`), `{"len":"body={\"a\": [1, 2","raw":"{\"a\": [1, 2"}`},
		{"JSON body reads parsed", ok(200, `{"a": [1, 2]}`), `{"len":"body={\"a\":[1,2]}","raw":{"a":[1,2]}}`},
		{"two JSON values are not JSON", ok(200, `{} {}`), `{"len":"body={} {}","raw":"{} {}"}`},
		{"empty body is null", ok(204, ``), `{"len":"body=null","raw":null}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decideAll(t, engine.Run{Def: def, Steps: map[string]engine.StepState{"x": tc.state}})["use"]
			if d.Action != engine.StartHTTP {
				t.Fatalf("decision %+v", d)
			}
			if got := string(d.HTTP.Body); got != tc.want {
				t.Errorf("body\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestRenderedURLMustBeHTTP(t *testing.T) {
	def := parse(t, `{"name":"u","tasks":{"a":{"url":"{{trigger.body.target}}"}}}`)
	for target, wantOK := range map[string]bool{
		"https://x.test/p":   true,
		"http://x.test":      true,
		"ftp://x.test/p":     false,
		"/relative":          false,
		"javascript:alert()": false,
	} {
		trig, _ := json.Marshal(map[string]string{"target": target})
		d := decideAll(t, engine.Run{Def: def, TriggerBody: trig})["a"]
		if got := d.Action == engine.StartHTTP; got != wantOK {
			t.Errorf("target %q: %+v", target, d)
		}
		if !wantOK && d.Action != engine.TemplateError {
			t.Errorf("target %q: action %s, want template_error", target, d.Action)
		}
	}
}

// TestRenderedURLQueryIsEscaped: what a template puts in a query that a
// URL cannot carry is percent-encoded, as a browser would send it. Go
// sends a query as it is: "?q={{trigger.body.q}}" with "a b" made the
// request line "POST /s?q=a b HTTP/1.1", which servers answer 400.
func TestRenderedURLQueryIsEscaped(t *testing.T) {
	def := parse(t, `{"name":"u","tasks":{"a":{"url":"https://x.test/s/{{trigger.body.p}}?q={{trigger.body.q}}&n=1"}}}`)
	for _, c := range []struct{ p, q, want string }{
		{"x", "a b", "https://x.test/s/x?q=a%20b&n=1"},
		{"x", `"<é>"`, "https://x.test/s/x?q=%22%3C%C3%A9%3E%22&n=1"},
		{"x", "100%", "https://x.test/s/x?q=100%25&n=1"},
		{"x", "{a|b}^`\\", "https://x.test/s/x?q=%7Ba%7Cb%7D%5E%60%5C&n=1"},
		// Escapes, and what a query may hold, stay as they are.
		{"x", "a%20b%2B", "https://x.test/s/x?q=a%20b%2B&n=1"},
		{"x", "a+b=c&d/e?f:g@h!$'()*,;~", "https://x.test/s/x?q=a+b=c&d/e?f:g@h!$'()*,;~&n=1"},
		// The path is Go's to escape, and a fragment is never sent.
		{"a b", "x#a b", "https://x.test/s/a b?q=x#a b&n=1"},
		{"x", "x y#z", "https://x.test/s/x?q=x%20y#z&n=1"},
	} {
		trig, _ := json.Marshal(map[string]string{"p": c.p, "q": c.q})
		d := decideAll(t, engine.Run{Def: def, TriggerBody: trig})["a"]
		if d.Action != engine.StartHTTP {
			t.Errorf("q %q: %+v", c.q, d)
			continue
		}
		if d.HTTP.URL != c.want {
			t.Errorf("q %q: url %q, want %q", c.q, d.HTTP.URL, c.want)
		}
	}
}

// A URL that does not parse after templates says why (a '%' that starts
// no escape), not that it is not absolute, which it is.
func TestRenderedURLThatDoesNotParseSaysWhy(t *testing.T) {
	def := parse(t, `{"name":"u","tasks":{"a":{"url":"https://x.test/s/{{trigger.body.p}}"}}}`)
	d := decideAll(t, engine.Run{Def: def, TriggerBody: []byte(`{"p":"100%zz"}`)})["a"]
	if d.Action != engine.TemplateError || !strings.Contains(d.Reason, `invalid URL escape "%zz"`) || strings.Contains(d.Reason, "absolute") {
		t.Fatalf("%v: %q", d.Action, d.Reason)
	}
}

// The condition of an `if` step is evaluated before its templates: a false
// condition skips the step even when its templates could not resolve.
func TestFalseConditionSkipsBeforeTemplates(t *testing.T) {
	def := parse(t, `{"name":"c","tasks":{"a":{"url":"https://x.test/a"},"b":{"needs":["a"],"if":"tasks.a.status == 'success'","url":"https://x.test/b","body":{"x":"{{tasks.a.body.id}}"}}}}`)
	d := decideAll(t, engine.Run{Def: def, Steps: map[string]engine.StepState{"a": timedOut()}})["b"]
	if d.Action != engine.Skip || d.Blocked {
		t.Errorf("b = %+v, want a plain skip", d)
	}
	d = decideAll(t, engine.Run{Def: def, Steps: map[string]engine.StepState{"a": ok(200, `{}`)}})["b"]
	if d.Action != engine.TemplateError {
		t.Errorf("b = %+v, want a template error", d)
	}
}

// Next reads its input and never writes to it.
func TestNextDoesNotMutateInput(t *testing.T) {
	def := parse(t, chainDoc)
	steps := map[string]engine.StepState{"root": failed(500, `{"e":1}`)}
	r := engine.Run{Def: def, Steps: steps, TriggerBody: []byte(`{"a":1}`)}
	engine.Next(r)
	if len(steps) != 1 || steps["root"].Status != status.StepFailed {
		t.Errorf("input steps changed: %v", steps)
	}
}

// An `if` on a step without needs reads the trigger.
func TestConditionOnTrigger(t *testing.T) {
	def := parse(t, `{"name":"trg","tasks":{
		"vip":{"if":"trigger.body.tier == 'gold' && trigger.headers.x-source != null","url":"https://x.test/vip"},
		"rest":{"if":"!(trigger.body.tier == 'gold')","sleep":"2s"}
	}}`)
	for trig, want := range map[string][2]engine.Action{
		`{"tier": "gold"}`:   {engine.StartHTTP, engine.Skip},
		`{"tier": "silver"}`: {engine.Skip, engine.StartSleep},
		``:                   {engine.Skip, engine.StartSleep},
	} {
		ds := decideAll(t, engine.Run{Def: def, TriggerBody: []byte(trig), TriggerHeaders: map[string]string{"X-Source": "crm"}})
		if ds["vip"].Action != want[0] || ds["rest"].Action != want[1] {
			t.Errorf("trigger %s: vip %s rest %s, want %v", trig, ds["vip"].Action, ds["rest"].Action, want)
		}
		if d := ds["rest"]; d.Action == engine.StartSleep && d.Sleep != 2*time.Second {
			t.Errorf("sleep %v", d.Sleep)
		}
	}
}

// Steps are decided in definition order, and the decisions of one call do
// not depend on the order of the input map.
func TestDecisionOrderIsDefinitionOrder(t *testing.T) {
	def := parse(t, `{"name":"ord","tasks":{
		"z":{"url":"https://x.test/z"},
		"a":{"sleep":"1s"},
		"m":{"wait_for_webhook":true},
		"b":{"needs":["z"],"url":"https://x.test/b"}
	}}`)
	for range 20 {
		var got []string
		for _, d := range engine.Next(engine.Run{Def: def, Steps: map[string]engine.StepState{"x-unknown": {Status: status.StepSuccess}}}) {
			got = append(got, d.Step)
		}
		if diff := cmp.Diff([]string{"z", "a", "m"}, got); diff != "" {
			t.Fatalf("order (-want +got):\n%s", diff)
		}
	}
	if def.Step("m").Type != spec.StepWebhook || def.Step("m").WaitTimeout != 0 {
		t.Errorf("wait_for_webhook: true = %+v", def.Step("m"))
	}
}

// A call that goes round again (a skip made later steps decidable)
// decides every step once: the steps it started in an earlier round are
// not started again, in a run of a few steps and in one of more than 64
// (past the fixed-size record of decided steps).
func TestNextDecidesEachStepOnce(t *testing.T) {
	for _, n := range []int{3, 70} {
		var sb strings.Builder
		sb.WriteString(`{"name":"once","tasks":{`)
		for i := range n {
			fmt.Fprintf(&sb, `"s%02d":{"task":{"type":"once.work.v1"}},`, i)
		}
		sb.WriteString(`"gate":{"if":"trigger.body.go == true","url":"https://x.test/g"},`)
		sb.WriteString(`"after":{"needs":["gate"],"url":"https://x.test/a"}}}`)
		def := parse(t, sb.String())
		steps := map[string]engine.StepState{}
		if n == 70 {
			steps = nil // no states at all: the skip's copy starts from nothing
		}
		seen := map[string]int{}
		var skips []string
		for _, d := range engine.Next(engine.Run{Def: def, Steps: steps, TriggerBody: []byte(`{"go":false}`)}) {
			seen[d.Step]++
			if d.Action == engine.Skip {
				skips = append(skips, d.Step)
			}
		}
		if len(seen) != n+2 {
			t.Errorf("%d steps: %d decided, want %d", n, len(seen), n+2)
		}
		for name, c := range seen {
			if c != 1 {
				t.Errorf("%d steps: %s decided %d times", n, name, c)
			}
		}
		if diff := cmp.Diff([]string{"gate", "after"}, skips); diff != "" {
			t.Errorf("%d steps: skips (-want +got):\n%s", n, diff)
		}
	}
}

// TestRenderedURLErrorKeepsSecretsOut: a URL that is no http or https URL
// after its templates fails the step (template_error) with an error that
// names it without its user information, its query's values or its
// fragment, as an HTTP attempt's errors name its URL: the error is the
// step's error and its span's status, and a query often carries an API
// key. It was quoted whole. (Found by an audit.)
func TestRenderedURLErrorKeepsSecretsOut(t *testing.T) {
	def := parse(t, `{"name":"u","tasks":{"a":{"url":"https://{{trigger.body.host}}/v1?api_key=SECRETKEY&x=1&SECRETKEY#SECRETKEY"}}}`)
	for _, host := range []string{"", "eu api.test", "api.test:44x3"} {
		trig, _ := json.Marshal(map[string]string{"host": host})
		d := decideAll(t, engine.Run{Def: def, TriggerBody: trig})["a"]
		if d.Action != engine.TemplateError {
			t.Fatalf("host %q: action %s, want template_error", host, d.Action)
		}
		if strings.Contains(d.Reason, "SECRETKEY") || !strings.Contains(d.Reason, "/v1?api_key=REDACTED") {
			t.Errorf("host %q: reason %q: want the URL named without its query's values and fragment", host, d.Reason)
		}
	}
	def = parse(t, `{"name":"u","tasks":{"a":{"url":"{{trigger.body.target}}"}}}`)
	for _, target := range []string{
		"https://svc:pa55word@api.test:44x3/v1",
		"https://svc:pa%zzword@api.test/v1",
		"ftp://svc:pa55word@api.test/v1?token=SECRETKEY",
		"api.test/v1?token=SECRETKEY",
	} {
		trig, _ := json.Marshal(map[string]string{"target": target})
		d := decideAll(t, engine.Run{Def: def, TriggerBody: trig})["a"]
		if d.Action != engine.TemplateError {
			t.Fatalf("target %q: action %s, want template_error", target, d.Action)
		}
		if strings.Contains(d.Reason, "SECRETKEY") || strings.Contains(d.Reason, "pa55") || strings.Contains(d.Reason, "pa%zz") || !strings.Contains(d.Reason, "api.test") {
			t.Errorf("target %q: reason %q: want the URL named without its password and query's values", target, d.Reason)
		}
	}
}
