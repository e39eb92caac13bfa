package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

func TestRetriesWithBackoffThenSuccess(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		var calls atomic.Int32
		e.up.handle("/flaky", func(w http.ResponseWriter, r *http.Request) {
			switch calls.Add(1) {
			case 1:
				w.WriteHeader(503)
			case 2:
				w.Header().Set("Retry-After", "120")
				w.WriteHeader(429)
			default:
				fmt.Fprint(w, `{"ok": true}`)
			}
		})
		e.createWorkflow(fmt.Sprintf(`{"name": "retry", "tasks": {"a": {"url": "%s/flaky", "retries": 3}}}`, e.up.URL))
		id := e.trigger("retry", `{}`)
		e.waitFor(id, "first retry scheduled", func(r map[string]any) bool {
			return task(r, "a")["attempt"] == float64(1) && task(r, "a")["error"] == "HTTP 503"
		})
		if calls.Load() != 1 {
			t.Fatalf("retried before the backoff elapsed: %d calls", calls.Load())
		}
		e.clock.Advance(time.Second) // backoff for attempt 1 is at most 1s
		e.waitFor(id, "second attempt", func(r map[string]any) bool { return task(r, "a")["attempt"] == float64(2) })
		e.waitFor(id, "second retry scheduled", func(r map[string]any) bool { return task(r, "a")["error"] == "HTTP 429" })
		evs := e.mustCall(200, "GET", "/api/v1/runs/"+id+"/events", nil)["data"].([]any)
		var delays []float64
		for _, ev := range evs {
			ev := ev.(map[string]any)
			if ev["type"] == "step_retrying" {
				delays = append(delays, ev["data"].(map[string]any)["retry_in_ms"].(float64))
			}
		}
		if len(delays) != 2 || delays[0] > 1000 || delays[1] < 120000 {
			t.Fatalf("retry delays %v: want the first ≤1s and the second ≥120s (Retry-After)", delays)
		}
		e.clock.Advance(121 * time.Second)
		run := e.waitStatus(id, "completed")
		a := task(run, "a")
		if a["status"] != "success" || a["attempt"] != float64(3) || a["status_code"] != float64(200) {
			t.Errorf("step a = %v", a)
		}
		reqs := e.up.requests("/flaky")
		for i, r := range reqs {
			if r.Headers.Get("Idempotency-Key") != id+":a" || r.Headers.Get("X-Ferry-Attempt") != fmt.Sprint(i+1) {
				t.Errorf("attempt %d headers: key %q attempt %q", i+1, r.Headers.Get("Idempotency-Key"), r.Headers.Get("X-Ferry-Attempt"))
			}
		}
	})
}

func TestRetriesExhaustedFailsAndBlocksDependents(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		e.up.handle("/down", jsonReply(500, `{"e": 1}`))
		e.createWorkflow(fmt.Sprintf(`{"name": "down", "tasks": {
			"a": {"url": "%[1]s/down", "retries": 1},
			"b": {"needs": ["a"], "url": "%[1]s/b"},
			"c": {"needs": ["b"], "url": "%[1]s/c"}}}`, e.up.URL))
		id := e.trigger("down", `{}`)
		e.waitFor(id, "retry scheduled", func(r map[string]any) bool { return task(r, "a")["error"] == "HTTP 500" })
		e.clock.Advance(time.Second)
		run := e.waitStatus(id, "failed")
		wantStatuses(t, run, map[string]string{"a": "failed", "b": "skipped", "c": "skipped"})
		if task(run, "a")["status_code"] != float64(500) || task(run, "a")["attempt"] != float64(2) {
			t.Errorf("a = %v", task(run, "a"))
		}
		if !strings.Contains(fmt.Sprint(run["error"]), "b") {
			t.Errorf("run error should name the blocked step: %v", run["error"])
		}
	})
}

func TestCancelAbortsInFlightRequest(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		arrived := make(chan struct{})
		aborted := make(chan struct{})
		e.up.handle("/slow", func(w http.ResponseWriter, r *http.Request) {
			close(arrived)
			<-r.Context().Done()
			close(aborted)
		})
		e.createWorkflow(fmt.Sprintf(`{"name": "slow", "tasks": {"a": {"url": "%[1]s/slow", "timeout": "10m"}, "b": {"needs": ["a"], "url": "%[1]s/b"}}}`, e.up.URL))
		id := e.trigger("slow", `{}`)
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("request never arrived")
		}
		out := e.mustCall(200, "POST", "/api/v1/workflows/slow/runs/"+id+"/cancel", nil)
		if out["data"].(map[string]any)["status"] != "cancelled" {
			t.Errorf("cancel response: %v", out)
		}
		select {
		case <-aborted:
		case <-time.After(10 * time.Second):
			t.Fatal("in-flight request was not aborted")
		}
		run := e.run(id)
		wantStatuses(t, run, map[string]string{"a": "cancelled", "b": "cancelled"})
		e.mustCall(409, "POST", "/api/v1/runs/"+id+"/cancel", nil)
		if n := len(e.up.requests("/b")); n != 0 {
			t.Errorf("b ran after cancel")
		}
	})
}

func TestMaxDurationTimesOutRun(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		e.createWorkflow(`{"name": "short", "max_duration": "1h", "tasks": {"w": {"wait_for_webhook": {}}}}`)
		id := e.trigger("short", `{}`)
		e.waitStep(id, "w", "waiting")
		e.clock.Advance(time.Hour)
		run := e.waitStatus(id, "timeout")
		wantStatuses(t, run, map[string]string{"w": "cancelled"})
	})
}

func TestUpdateDoesNotChangeStartedRuns(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		def := `{"name": "pin", "tasks": {"nap": {"sleep": "1m"}, "call": {"needs": ["nap"], "url": "%s/%s"}}}`
		e.createWorkflow(fmt.Sprintf(def, e.up.URL, "v1"))
		id := e.trigger("pin", `{}`)
		e.waitStep(id, "nap", "sleeping")
		out := e.mustCall(200, "PUT", "/api/v1/workflows/pin", fmt.Sprintf(def, e.up.URL, "v2"))
		if out["data"].(map[string]any)["version"] != float64(2) {
			t.Fatalf("update: %v", out)
		}
		id2 := e.trigger("pin", `{}`)
		e.waitStep(id2, "nap", "sleeping")
		e.clock.Advance(time.Minute)
		r1 := e.waitStatus(id, "completed")
		e.waitStatus(id2, "completed")
		if r1["version"] != float64(1) {
			t.Errorf("old run version = %v", r1["version"])
		}
		if len(e.up.requests("/v1")) != 1 || len(e.up.requests("/v2")) != 1 {
			t.Errorf("v1 calls %d, v2 calls %d; want 1 and 1", len(e.up.requests("/v1")), len(e.up.requests("/v2")))
		}
	})
}

func TestDeleteIsSoftAndRunsFinish(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		e.createWorkflow(fmt.Sprintf(`{"name": "gone", "tasks": {"nap": {"sleep": 30}, "call": {"needs": ["nap"], "url": "%s/x"}}}`, e.up.URL))
		id := e.trigger("gone", `{}`)
		e.waitStep(id, "nap", "sleeping")
		e.mustCall(204, "DELETE", "/api/v1/workflows/gone", nil)
		e.mustCall(404, "GET", "/api/v1/workflows/gone", nil)
		e.mustCall(404, "POST", "/api/v1/workflows/gone/trigger", `{}`)
		e.clock.Advance(30 * time.Second)
		e.waitStatus(id, "completed")
		// The name is free again.
		e.createWorkflow(`{"name": "gone", "tasks": {"nap": {"sleep": "1s"}}}`)
	})
}

func TestEgressDeniedFailsStepClearly(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db, withEgress(""))
		e.createWorkflow(fmt.Sprintf(`{"name": "ssrf", "tasks": {"a": {"url": "%s/x"}}}`, e.up.URL))
		id := e.trigger("ssrf", `{}`)
		run := e.waitStatus(id, "completed")
		a := task(run, "a")
		if a["status"] != "failed" || !strings.Contains(fmt.Sprint(a["error"]), "denied") {
			t.Errorf("a = %v", a)
		}
		if a["attempt"] != float64(1) {
			t.Errorf("denied egress must not be retried: attempt %v", a["attempt"])
		}
		if n := len(e.up.requests("/x")); n != 0 {
			t.Errorf("request reached the upstream")
		}
	})
}

func TestTriggerIdempotencyKey(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		e.createWorkflow(`{"name": "idem", "tasks": {"nap": {"sleep": "1h"}}}`)
		id := e.trigger("idem", `{"n": 1}`, "Idempotency-Key", "k-1")
		out := e.mustCall(200, "POST", "/api/v1/workflows/idem/trigger", `{"n": 2}`, "Idempotency-Key", "k-1")
		if got := out["data"].(map[string]any)["run_id"]; got != id {
			t.Errorf("repeated key gave run %v, want %v", got, id)
		}
		other := e.trigger("idem", `{"n": 3}`, "Idempotency-Key", "k-2")
		if other == id {
			t.Error("a new key must start a new run")
		}
		list := e.mustCall(200, "GET", "/api/v1/workflows/idem/runs", nil)
		if n := len(list["data"].([]any)); n != 2 {
			t.Errorf("%d runs, want 2", n)
		}
	})
}

func TestTemplateErrors(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		big := `{"amount": 1, "pad": "` + strings.Repeat("x", 256<<10) + `"}`
		e.up.handle("/big", jsonReply(200, big))
		e.up.handle("/small", jsonReply(200, `{"id": 1}`))
		e.up.handle("/text", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "plain words") })
		e.createWorkflow(fmt.Sprintf(`{"name": "tpl", "tasks": {
			"charge": {"url": "%[1]s/big"},
			"small": {"url": "%[1]s/small"},
			"text": {"url": "%[1]s/text"},
			"use-big": {"needs": ["charge"], "url": "%[1]s/x", "body": {"a": "{{tasks.charge.body.amount}}"}},
			"use-missing": {"needs": ["small"], "url": "%[1]s/x", "body": {"a": "{{tasks.small.body.order_id}}"}},
			"use-text": {"needs": ["text"], "url": "%[1]s/echo", "body": {"t": "{{tasks.text.body}}"}},
			"after": {"needs": ["use-missing"], "url": "%[1]s/x"}}}`, e.up.URL))
		id := e.trigger("tpl", `{}`)
		run := e.waitStatus(id, "failed")
		wantStatuses(t, run, map[string]string{"charge": "success", "use-big": "template_error", "use-missing": "template_error", "use-text": "success", "after": "skipped"})
		if task(run, "charge")["is_truncated"] != true {
			t.Errorf("charge body not marked truncated")
		}
		if got := task(run, "use-big")["error"]; got != "Cannot read 'body.amount' because the response from 'charge' exceeded the 256KB limit and was truncated" {
			t.Errorf("truncation message = %q", got)
		}
		if got := fmt.Sprint(task(run, "use-missing")["error"]); !strings.Contains(got, "tasks.small.body.order_id") {
			t.Errorf("missing path message = %q", got)
		}
		if got := decode(t, e.up.requests("/echo")[0].Body); got["t"] != "plain words" {
			t.Errorf("raw body template = %v", got)
		}
		if n := len(e.up.requests("/x")); n != 0 {
			t.Errorf("%d requests sent with unresolved templates", n)
		}
	})
}

func TestEarlyWebhookSatisfiesWaitWhenItStarts(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		e.createWorkflow(`{"name": "early", "tasks": {"nap": {"sleep": "1m"}, "w": {"needs": ["nap"], "wait_for_webhook": {"timeout": "1h"}}}}`)
		id := e.trigger("early", `{}`)
		run := e.waitStep(id, "nap", "sleeping")
		cb := task(run, "w")["callback_url"].(string)
		resp, err := http.Post(cb, "application/json", strings.NewReader(`{"v": 1}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 202 {
			t.Fatalf("early callback: %d", resp.StatusCode)
		}
		e.clock.Advance(time.Minute)
		run = e.waitStatus(id, "completed")
		wantStatuses(t, run, map[string]string{"w": "success"})
	})
}

func TestValidationErrorsOverAPI(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		code, out := e.call("POST", "/api/v1/workflows", `{"name": "bad", "tasks": {
			"charge": {"url": "https://x.example/c"},
			"send-receipt": {"needs": ["chrage"], "url": "https://x.example/r"}}}`)
		if code != 422 {
			t.Fatalf("status %d", code)
		}
		errObj := out["error"].(map[string]any)
		d := errObj["details"].([]any)[0].(map[string]any)
		if errObj["code"] != "invalid_workflow" || d["path"] != "tasks.send-receipt.needs[0]" || d["code"] != "unknown_need" || !strings.Contains(d["message"].(string), `did you mean "charge"?`) {
			t.Errorf("error = %v", out)
		}
		e.createWorkflow(`{"name": "dup", "tasks": {"a": {"sleep": 1}}}`)
		if code, out := e.call("POST", "/api/v1/workflows", `{"name": "dup", "tasks": {"a": {"sleep": 1}}}`); code != 409 {
			t.Errorf("duplicate: %d %v", code, out)
		}
		if code, _ := e.call("POST", "/api/v1/workflows/dup/trigger", `{not json`); code != 400 {
			t.Errorf("bad trigger JSON: %d", code)
		}
		req, _ := http.NewRequest("GET", e.url+"/api/v1/workflows", nil)
		req.Header.Set("Authorization", "Bearer wrong")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Errorf("wrong key: %d", resp.StatusCode)
		}
	})
}

// TestEmptyResponseBodyThenSleep: a step answered 204 (an empty body)
// followed by a sleep: the run reads back the step exactly as stored (on
// SQLite the writer's run cache is checked against the tables at cleanup).
func TestEmptyResponseBodyThenSleep(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		e.up.handle("/empty", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
		e.createWorkflow(fmt.Sprintf(`{"name": "empty", "tasks": {"a": {"url": "%s/empty"}, "b": {"needs": ["a"], "sleep": "1h"}}}`, e.up.URL))
		id := e.trigger("empty", `{}`)
		run := e.waitStep(id, "b", "sleeping")
		a := task(run, "a")
		if code, _ := a["status_code"].(float64); a["status"] != "success" || code != http.StatusNoContent {
			t.Errorf("step a: status %v, status_code %v; want success, 204", a["status"], a["status_code"])
		}
	})
}

// TestRunTimesNeverGoBack: the steps of a wide run finish at once, and
// their outcomes queue for the run's lock, each having read the clock
// before it waited. Each is recorded at a time not before the outcome
// recorded ahead of it: the event log's times never go back, and the run
// never finishes before one of its steps (on the real clock: a fake one
// would hide it).
func TestRunTimesNeverGoBack(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		up := newUpstream(t)
		srv := ferrytest.Start(t, func(c *ferry.Config) { c.Database = db })
		e := &env{t: t, eng: srv.Engine, url: srv.URL, up: up}
		var steps []string
		for i := range 40 {
			steps = append(steps, fmt.Sprintf(`"s%d": {"url": "%s/ok"}`, i, up.URL))
		}
		e.createWorkflow(`{"name": "wide", "tasks": {` + strings.Join(steps, ", ") + `}}`)
		var ids []string
		for range 3 {
			ids = append(ids, e.trigger("wide", `{}`))
		}
		for _, id := range ids {
			run := e.waitFor(id, "run finished", func(r map[string]any) bool { return r["finished_at"] != nil })
			finished := mustTime(t, run["finished_at"])
			for name, st := range run["tasks"].(map[string]any) {
				if f := mustTime(t, st.(map[string]any)["finished_at"]); f.After(finished) {
					t.Errorf("run %s: step %s finished at %v, after its run (%v)", id, name, f, finished)
				}
			}
			evs := e.mustCall(200, "GET", "/api/v1/runs/"+id+"/events", nil)["data"].([]any)
			for i := 1; i < len(evs); i++ {
				prev, ev := evs[i-1].(map[string]any), evs[i].(map[string]any)
				if mustTime(t, ev["at"]).Before(mustTime(t, prev["at"])) {
					t.Errorf("run %s: event %v (%v) at %v is before event %v at %v", id, ev["seq"], ev["type"], ev["at"], prev["seq"], prev["at"])
				}
			}
		}
	})
}

func mustTime(t *testing.T, v any) time.Time {
	t.Helper()
	s, _ := v.(string)
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("time %v: %v", v, err)
	}
	return at
}

// TestRetryingStepShowsLastAttemptsStatusCode: while an HTTP step is
// retrying, its status_code is the last attempt's, as its error and
// duration_ms are: null after a network error, not the 503 of the
// attempt before it (the run showed "status_code": 503 beside the
// error "EOF").
func TestRetryingStepShowsLastAttemptsStatusCode(t *testing.T) {
	backends(t, func(t *testing.T, db string) {
		e := newEnv(t, db)
		var calls atomic.Int32
		e.up.handle("/flaky", func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			conn.Close() // no response: a network error
		})
		e.createWorkflow(fmt.Sprintf(`{"name": "flaky", "tasks": {"a": {"url": "%s/flaky", "retries": 3}}}`, e.up.URL))
		id := e.trigger("flaky", `{}`)
		run := e.waitFor(id, "first retry scheduled", func(r map[string]any) bool { return task(r, "a")["error"] == "HTTP 503" })
		if code := task(run, "a")["status_code"]; code != float64(503) {
			t.Fatalf("after the 503: status_code %v, want 503", code)
		}
		e.clock.Advance(time.Second) // backoff for attempt 1 is at most 1s
		run = e.waitFor(id, "second retry scheduled", func(r map[string]any) bool { return task(r, "a")["attempt"] == float64(2) })
		a := task(run, "a")
		if a["status"] != "running" || a["error"] == "HTTP 503" || a["status_code"] != nil {
			t.Errorf("after the network error: status %v, error %v, status_code %v; want running, the network error, null", a["status"], a["error"], a["status_code"])
		}
	})
}
