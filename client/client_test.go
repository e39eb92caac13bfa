package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

const testKey = ferrytest.Key

// startServer runs a real engine and returns a client for it.
func startServer(t *testing.T) (*client.Client, string) {
	t.Helper()
	srv := ferrytest.Start(t)
	return client.New(srv.URL, testKey), srv.URL
}

func sleepDef(name, d string) []byte {
	return fmt.Appendf(nil, `{"name": %q, "tasks": {"wait": {"sleep": %q}}}`, name, d)
}

// waitRun polls until the run satisfies done or the deadline passes.
func waitRun(t *testing.T, c *client.Client, id string, done func(*client.Run) bool) *client.Run {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		run, err := c.GetRun(context.Background(), id)
		if err != nil {
			t.Fatalf("GetRun: %v", err)
		}
		if done(run) {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: condition not met before deadline; status %s, tasks %+v", id, run.Status, run.Tasks)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func apiError(t *testing.T, err error) *client.APIError {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T) is not an *APIError", err, err)
	}
	return ae
}

func TestWorkflowLifecycle(t *testing.T) {
	c, _ := startServer(t)
	ctx := context.Background()

	wf, err := c.CreateWorkflow(ctx, sleepDef("wf-3", "1s"))
	if err != nil {
		t.Fatal(err)
	}
	if wf.Name != "wf-3" || wf.Version != 1 || wf.ID == "" || wf.TaskCount != 1 || !wf.Enabled || wf.Trigger != "api" {
		t.Fatalf("created workflow = %+v", wf)
	}
	if !json.Valid(wf.Raw) || !strings.Contains(string(wf.Raw), `"name":"wf-3"`) {
		t.Fatalf("Raw = %s", wf.Raw)
	}
	for _, n := range []string{"wf-5", "wf-1", "wf-4", "wf-2"} {
		if _, err := c.CreateWorkflow(ctx, sleepDef(n, "1s")); err != nil {
			t.Fatal(err)
		}
	}

	// Five workflows, two per page: three pages in name order.
	var names []string
	cursor, pages := "", 0
	for {
		page, next, err := c.ListWorkflows(ctx, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if next != "" && len(page) != 2 {
			t.Fatalf("page %d has %d items and a next cursor", pages, len(page))
		}
		for _, w := range page {
			names = append(names, w.Name)
			if w.Tasks != nil {
				t.Errorf("list item %s carries tasks", w.Name)
			}
		}
		if next == "" {
			break
		}
		cursor = next
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
	}
	if diff := cmp.Diff([]string{"wf-1", "wf-2", "wf-3", "wf-4", "wf-5"}, names); diff != "" || pages != 3 {
		t.Fatalf("paged names (-want +got):\n%s\npages %d", diff, pages)
	}

	// Get by name and by id.
	byName, err := c.GetWorkflow(ctx, "wf-3")
	if err != nil {
		t.Fatal(err)
	}
	byID, err := c.GetWorkflow(ctx, wf.ID)
	if err != nil {
		t.Fatal(err)
	}
	if byName.ID != wf.ID || byID.Name != "wf-3" {
		t.Fatalf("get: by name %+v, by id %+v", byName, byID)
	}
	if string(byName.Tasks) != `{"wait":{"sleep":"1s"}}` {
		t.Fatalf("tasks = %s", byName.Tasks)
	}

	// A duplicate create is a 409 already_exists.
	_, err = c.CreateWorkflow(ctx, sleepDef("wf-3", "2s"))
	if ae := apiError(t, err); ae.StatusCode != http.StatusConflict || ae.Code != client.CodeAlreadyExists {
		t.Fatalf("duplicate create: %+v", ae)
	}

	// Update: a change makes version 2; the same content again does not.
	up, err := c.UpdateWorkflow(ctx, "wf-3", sleepDef("wf-3", "2s"))
	if err != nil {
		t.Fatal(err)
	}
	if up.Version != 2 || string(up.Tasks) != `{"wait":{"sleep":"2s"}}` {
		t.Fatalf("update: version %d tasks %s", up.Version, up.Tasks)
	}
	same, err := c.UpdateWorkflow(ctx, wf.ID, sleepDef("wf-3", "2s"))
	if err != nil {
		t.Fatal(err)
	}
	if same.Version != 2 || same.Fingerprint != up.Fingerprint {
		t.Fatalf("unchanged update: version %d", same.Version)
	}

	// Apply: existing and unchanged, existing and changed, new.
	a, created, err := c.ApplyWorkflow(ctx, "wf-3", sleepDef("wf-3", "2s"))
	if err != nil || created || a.Version != 2 {
		t.Fatalf("apply unchanged: %+v created=%v err=%v", a, created, err)
	}
	a, created, err = c.ApplyWorkflow(ctx, "", sleepDef("wf-3", "3s")) // name read from the JSON
	if err != nil || created || a.Version != 3 {
		t.Fatalf("apply changed: %+v created=%v err=%v", a, created, err)
	}
	yamlDef := []byte("name: wf-yaml\ntasks:\n  first:\n    sleep: 5s\n  second:\n    needs: [first]\n    sleep: 1s\n")
	a, created, err = c.ApplyWorkflow(ctx, "wf-yaml", yamlDef)
	if err != nil || !created || a.Version != 1 || a.TaskCount != 2 {
		t.Fatalf("apply new yaml: %+v created=%v err=%v", a, created, err)
	}
	a, created, err = c.ApplyWorkflow(ctx, "wf-yaml", yamlDef)
	if err != nil || created || a.Version != 1 {
		t.Fatalf("apply yaml again: %+v created=%v err=%v", a, created, err)
	}

	// Delete; then it is gone, and the name is free again.
	if err := c.DeleteWorkflow(ctx, "wf-3"); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetWorkflow(ctx, "wf-3")
	if ae := apiError(t, err); ae.StatusCode != http.StatusNotFound || ae.Code != client.CodeNotFound {
		t.Fatalf("get deleted: %+v", ae)
	}
	if !client.HasCode(fmt.Errorf("wrapped: %w", err), client.CodeNotFound) {
		t.Fatal("HasCode does not see through wrapping")
	}
	err = c.DeleteWorkflow(ctx, "wf-3")
	if ae := apiError(t, err); ae.Code != client.CodeNotFound {
		t.Fatalf("delete deleted: %+v", ae)
	}
	a, created, err = c.ApplyWorkflow(ctx, "wf-3", sleepDef("wf-3", "1s"))
	if err != nil || !created || a.Version != 1 || a.ID == wf.ID {
		t.Fatalf("re-create after delete: %+v created=%v err=%v", a, created, err)
	}
}

func TestTriggerAndRuns(t *testing.T) {
	c, _ := startServer(t)
	ctx := context.Background()
	def := []byte(`{"name": "three", "tasks": {"zz": {"sleep": "1h"}, "aa": {"needs": ["zz"], "sleep": "1s"}, "mm": {"needs": ["aa"], "sleep": "1s"}}}`)
	wf, err := c.CreateWorkflow(ctx, def)
	if err != nil {
		t.Fatal(err)
	}

	first, created, err := c.Trigger(ctx, "three", json.RawMessage(`{"order_id": 42}`), "key-1")
	if err != nil || !created {
		t.Fatalf("trigger: %+v created=%v err=%v", first, created, err)
	}
	if first.RunID == "" || first.WorkflowID != wf.ID || first.Version != 1 || first.Status != client.RunRunning || first.StartedAt.IsZero() ||
		!json.Valid(first.Raw) || !strings.Contains(string(first.Raw), first.RunID) {
		t.Fatalf("trigger result = %+v", first)
	}
	again, created, err := c.Trigger(ctx, wf.ID, json.RawMessage(`{"order_id": 43}`), "key-1")
	if err != nil || created || again.RunID != first.RunID {
		t.Fatalf("repeated key: %+v created=%v err=%v (first %s)", again, created, err, first.RunID)
	}
	other, created, err := c.Trigger(ctx, "three", nil, "")
	if err != nil || !created || other.RunID == first.RunID {
		t.Fatalf("trigger without key: %+v created=%v err=%v", other, created, err)
	}

	run, err := c.GetRun(ctx, first.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if run.ID != first.RunID || run.Workflow != "three" || run.WorkflowID != wf.ID || run.Version != 1 || run.Terminal() {
		t.Fatalf("run = %+v", run)
	}
	if string(run.Input) != `{"order_id":42}` {
		t.Fatalf("input = %s", run.Input)
	}
	var got []string
	for _, tr := range run.Tasks {
		got = append(got, tr.Name+":"+tr.Type)
	}
	if diff := cmp.Diff([]string{"zz:sleep", "aa:sleep", "mm:sleep"}, got); diff != "" {
		t.Fatalf("tasks in definition order (-want +got):\n%s", diff)
	}
	if run.Task("aa") == nil || run.Task("aa").Status != client.StepPending || run.Task("nope") != nil {
		t.Fatalf("Task lookup: %+v", run.Task("aa"))
	}
	otherRun, err := c.GetRun(ctx, other.RunID)
	if err != nil || string(otherRun.Input) != `{}` {
		t.Fatalf("run without input: %+v err=%v", otherRun, err)
	}

	// Runs page newest first, without tasks.
	third, _, err := c.Trigger(ctx, "three", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	page, next, err := c.ListRuns(ctx, "three", "", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 2 || next == "" || page[0].ID != third.RunID || page[1].ID != other.RunID || page[0].Tasks != nil {
		t.Fatalf("runs page 1: %+v next %q", page, next)
	}
	page, next, err = c.ListRuns(ctx, wf.ID, next, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 1 || next != "" || page[0].ID != first.RunID || page[0].Workflow != "three" {
		t.Fatalf("runs page 2: %+v next %q", page, next)
	}

	// A batch: in order, keys as for single triggers.
	batch, err := c.TriggerBatch(ctx, "three", []client.BatchRun{
		{Input: json.RawMessage(`{"order_id": 44}`), IdempotencyKey: "key-1"},
		{Input: json.RawMessage(`{"order_id": 45}`)},
	})
	if err != nil || len(batch) != 2 {
		t.Fatalf("batch: %+v err=%v", batch, err)
	}
	if batch[0].RunID != first.RunID || batch[0].Created || !batch[1].Created || batch[1].RunID == "" || batch[1].WorkflowID != wf.ID ||
		batch[1].Status != "running" || batch[1].StartedAt.IsZero() || !json.Valid(batch[1].Raw) || !strings.Contains(string(batch[1].Raw), `"created":true`) {
		t.Fatalf("batch results = %+v", batch)
	}
	if batchRun, err := c.GetRun(ctx, batch[1].RunID); err != nil || string(batchRun.Input) != `{"order_id":45}` {
		t.Fatalf("batch run: %+v err=%v", batchRun, err)
	}
	_, err = c.TriggerBatch(ctx, "three", nil)
	if ae := apiError(t, err); ae.StatusCode != http.StatusBadRequest || ae.Code != client.CodeInvalidRequest {
		t.Fatalf("empty batch: %+v", ae)
	}

	_, err = c.GetRun(ctx, "0190f0f0-0000-7000-8000-000000000000")
	if ae := apiError(t, err); ae.StatusCode != http.StatusNotFound || ae.Code != client.CodeNotFound {
		t.Fatalf("unknown run: %+v", ae)
	}
}

func TestCancelRun(t *testing.T) {
	c, _ := startServer(t)
	ctx := context.Background()
	if _, err := c.CreateWorkflow(ctx, sleepDef("long", "1h")); err != nil {
		t.Fatal(err)
	}
	res, _, err := c.Trigger(ctx, "long", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	// Let the dispatcher start the sleep so cancelling interrupts real work.
	run := waitRun(t, c, res.RunID, func(r *client.Run) bool { return r.Tasks[0].Status == client.StepSleeping })
	if run.Tasks[0].WakeAt == nil || time.Until(*run.Tasks[0].WakeAt) < 50*time.Minute {
		t.Fatalf("sleeping step wake_at = %v", run.Tasks[0].WakeAt)
	}

	cancelled, err := c.CancelRun(ctx, res.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if cancelled.Status != client.RunCancelled || !cancelled.Terminal() || cancelled.FinishedAt == nil {
		t.Fatalf("cancelled run = %+v", cancelled)
	}
	if len(cancelled.Tasks) != 1 || cancelled.Tasks[0].Name != "wait" || cancelled.Tasks[0].Status != client.StepCancelled {
		t.Fatalf("cancelled tasks = %+v", cancelled.Tasks)
	}
	again, err := c.GetRun(ctx, res.RunID)
	if err != nil || again.Status != client.RunCancelled {
		t.Fatalf("run after cancel: %+v err=%v", again, err)
	}
	_, err = c.CancelRun(ctx, res.RunID)
	if ae := apiError(t, err); ae.StatusCode != http.StatusConflict || ae.Code != client.CodeRunFinished {
		t.Fatalf("cancel twice: %+v", ae)
	}

	evs, err := c.Events(ctx, res.RunID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) < 2 || evs[len(evs)-1].Type != "run_cancelled" {
		t.Fatalf("events = %+v", evs)
	}
	for i, ev := range evs {
		if ev.RunID != res.RunID || ev.At.IsZero() || (i > 0 && ev.Seq <= evs[i-1].Seq) {
			t.Fatalf("event %d = %+v", i, ev)
		}
	}
	later, err := c.Events(ctx, res.RunID, evs[0].Seq)
	if err != nil {
		t.Fatal(err)
	}
	if len(later) != len(evs)-1 || later[0].Seq != evs[1].Seq {
		t.Fatalf("events after %d: %+v", evs[0].Seq, later)
	}
}

func TestHTTPStepRun(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, `{"path": %q, "ok": true}`, r.URL.Path)
	}))
	t.Cleanup(upstream.Close)
	c, _ := startServer(t)
	ctx := context.Background()
	def := fmt.Appendf(nil, `{"name": "calls", "tasks": {
		"zeta": {"url": %q, "body": {"n": 1}},
		"alpha": {"needs": ["zeta"], "url": %q, "method": "GET"}
	}}`, upstream.URL+"/zeta", upstream.URL+"/alpha")
	if _, err := c.CreateWorkflow(ctx, def); err != nil {
		t.Fatal(err)
	}
	res, _, err := c.Trigger(ctx, "calls", json.RawMessage(`{}`), "")
	if err != nil {
		t.Fatal(err)
	}
	run := waitRun(t, c, res.RunID, (*client.Run).Terminal)
	if run.Status != client.RunCompleted || run.FinishedAt == nil || run.Error != "" {
		t.Fatalf("run = %+v", run)
	}
	if len(run.Tasks) != 2 || run.Tasks[0].Name != "zeta" || run.Tasks[1].Name != "alpha" {
		t.Fatalf("tasks = %+v", run.Tasks)
	}
	for _, tr := range run.Tasks {
		if tr.Status != client.StepSuccess || tr.StatusCode == nil || *tr.StatusCode != 200 || tr.DurationMS == nil || tr.Attempt != 1 || tr.Type != "http" {
			t.Fatalf("task %s = %+v", tr.Name, tr)
		}
		var body struct {
			Path string `json:"path"`
			OK   bool   `json:"ok"`
		}
		if err := json.Unmarshal(tr.Body, &body); err != nil || body.Path != "/"+tr.Name || !body.OK {
			t.Fatalf("task %s body %s (%v)", tr.Name, tr.Body, err)
		}
	}

	// A Run marshals back to the server's shape, task order included.
	b, err := json.Marshal(run)
	if err != nil {
		t.Fatal(err)
	}
	var back client.Run
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(run, &back, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Raw" }, cmp.Ignore())); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
	if strings.Index(string(b), `"zeta"`) > strings.Index(string(b), `"alpha"`) {
		t.Fatalf("marshalled task order lost: %s", b)
	}
}

func TestAPIErrors(t *testing.T) {
	c, base := startServer(t)
	ctx := context.Background()

	def := []byte(`{"name": "orders", "tasks": {
		"charge": {"url": "https://pay.example.com/charge"},
		"send-receipt": {"needs": ["chrage"], "url": "https://mail.example.com/send"}
	}}`)
	_, err := c.CreateWorkflow(ctx, def)
	ae := apiError(t, err)
	if ae.StatusCode != http.StatusUnprocessableEntity || ae.Code != client.CodeInvalidWorkflow || ae.Message == "" {
		t.Fatalf("422: %+v", ae)
	}
	if len(ae.Details) != 1 || ae.Details[0].Path != "tasks.send-receipt.needs[0]" || ae.Details[0].Code != "unknown_need" {
		t.Fatalf("details = %+v", ae.Details)
	}
	if !strings.Contains(ae.Details[0].Message, `"charge"`) {
		t.Errorf("detail message %q does not suggest charge", ae.Details[0].Message)
	}
	msg := ae.Error()
	if !strings.HasPrefix(msg, "invalid_workflow: ") || !strings.Contains(msg, "\n  tasks.send-receipt.needs[0]: unknown step") {
		t.Fatalf("Error() = %q", msg)
	}

	// The same problem in YAML, through the update path.
	if _, err := c.CreateWorkflow(ctx, sleepDef("orders", "1s")); err != nil {
		t.Fatal(err)
	}
	_, err = c.UpdateWorkflow(ctx, "orders", []byte("name: orders\ntasks:\n  a:\n    sleep: 1s\n  b:\n    needs: [c]\n    sleep: 1s\n"))
	if ae := apiError(t, err); ae.StatusCode != 422 || len(ae.Details) != 1 || ae.Details[0].Path != "tasks.b.needs[0]" {
		t.Fatalf("yaml 422: %+v", ae)
	}

	_, err = c.CreateWorkflow(ctx, []byte(`{"name": `))
	if ae := apiError(t, err); ae.StatusCode != http.StatusBadRequest || ae.Code != client.CodeInvalidJSON {
		t.Fatalf("bad JSON: %+v", ae)
	}
	_, _, err = c.Trigger(ctx, "orders", json.RawMessage(`{not json`), "")
	if ae := apiError(t, err); ae.StatusCode != http.StatusBadRequest || ae.Code != client.CodeInvalidJSON {
		t.Fatalf("bad trigger body: %+v", ae)
	}
	_, _, err = c.ListWorkflows(ctx, "", 501)
	if ae := apiError(t, err); ae.Code != client.CodeInvalidParameter || len(ae.Details) != 1 || ae.Details[0].Path != "limit" {
		t.Fatalf("bad limit: %+v", ae)
	}

	for _, key := range []string{"wrong-key", ""} {
		_, _, err = client.New(base, key).ListWorkflows(ctx, "", 0)
		if ae := apiError(t, err); ae.StatusCode != http.StatusUnauthorized || ae.Code != client.CodeUnauthorized {
			t.Fatalf("key %q: %+v", key, ae)
		}
	}
}

func TestNonEnvelopeErrorAndOptions(t *testing.T) {
	var gotUA, gotAuth, gotPath string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotUA, gotAuth, gotPath = r.Header.Get("User-Agent"), r.Header.Get("Authorization"), r.URL.EscapedPath()
		http.Error(w, "<html>bad gateway</html>", http.StatusBadGateway)
	}))
	t.Cleanup(proxy.Close)
	hc := &http.Client{Timeout: 5 * time.Second}
	c := client.New(proxy.URL+"/ferry/", "k", client.WithHTTPClient(hc), client.WithUserAgent("test-agent"))
	_, err := c.GetWorkflow(context.Background(), "a b/c")
	ae := apiError(t, err)
	if ae.StatusCode != http.StatusBadGateway || ae.Code != "" || ae.Message != "<html>bad gateway</html>" {
		t.Fatalf("502: %+v", ae)
	}
	if got := ae.Error(); got != "HTTP 502 Bad Gateway: <html>bad gateway</html>" {
		t.Fatalf("Error() = %q", got)
	}
	if gotUA != "test-agent" || gotAuth != "Bearer k" || gotPath != "/ferry/api/v1/workflows/a%20b%2Fc" {
		t.Fatalf("request: ua %q auth %q path %q", gotUA, gotAuth, gotPath)
	}
}

func TestAPIErrorFormat(t *testing.T) {
	e := &client.APIError{StatusCode: 422, Code: "invalid_workflow", Message: "the workflow definition is invalid", Details: []client.FieldDetail{
		{Path: "tasks.a.url", Code: "invalid_url", Message: "bad url"},
		{Path: "", Code: "too_large", Message: "too big"},
	}}
	want := "invalid_workflow: the workflow definition is invalid\n  tasks.a.url: bad url\n  too big"
	if got := e.Error(); got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

// TestDefaultClientKeepsConnections: a client with many requests in flight
// at once reuses its connections from one round to the next instead of
// closing all but two and dialling again (http.DefaultClient's limit).
func TestDefaultClientKeepsConnections(t *testing.T) {
	const inFlight, rounds = 16, 10
	var (
		mu      sync.Mutex
		dialled int
		waiting int
		all     = make(chan struct{})
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Each round's requests wait for one another, so that the round
		// really has inFlight of them on as many connections.
		mu.Lock()
		waiting++
		ch := all
		if waiting == inFlight {
			close(all)
			all, waiting = make(chan struct{}), 0
		}
		mu.Unlock()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data": {"type": "x.v1", "description": "", "enabled": true}}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			dialled++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	c := client.New(srv.URL, "k")
	for range rounds {
		var wg sync.WaitGroup
		for range inFlight {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.GetTaskType(context.Background(), "x.v1"); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	mu.Lock()
	defer mu.Unlock()
	// The first round dials inFlight connections; the transport may dial
	// a few more ahead. Two idle ones kept would make it ≈ 16 + 9 × 14.
	if dialled > 2*inFlight {
		t.Fatalf("%d connections dialled for %d rounds of %d requests at once", dialled, rounds, inFlight)
	}
}

// TestNewTransportWithReplacedDefault: a program that replaced
// http.DefaultTransport with a RoundTripper of its own still gets a
// transport keeping the client's idle connections, not a panic.
func TestNewTransportWithReplacedDefault(t *testing.T) {
	orig := http.DefaultTransport
	t.Cleanup(func() { http.DefaultTransport = orig })
	http.DefaultTransport = roundTripFunc(func(r *http.Request) (*http.Response, error) { return orig.RoundTrip(r) })
	tr := client.NewTransport()
	if tr.MaxIdleConnsPerHost != client.MaxIdleConnsPerHost || tr.MaxIdleConns != 0 || tr.Proxy == nil || tr.IdleConnTimeout == 0 {
		t.Fatalf("transport %+v", tr)
	}
	http.DefaultTransport = orig
	if got := client.NewTransport(); got.MaxIdleConnsPerHost != client.MaxIdleConnsPerHost || got.TLSHandshakeTimeout != orig.(*http.Transport).TLSHandshakeTimeout {
		t.Fatalf("from the default transport: %+v", got)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
