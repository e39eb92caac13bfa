package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestSkippedWaitStepReadsAsNullAfterAnEarlyCallback: a callback that
// came before its wait step started is kept on the step; when the step is
// then skipped (its need failed), the step reads as skipped with body
// null, as every skipped step does, and its dependents route on that,
// not on the callback's body. (Found by an audit: the early body leaked
// into conditions and templates.)
func TestSkippedWaitStepReadsAsNullAfterAnEarlyCallback(t *testing.T) {
	backends(t, func(t *testing.T, database string) {
		e := newEnv(t, database)
		e.up.handle("/fail", jsonReply(400, `{"e": 1}`))
		e.createWorkflow(fmt.Sprintf(`{"name": "chk", "tasks": {
			"nap": {"sleep": "1m"},
			"create": {"needs": ["nap"], "url": "%[1]s/fail"},
			"pay": {"needs": ["create"], "wait_for_webhook": {"timeout": "1h"}},
			"later": {"sleep": "2m"},
			"fulfill": {"needs": ["pay", "later"], "if": "tasks.pay.body.status == 'paid'", "url": "%[1]s/fulfill"},
			"on-skip": {"needs": ["pay", "later"], "if": "tasks.pay.status == 'skipped'", "url": "%[1]s/on-skip",
				"body": {"b": "{{tasks.pay.body}}", "c": "{{tasks.pay.status_code}}"}}}}`, e.up.URL))
		id := e.trigger("chk", `{}`)
		run := e.waitStep(id, "nap", "sleeping")
		resp, err := http.Post(task(run, "pay")["callback_url"].(string), "application/json", strings.NewReader(`{"status": "paid"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("early callback: %d", resp.StatusCode)
		}
		e.clock.Advance(time.Minute)
		e.waitStep(id, "pay", "skipped")
		e.clock.Advance(time.Minute)
		run = e.waitFor(id, "the run ends", func(r map[string]any) bool { return r["status"] != "running" })
		if got := task(run, "fulfill")["status"]; got != "skipped" {
			t.Errorf("fulfill %v, want skipped: the skipped wait step's body is null", got)
		}
		reqs := e.up.requests("/on-skip")
		if len(reqs) != 1 || string(reqs[0].Body) != `{"b":null,"c":null}` {
			t.Errorf("on-skip requests %d, first body %q; want one with {\"b\":null,\"c\":null}", len(reqs), firstBody(reqs))
		}
	})
}

func firstBody(rs []recorded) string {
	if len(rs) == 0 {
		return ""
	}
	return string(rs[0].Body)
}

// cutBody answers code with a body that breaks off: the connection is
// closed after part of what Content-Length promised.
func cutBody(code int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(code)
		fmt.Fprint(w, `{"amount": 1`)
		w.(http.Flusher).Flush()
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close()
		}
	}
}

// TestCutBodyOf2xxIsANetworkError: a 2xx whose body breaks off is no
// success: its attempt is retried as a network error's is, and its final
// outcome is failed with status_code null (workflow-format.md), so a
// condition on status_code == 200 does not take it for one.
func TestCutBodyOf2xxIsANetworkError(t *testing.T) {
	backends(t, func(t *testing.T, database string) {
		e := newEnv(t, database)
		e.up.handle("/cut", cutBody(200))
		e.createWorkflow(fmt.Sprintf(`{"name": "cut", "tasks": {
			"charge": {"url": "%[1]s/cut", "retries": 1},
			"receipt": {"needs": ["charge"], "if": "tasks.charge.status_code == 200", "url": "%[1]s/receipt"},
			"failure": {"needs": ["charge"], "if": "tasks.charge.status_code != 200", "url": "%[1]s/failure"}}}`, e.up.URL))
		id := e.trigger("cut", `{}`)
		run := e.waitFor(id, "charge retrying", func(r map[string]any) bool { return task(r, "charge")["error"] != nil })
		if c := task(run, "charge"); c["status"] != "running" || c["status_code"] != nil {
			t.Errorf("after the first cut 200: charge %v with status_code %v, want running (retried) with none", c["status"], c["status_code"])
		}
		e.clock.Advance(time.Second) // the first retry's backoff is at most 1 s
		run = e.waitFor(id, "the run ends", func(r map[string]any) bool { return r["status"] != "running" })
		c := task(run, "charge")
		if c["status"] != "failed" || c["status_code"] != nil || !strings.Contains(fmt.Sprint(c["error"]), "reading response body") {
			t.Errorf("charge %v, status_code %v, error %v; want failed, null, the read's error", c["status"], c["status_code"], c["error"])
		}
		if n := len(e.up.requests("/cut")); n != 2 {
			t.Errorf("%d attempts, want 2", n)
		}
		if task(run, "receipt")["status"] != "skipped" || task(run, "failure")["status"] != "success" {
			t.Errorf("receipt %v, failure %v; want skipped, success", task(run, "receipt")["status"], task(run, "failure")["status"])
		}
	})
}

// TestCutBodyOf4xxIsFinalAtOnce: a 400 whose body breaks off is still a
// 400, final at once with its status code, not retried as a network
// error; the part of its body that came is kept, marked truncated.
func TestCutBodyOf4xxIsFinalAtOnce(t *testing.T) {
	backends(t, func(t *testing.T, database string) {
		e := newEnv(t, database)
		e.up.handle("/cut400", cutBody(400))
		e.createWorkflow(fmt.Sprintf(`{"name": "cut400", "tasks": {"a": {"url": "%s/cut400", "retries": 3}}}`, e.up.URL))
		id := e.trigger("cut400", `{}`)
		run := e.waitFor(id, "a ends or retries", func(r map[string]any) bool {
			return r["status"] != "running" || task(r, "a")["error"] != nil
		})
		a := task(run, "a")
		if a["status"] != "failed" || a["status_code"] != float64(400) || a["is_truncated"] != true {
			t.Errorf("a %v, status_code %v, is_truncated %v; want failed at once, 400, true", a["status"], a["status_code"], a["is_truncated"])
		}
		if n := len(e.up.requests("/cut400")); n != 1 {
			t.Errorf("%d attempts, want 1", n)
		}
	})
}
