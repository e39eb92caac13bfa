package expr

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func intp(i int) *int { return &i }

// decode mirrors how the engine decodes bodies: with UseNumber.
func decode(t testing.TB, s string) any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return v
}

func testScope(t testing.TB) *Scope {
	var floaty any // decoded without UseNumber: float64 numbers
	if err := json.Unmarshal([]byte(`{"code":200,"half":0.5}`), &floaty); err != nil {
		t.Fatal(err)
	}
	return &Scope{
		TriggerBody: decode(t, `{"order_id":"ord_1","amount":1250,"price":12.5,
			"items":[{"id":"a","qty":2},{"id":"b","qty":1}],
			"customer":{"email":"x@y.z","vip":true,"nickname":null},
			"tags":[],"zero":0,"empty":"","html":"<b>&","0":"zero-key"}`),
		TriggerHeaders: map[string]string{"X-Signature": "sig", "Content-Type": "application/json"},
		Tasks: map[string]StepResult{
			"charge": {
				Status: "success", StatusCode: intp(200), BodyJSON: true,
				Body:    decode(t, `{"approved":true,"amount":1250,"id":"ch_1","items":[{"id":"i1"}],"ratio":200.0,"status":"paid"}`),
				Headers: map[string]string{"X-Request-Id": "req-1"},
			},
			// A webhook that timed out: no body, no status code.
			"payment-result": {Status: "timeout"},
			// A webhook that received a JSON null.
			"cb-null":   {Status: "success", BodyJSON: true, Body: nil},
			"skip-me":   {Status: "skipped"},
			"big":       {Status: "success", StatusCode: intp(200), BodyRaw: `{"amount": 12`, Truncated: true},
			"plain":     {Status: "failed", StatusCode: intp(500), BodyRaw: "Internal Server Error"},
			"floaty":    {Status: "success", StatusCode: intp(201), BodyJSON: true, Body: floaty},
			"str-body":  {Status: "success", StatusCode: intp(200), BodyJSON: true, Body: "just a string"},
			"arr-body":  {Status: "success", StatusCode: intp(200), BodyJSON: true, Body: decode(t, `[10,20]`)},
			"empty-hdr": {Status: "success", StatusCode: intp(204)},
		},
		WaitURLs: map[string]string{"payment-result": "https://ferry.example/hooks/abc"},
	}
}

func mustPath(t testing.TB, s string) Path {
	t.Helper()
	p, err := ParsePath(s)
	if err != nil {
		t.Fatalf("ParsePath(%q): %v", s, err)
	}
	return p
}

func TestResolve(t *testing.T) {
	sc := testScope(t)
	tests := []struct {
		path string
		want any
	}{
		{"trigger.body.order_id", "ord_1"},
		{"trigger.body.amount", json.Number("1250")},
		{"trigger.body.items[1].id", "b"},
		{"trigger.body.items.1.id", "b"},
		{"trigger.body.0", "zero-key"}, // numeric segment on an object is a key
		{"trigger.body.customer.nickname", nil},
		{"trigger.body.customer", map[string]any{"email": "x@y.z", "vip": true, "nickname": nil}},
		{"trigger.body.tags", []any{}},
		{"trigger.headers.x-signature", "sig"},
		{"trigger.headers.CONTENT-TYPE", "application/json"},
		{"trigger.headers", map[string]any{"X-Signature": "sig", "Content-Type": "application/json"}},
		{"tasks.charge.status", "success"},
		{"tasks.charge.status_code", 200},
		{"tasks.charge.body.approved", true},
		{"tasks.charge.body.items[0].id", "i1"},
		{"tasks.charge.headers.x-request-id", "req-1"},
		{"tasks.payment-result.status", "timeout"},
		{"tasks.payment-result.status_code", nil},
		{"tasks.payment-result.body", nil},
		{"tasks.cb-null.body", nil},
		{"tasks.skip-me.body", nil},
		{"tasks.skip-me.status_code", nil},
		{"tasks.skip-me.headers", map[string]any{}},
		{"tasks.big.body", `{"amount": 12`},
		{"tasks.plain.body", "Internal Server Error"},
		{"tasks.floaty.body.code", float64(200)},
		{"tasks.str-body.body", "just a string"},
		{"tasks.arr-body.body[1]", json.Number("20")},
		{"wait.payment-result.url", "https://ferry.example/hooks/abc"},
	}
	for _, tt := range tests {
		got, err := sc.Resolve(mustPath(t, tt.path))
		if err != nil {
			t.Errorf("Resolve(%s): %v", tt.path, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Resolve(%s) = %#v, want %#v", tt.path, got, tt.want)
		}
	}
}

func TestResolveErrors(t *testing.T) {
	sc := testScope(t)
	tests := []struct {
		path   string
		reason string // substring of the reason
	}{
		{"foo.bar", `unknown namespace "foo"`},
		{"trigger", "use trigger.body or trigger.headers"},
		{"trigger.query", `unknown field "query" of trigger`},
		{"trigger.body.missing", `trigger.body has no field "missing"`},
		{"trigger.body.items[5]", "index 5 is out of range: trigger.body.items has 2 elements"},
		{"trigger.body.items.id", "trigger.body.items is an array"},
		{"trigger.body.customer[0]", "trigger.body.customer is an object, not an array"},
		{"trigger.body.customer.nickname.first", "trigger.body.customer.nickname is null"},
		{"trigger.body.order_id.x", "trigger.body.order_id is a string and has no fields"},
		{"trigger.body.amount.x", "is a number"},
		{"trigger.headers.x-missing", `the trigger has no header "x-missing"`},
		{"trigger.headers.x-signature.y", "is a string"},
		{"tasks", "use tasks.<step>"},
		{"tasks.charge", "use tasks.<step>"},
		{"tasks.nope.status", `step "nope" has not finished or does not exist`},
		{"tasks.charge.output", `unknown field "output" of step "charge"`},
		{"tasks.charge.status.x", "is a string"},
		{"tasks.charge.status_code.x", "is a number"},
		{"tasks.payment-result.status_code.x", "is null"},
		{"tasks.charge.headers.x-nope", `step "charge" has no header "x-nope"`},
		{"tasks.charge.headers[0]", "headers are named"},
		{"tasks.plain.body.error", `the response body of step "plain" is not JSON`},
		{"tasks.payment-result.body.status", "tasks.payment-result.body is null"},
		{"tasks.skip-me.body.x", "is null"},
		{"wait.payment-result", "use wait.<step>.url"},
		{"wait.payment-result.token", "use wait.<step>.url"},
		{"wait.charge.url", `step "charge" has no callback URL`},
	}
	for _, tt := range tests {
		_, err := sc.Resolve(mustPath(t, tt.path))
		var re *ResolveError
		if !errors.As(err, &re) {
			t.Errorf("Resolve(%s) error = %v, want *ResolveError", tt.path, err)
			continue
		}
		if re.Path != tt.path {
			t.Errorf("Resolve(%s) error Path = %q", tt.path, re.Path)
		}
		if !strings.Contains(re.Reason, tt.reason) {
			t.Errorf("Resolve(%s) reason = %q, want it to contain %q", tt.path, re.Reason, tt.reason)
		}
		if want := "Failed to resolve {{" + tt.path + "}}: " + re.Reason; err.Error() != want {
			t.Errorf("Error() = %q, want %q", err.Error(), want)
		}
		if sc.Lookup(mustPath(t, tt.path)) != nil {
			t.Errorf("Lookup(%s) is not nil", tt.path)
		}
	}
}

func TestResolveTruncated(t *testing.T) {
	sc := testScope(t)
	sc.Tasks["charge"] = StepResult{Status: "success", StatusCode: intp(200), BodyRaw: "{...", Truncated: true}
	tests := []struct{ path, reason string }{
		{"tasks.charge.body.amount", "Cannot read 'body.amount' because the response from 'charge' exceeded the 256KB limit and was truncated"},
		{"tasks.charge.body.items[0].id", "Cannot read 'body.items[0].id' because the response from 'charge' exceeded the 256KB limit and was truncated"},
		{"tasks.charge.body[3]", "Cannot read 'body[3]' because the response from 'charge' exceeded the 256KB limit and was truncated"},
		{"tasks.big.body.amount", "Cannot read 'body.amount' because the response from 'big' exceeded the 256KB limit and was truncated"},
	}
	for _, tt := range tests {
		_, err := sc.Resolve(mustPath(t, tt.path))
		var re *ResolveError
		if !errors.As(err, &re) {
			t.Fatalf("Resolve(%s) error = %v", tt.path, err)
		}
		if re.Reason != tt.reason {
			t.Errorf("reason = %q\nwant     %q", re.Reason, tt.reason)
		}
		if want := "Failed to resolve {{" + tt.path + "}}: " + tt.reason; re.Error() != want {
			t.Errorf("Error() = %q\nwant      %q", re.Error(), want)
		}
	}
	// The whole body still renders: the raw, cut text.
	if v, err := sc.Resolve(mustPath(t, "tasks.charge.body")); err != nil || v != "{..." {
		t.Errorf("Resolve(tasks.charge.body) = %v, %v", v, err)
	}
}

func TestLookupLenient(t *testing.T) {
	sc := testScope(t)
	for _, p := range []string{
		"tasks.payment-result.body.status", // timed-out webhook: body is null
		"tasks.nope.status",
		"tasks.big.body.amount",
		"tasks.plain.body.x",
		"trigger.body.items[9].id",
		"foo.bar",
	} {
		if v := sc.Lookup(mustPath(t, p)); v != nil {
			t.Errorf("Lookup(%s) = %#v, want nil", p, v)
		}
	}
	if v := sc.Lookup(mustPath(t, "tasks.charge.body.status")); v != "paid" {
		t.Errorf("Lookup(tasks.charge.body.status) = %#v", v)
	}
	var nilScope *Scope
	if v := nilScope.Lookup(mustPath(t, "trigger.body")); v != nil {
		t.Errorf("nil scope Lookup = %#v", v)
	}
	if _, err := nilScope.Resolve(mustPath(t, "trigger.body")); err == nil {
		t.Error("nil scope Resolve: want error")
	}
}

func TestResolveReturnsCopies(t *testing.T) {
	sc := testScope(t)
	v, err := sc.Resolve(mustPath(t, "trigger.body.customer"))
	if err != nil {
		t.Fatal(err)
	}
	v.(map[string]any)["email"] = "changed"
	if got := sc.Lookup(mustPath(t, "trigger.body.customer.email")); got != "x@y.z" {
		t.Errorf("scope was mutated through a resolved value: %v", got)
	}
}

func TestHeaderLookupDeterministic(t *testing.T) {
	h := map[string]string{"x-a": "lower", "X-A": "upper"}
	for range 20 {
		if v, _ := lookupFold(h, "X-a"); v != "upper" {
			t.Fatalf("lookupFold = %q, want the smallest key's value", v)
		}
	}
	if v, _ := lookupFold(h, "x-a"); v != "lower" {
		t.Errorf("exact match should win, got %q", v)
	}
}

// TestTaskResultAnswersForStepsNotInTasks: a step Tasks does not hold is
// asked of TaskResult, once per read, and resolves as if Tasks held it;
// a step it does not know has not finished. Tasks is asked first.
func TestTaskResultAnswersForStepsNotInTasks(t *testing.T) {
	asked := map[string]int{}
	sc := &Scope{
		Tasks: map[string]StepResult{"held": {Status: "success", StatusCode: intp(201)}},
		TaskResult: func(step string) (StepResult, bool) {
			asked[step]++
			if step != "lazy" {
				return StepResult{}, false
			}
			return StepResult{Status: "success", StatusCode: intp(200), Body: decode(t, `{"id": 7}`), BodyJSON: true}, true
		},
	}
	if v, err := sc.Resolve(mustPath(t, "tasks.lazy.body.id")); err != nil || v != json.Number("7") {
		t.Errorf("tasks.lazy.body.id = %#v, %v; want 7", v, err)
	}
	if v, err := sc.Resolve(mustPath(t, "tasks.held.status_code")); err != nil || v != 201 {
		t.Errorf("tasks.held.status_code = %#v, %v; want 201", v, err)
	}
	var re *ResolveError
	if _, err := sc.Resolve(mustPath(t, "tasks.gone.status")); !errors.As(err, &re) || !strings.Contains(re.Reason, "has not finished") {
		t.Errorf("tasks.gone.status: %v, want a has-not-finished error", err)
	}
	if want := map[string]int{"lazy": 1, "gone": 1}; !reflect.DeepEqual(asked, want) {
		t.Errorf("TaskResult asked %v, want %v", asked, want)
	}
}
