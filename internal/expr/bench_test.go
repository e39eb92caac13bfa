package expr_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/expr"
)

func benchScope(b *testing.B) *expr.Scope {
	var body any
	dec := json.NewDecoder(strings.NewReader(`{"amount": 4999, "customer": {"id": "c_1", "email": "a@example.com"}, "items": [{"sku": "x"}, {"sku": "y"}]}`))
	dec.UseNumber()
	if err := dec.Decode(&body); err != nil {
		b.Fatal(err)
	}
	code := 200
	return &expr.Scope{
		TriggerBody: map[string]any{"order_id": json.Number("123"), "email": "alice@example.com"},
		Tasks: map[string]expr.StepResult{
			"charge":         {Status: "success", StatusCode: &code, Body: body, BodyJSON: true, Headers: map[string]string{"Content-Type": "application/json"}},
			"payment-result": {Status: "timeout"},
		},
		WaitURLs: map[string]string{"payment-result": "https://ferry.example.com/wh/tok"},
	}
}

// BenchmarkRenderJSON resolves the templates of a typical request body.
func BenchmarkRenderJSON(b *testing.B) {
	sc := benchScope(b)
	body := map[string]any{
		"order_id": "{{trigger.body.order_id}}",
		"amount":   "{{tasks.charge.body.amount}}",
		"note":     "order {{trigger.body.order_id}} for {{tasks.charge.body.customer.email}}",
		"sku":      "{{tasks.charge.body.items[1].sku}}",
		"callback": "{{wait.payment-result.url}}",
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := expr.RenderJSON(body, sc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConditionEval evaluates a parsed compound condition.
func BenchmarkConditionEval(b *testing.B) {
	sc := benchScope(b)
	c, err := expr.ParseCondition(`tasks.charge.status_code == 200 && tasks.charge.body.amount >= 1000 && !(tasks.payment-result.status == 'skipped')`)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if !c.Eval(sc) {
			b.Fatal("false")
		}
	}
}

// BenchmarkParseCondition parses the same condition (done once per
// definition version; shown for scale).
func BenchmarkParseCondition(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := expr.ParseCondition(`tasks.charge.status_code == 200 && tasks.payment-result.body.status != 'paid'`); err != nil {
			b.Fatal(err)
		}
	}
}
