package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The seed's examples, verbatim; only their host is pointed at the upstream.
const orderProcessing = `{
  "name": "order-processing",
  "trigger": "api",
  "tasks": {
    "charge": {
      "url": "https://myapp.com/api/charge",
      "method": "POST",
      "body": { "order_id": "{{trigger.body.order_id}}" }
    },
    "send-receipt": {
      "needs": ["charge"],
      "if": "tasks.charge.status_code == 200",
      "url": "https://myapp.com/api/send-receipt",
      "method": "POST",
      "body": {
        "order_id": "{{trigger.body.order_id}}",
        "amount": "{{tasks.charge.body.amount}}"
      }
    },
    "notify-warehouse": {
      "needs": ["charge"],
      "if": "tasks.charge.status_code == 200",
      "url": "https://myapp.com/api/ship",
      "method": "POST"
    },
    "handle-failure": {
      "needs": ["charge"],
      "if": "tasks.charge.status_code != 200",
      "url": "https://myapp.com/api/payment-failed",
      "method": "POST"
    }
  }
}`

const trialExpiry = `{
  "name": "trial-expiry",
  "trigger": "api",
  "tasks": {
    "start-trial": {
      "url": "https://myapp.com/api/activate-trial",
      "method": "POST",
      "body": { "user_id": "{{trigger.body.user_id}}" }
    },
    "wait-13-days": {
      "needs": ["start-trial"],
      "sleep": "13d"
    },
    "send-reminder": {
      "needs": ["wait-13-days"],
      "url": "https://myapp.com/api/send-email",
      "method": "POST",
      "body": { "template": "trial-ending-soon", "user_id": "{{trigger.body.user_id}}" }
    },
    "wait-1-day": {
      "needs": ["send-reminder"],
      "sleep": "1d"
    },
    "expire-trial": {
      "needs": ["wait-1-day"],
      "url": "https://myapp.com/api/expire-trial",
      "method": "POST",
      "body": { "user_id": "{{trigger.body.user_id}}" }
    }
  }
}`

const checkoutFlow = `{
  "name": "checkout-flow",
  "trigger": "api",
  "tasks": {
    "create-checkout": {
      "url": "https://myapp.com/api/create-checkout",
      "method": "POST",
      "body": {
        "amount": "{{trigger.body.amount}}",
        "callback_url": "{{wait.payment-result.url}}"
      }
    },
    "payment-result": {
      "needs": ["create-checkout"],
      "wait_for_webhook": { "timeout": "1h" }
    },
    "fulfill-order": {
      "needs": ["payment-result"],
      "if": "tasks.payment-result.body.status == 'paid'",
      "url": "https://myapp.com/api/fulfill",
      "method": "POST",
      "body": {
        "order_id": "{{trigger.body.order_id}}",
        "payment_id": "{{tasks.payment-result.body.payment_id}}"
      }
    },
    "handle-timeout": {
      "needs": ["payment-result"],
      "if": "tasks.payment-result.status == 'timeout'",
      "url": "https://myapp.com/api/checkout-expired",
      "method": "POST"
    }
  }
}`

// The seed's create-workflow API example.
const apiCreateExample = `{
  "name": "order-processing",
  "trigger": "api",
  "tasks": {
    "charge": {
      "url": "https://myapp.com/api/charge",
      "method": "POST",
      "headers": { "Authorization": "Bearer {{trigger.body.token}}" },
      "body": { "order_id": "{{trigger.body.order_id}}" },
      "retries": 3,
      "timeout": 30000
    },
    "send-receipt": {
      "needs": ["charge"],
      "if": "tasks.charge.status_code == 200",
      "url": "https://myapp.com/api/send-receipt",
      "method": "POST",
      "body": { "email": "{{trigger.body.email}}" }
    }
  }
}`

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return m
}

func TestSeedOrderProcessingSuccess(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		e.up.handle("/api/charge", jsonReply(200, `{"amount": 4999, "charge_id": "ch_1"}`))
		e.createWorkflow(orderProcessing)
		id := e.trigger("order-processing", `{"order_id": 123}`)
		run := e.waitStatus(id, "completed")
		wantStatuses(t, run, map[string]string{"charge": "success", "send-receipt": "success", "notify-warehouse": "success", "handle-failure": "skipped"})
		if c := task(run, "charge")["status_code"]; c != float64(200) {
			t.Errorf("charge status_code = %v", c)
		}
		charge := e.up.requests("/api/charge")
		if len(charge) != 1 {
			t.Fatalf("charge called %d times", len(charge))
		}
		if got := decode(t, charge[0].Body); got["order_id"] != float64(123) {
			t.Errorf("charge body order_id = %v, want the number 123", got["order_id"])
		}
		if k := charge[0].Headers.Get("Idempotency-Key"); k != id+":charge" {
			t.Errorf("Idempotency-Key = %q, want %q", k, id+":charge")
		}
		if charge[0].Headers.Get("X-Ferry-Run-Id") != id || charge[0].Headers.Get("X-Ferry-Step") != "charge" || charge[0].Headers.Get("X-Ferry-Attempt") != "1" {
			t.Errorf("identity headers: %v", charge[0].Headers)
		}
		receipt := e.up.requests("/api/send-receipt")
		if len(receipt) != 1 {
			t.Fatalf("send-receipt called %d times", len(receipt))
		}
		if got := decode(t, receipt[0].Body); got["amount"] != float64(4999) || got["order_id"] != float64(123) {
			t.Errorf("send-receipt body = %v", got)
		}
		if n := len(e.up.requests("/api/payment-failed")); n != 0 {
			t.Errorf("payment-failed called %d times", n)
		}
	})
}

func TestSeedOrderProcessingFailurePath(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		e.up.handle("/api/charge", jsonReply(402, `{"error": "card declined"}`))
		e.createWorkflow(orderProcessing)
		id := e.trigger("order-processing", `{"order_id": 7}`)
		run := e.waitStatus(id, "completed")
		wantStatuses(t, run, map[string]string{"charge": "failed", "send-receipt": "skipped", "notify-warehouse": "skipped", "handle-failure": "success"})
		if c := task(run, "charge")["status_code"]; c != float64(402) {
			t.Errorf("a failed step keeps its status code: got %v", c)
		}
		if n := len(e.up.requests("/api/charge")); n != 1 {
			t.Errorf("402 is final: charge called %d times", n)
		}
	})
}

func TestSeedTrialExpirySleeps(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		e.createWorkflow(trialExpiry)
		id := e.trigger("trial-expiry", `{"user_id": "u_42"}`)
		run := e.waitStep(id, "wait-13-days", "sleeping")
		if n := len(e.up.requests("/api/send-email")); n != 0 {
			t.Fatalf("reminder sent before the sleep ended")
		}
		wake, _ := time.Parse(time.RFC3339Nano, task(run, "wait-13-days")["wake_at"].(string))
		start, _ := time.Parse(time.RFC3339Nano, task(run, "wait-13-days")["started_at"].(string))
		if d := wake.Sub(start); d != 13*24*time.Hour {
			t.Errorf("sleep 13d wakes after %v", d)
		}
		e.clock.Advance(13*24*time.Hour - time.Second)
		e.eng.Nudge()
		if got := task(e.run(id), "wait-13-days")["status"]; got != "sleeping" {
			t.Fatalf("woke early: %v", got)
		}
		e.clock.Advance(time.Second)
		e.waitStep(id, "wait-1-day", "sleeping")
		e.clock.Advance(24 * time.Hour)
		run = e.waitStatus(id, "completed")
		wantStatuses(t, run, map[string]string{"start-trial": "success", "wait-13-days": "success", "send-reminder": "success", "wait-1-day": "success", "expire-trial": "success"})
		if got := decode(t, e.up.requests("/api/expire-trial")[0].Body); got["user_id"] != "u_42" {
			t.Errorf("expire-trial body = %v", got)
		}
	})
}

func TestSeedCheckoutPaid(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		e.createWorkflow(checkoutFlow)
		id := e.trigger("checkout-flow", `{"amount": 2500, "order_id": "o_9"}`)
		e.waitStep(id, "payment-result", "waiting")
		reqs := e.up.requests("/api/create-checkout")
		if len(reqs) != 1 {
			t.Fatalf("create-checkout called %d times", len(reqs))
		}
		body := decode(t, reqs[0].Body)
		cb, _ := body["callback_url"].(string)
		if !strings.HasPrefix(cb, e.url+"/wh/") || body["amount"] != float64(2500) {
			t.Fatalf("create-checkout body = %v", body)
		}
		resp, err := http.Post(cb, "application/json", strings.NewReader(`{"status": "paid", "payment_id": "pay_77"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 202 {
			t.Fatalf("callback: %d, want 202", resp.StatusCode)
		}
		run := e.waitStatus(id, "completed")
		wantStatuses(t, run, map[string]string{"create-checkout": "success", "payment-result": "success", "fulfill-order": "success", "handle-timeout": "skipped"})
		if got := decode(t, e.up.requests("/api/fulfill")[0].Body); got["payment_id"] != "pay_77" || got["order_id"] != "o_9" {
			t.Errorf("fulfill body = %v", got)
		}
		// A second callback for the same step changes nothing.
		resp, err = http.Post(cb, "application/json", strings.NewReader(`{"status": "refunded"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 409 {
			t.Errorf("second callback: %d, want 409", resp.StatusCode)
		}
		if st := task(e.run(id), "payment-result")["body"].(map[string]any)["status"]; st != "paid" {
			t.Errorf("stored payload changed to %v", st)
		}
		resp, err = http.Post(e.url+"/wh/nope", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("unknown token: %d, want 404", resp.StatusCode)
		}
	})
}

func TestSeedCheckoutTimeout(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		e.createWorkflow(checkoutFlow)
		id := e.trigger("checkout-flow", `{"amount": 100, "order_id": "o_1"}`)
		e.waitStep(id, "payment-result", "waiting")
		e.clock.Advance(time.Hour)
		run := e.waitStatus(id, "completed")
		wantStatuses(t, run, map[string]string{"payment-result": "timeout", "fulfill-order": "skipped", "handle-timeout": "success"})
		if n := len(e.up.requests("/api/fulfill")); n != 0 {
			t.Errorf("fulfill called %d times after a timeout", n)
		}
	})
}

func TestSeedAPICreateExample(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		out := e.mustCall(201, "POST", "/api/v1/workflows", e.seed(apiCreateExample))
		data := out["data"].(map[string]any)
		if data["name"] != "order-processing" || data["task_count"] != float64(2) || data["trigger"] != "api" || data["enabled"] != true {
			t.Errorf("create response = %v", data)
		}
		id := e.trigger("order-processing", `{"order_id": 123, "email": "alice@example.com", "token": "sk_live_xxx"}`)
		e.waitStatus(id, "completed")
		charge := e.up.requests("/api/charge")[0]
		if got := charge.Headers.Get("Authorization"); got != "Bearer sk_live_xxx" {
			t.Errorf("templated header = %q", got)
		}
		if got := decode(t, e.up.requests("/api/send-receipt")[0].Body); got["email"] != "alice@example.com" {
			t.Errorf("send-receipt body = %v", got)
		}
	})
}
