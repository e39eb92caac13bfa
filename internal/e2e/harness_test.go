package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

const apiKey = ferrytest.Key

// backends runs fn once per storage backend.
func backends(t *testing.T, fn func(t *testing.T, database string)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		fn(t, "sqlite:"+filepath.Join(t.TempDir(), "ferry.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, pgtest.DSN(t))
	})
}

// upstream is the test server that HTTP steps call. Handlers are keyed by
// path; every request is recorded.
type upstream struct {
	*httptest.Server
	mu       sync.Mutex
	handlers map[string]http.HandlerFunc
	reqs     []recorded
}

type recorded struct {
	Path    string
	Method  string
	Headers http.Header
	Body    []byte
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{handlers: map[string]http.HandlerFunc{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.reqs = append(u.reqs, recorded{r.URL.Path, r.Method, r.Header.Clone(), b})
		h := u.handlers[r.URL.Path]
		u.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		if h == nil {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"ok":true}`)
			return
		}
		h(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) handle(path string, h http.HandlerFunc) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.handlers[path] = h
}

func (u *upstream) requests(path string) []recorded {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []recorded
	for _, r := range u.reqs {
		if r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

func jsonReply(code int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprint(w, body)
	}
}

// env is one Ferry engine behind a real HTTP server, on a fake clock.
type env struct {
	t     *testing.T
	eng   *ferry.Engine
	url   string
	clock *clock.Fake
	up    *upstream
}

type envOpt func(*ferry.Config)

func withEgress(allow string) envOpt { return func(c *ferry.Config) { c.EgressAllow = allow } }

func newEnv(t *testing.T, database string, opts ...envOpt) *env {
	t.Helper()
	e := &env{t: t, clock: clock.NewFake(time.Date(2026, 2, 22, 10, 0, 0, 0, time.UTC)), up: newUpstream(t)}
	all := []func(*ferry.Config){func(c *ferry.Config) {
		c.Database = database
		c.Clock = e.clock
	}}
	for _, o := range opts {
		all = append(all, o)
	}
	srv := ferrytest.Start(t, all...)
	e.eng, e.url = srv.Engine, srv.URL
	return e
}

// call performs an API request and decodes the JSON response.
func (e *env) call(method, path string, body any, headers ...string) (int, map[string]any) {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, e.url+path, rd)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			e.t.Fatalf("%s %s: bad JSON %q", method, path, raw)
		}
	}
	return resp.StatusCode, out
}

func (e *env) mustCall(want int, method, path string, body any, headers ...string) map[string]any {
	e.t.Helper()
	code, out := e.call(method, path, body, headers...)
	if code != want {
		e.t.Fatalf("%s %s: status %d, want %d: %v", method, path, code, want, out)
	}
	return out
}

// seed loads a seed example, pointing its URLs at the upstream.
func (e *env) seed(doc string) string {
	return strings.ReplaceAll(doc, "https://myapp.com", e.up.URL)
}

func (e *env) createWorkflow(doc string) {
	e.t.Helper()
	e.mustCall(201, "POST", "/api/v1/workflows", e.seed(doc))
}

func (e *env) trigger(wf string, input string, headers ...string) string {
	e.t.Helper()
	out := e.mustCall(201, "POST", "/api/v1/workflows/"+wf+"/trigger", input, headers...)
	return out["data"].(map[string]any)["run_id"].(string)
}

// run fetches a run's data.
func (e *env) run(id string) map[string]any {
	e.t.Helper()
	return e.mustCall(200, "GET", "/api/v1/runs/"+id, nil)["data"].(map[string]any)
}

func task(run map[string]any, name string) map[string]any {
	return run["tasks"].(map[string]any)[name].(map[string]any)
}

// waitFor polls until cond holds for the run, nudging the dispatcher so
// fake-clock advances are noticed; it fails after a real-time deadline.
func (e *env) waitFor(id string, what string, cond func(run map[string]any) bool) map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := e.run(id)
		if cond(r) {
			return r
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(r, "", "  ")
			e.t.Fatalf("timed out waiting for %s; run is:\n%s", what, b)
		}
		e.eng.Nudge()
		time.Sleep(10 * time.Millisecond) // polling interval, not synchronisation
	}
}

func (e *env) waitStatus(id, status string) map[string]any {
	e.t.Helper()
	return e.waitFor(id, "run "+status, func(r map[string]any) bool { return r["status"] == status })
}

func (e *env) waitStep(id, step, status string) map[string]any {
	e.t.Helper()
	return e.waitFor(id, step+" "+status, func(r map[string]any) bool { return task(r, step)["status"] == status })
}

func wantStatuses(t *testing.T, run map[string]any, want map[string]string) {
	t.Helper()
	for step, st := range want {
		if got := task(run, step)["status"]; got != st {
			t.Errorf("step %s: status %v, want %s (error: %v)", step, got, st, task(run, step)["error"])
		}
	}
}
