package ferry_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/api"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
	"github.com/ferryhq/ferry/internal/testwait"
)

// TestMetrics: one run of an HTTP step, a sleep and a task step, and what
// GET /metrics then says of it on each database: the events its commits
// appended, the timer's lateness, the task's wait, the HTTP attempt, the
// API's requests by route, the connection pools.
func TestMetrics(t *testing.T) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			srv := startOn(t, db)
			testMetrics(t, srv, db)
		})
	}
}

func testMetrics(t *testing.T, srv *ferrytest.Server, db string) {
	ctx := context.Background()
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(target.Close)
	c := client.New(srv.URL, srv.Key)
	// hook's callback comes at once; its timeout comes due while nap
	// sleeps, and finds nothing to do.
	def := fmt.Sprintf(`{"name": "metered", "tasks": {
		"call": {"url": %q},
		"hook": {"wait_for_webhook": {"timeout": "1s"}},
		"nap": {"needs": ["call"], "sleep": 2},
		"work": {"needs": ["nap", "hook"], "task": {"type": "metrics.work.v1"}}}}`, target.URL)
	if _, _, err := c.ApplyWorkflow(ctx, "metered", []byte(def)); err != nil {
		t.Fatal(err)
	}
	tr, _, err := c.Trigger(ctx, "metered", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	run, err := c.GetRun(ctx, tr.RunID)
	if err != nil {
		t.Fatal(err)
	}
	var callback string
	for _, st := range run.Tasks {
		if st.Name == "hook" {
			callback = st.CallbackURL
		}
	}
	resp, err := http.Post(callback, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("callback: %d", resp.StatusCode)
	}
	got, err := srv.Engine.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"metrics.work.v1"}, WorkerID: "w", Wait: 20 * time.Second})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %+v %v", got, err)
	}
	if err := srv.Engine.CompleteTask(ctx, got[0].ID, got[0].LeaseToken, nil); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "the run completes", func() bool {
		r, err := c.GetRun(ctx, tr.RunID)
		return err == nil && r.Status == client.RunCompleted
	})

	m := scrape(t, srv)
	for _, w := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ferry_run_events_total", map[string]string{"type": "run_started"}, 1},
		{"ferry_run_events_total", map[string]string{"type": "step_succeeded"}, 4},
		{"ferry_run_events_total", map[string]string{"type": "webhook_received"}, 1},
		{"ferry_run_events_total", map[string]string{"type": "run_completed"}, 1},
		{"ferry_task_events_total", map[string]string{"type": "created"}, 1},
		{"ferry_task_events_total", map[string]string{"type": "claimed"}, 1},
		{"ferry_task_events_total", map[string]string{"type": "succeeded"}, 1},
		{"ferry_timer_lateness_seconds", map[string]string{"kind": "wake"}, 1},
		{"ferry_task_wait_seconds", nil, 1},
		{"ferry_http_step_attempt_seconds", map[string]string{"outcome": "2xx"}, 1},
		{"ferry_api_requests_total", map[string]string{"route": "POST /api/v1/workflows/{id}/trigger", "code": "201"}, 1},
		{"ferry_info", map[string]string{"backend": db}, 1},
	} {
		if v, ok := sample(m, w.name, w.labels); !ok || v != w.want {
			t.Errorf("%s%v = %v (found %v), want %v", w.name, w.labels, v, ok, w.want)
		}
	}
	if _, ok := sample(m, "ferry_timer_lateness_seconds", map[string]string{"kind": "wait_timeout"}); ok {
		t.Error("a webhook timeout that found its callback come is counted as a timer applied")
	}
	// A timer's lateness is a moment after its due time, well under the
	// second the test waited.
	if h, ok := find(m, "ferry_timer_lateness_seconds", map[string]string{"kind": "wake"}); ok {
		if s := h.GetHistogram().GetSampleSum(); s < 0 || s > 5 {
			t.Errorf("wake lateness sum %v s", s)
		}
	}
	for _, pool := range []string{"write", "read"} {
		if _, ok := sample(m, "go_sql_open_connections", map[string]string{"db_name": pool}); !ok {
			t.Errorf("no statistics of the %s pool", pool)
		}
	}
	if db == "postgres" {
		if _, ok := sample(m, "ferry_optimistic_batches_total", map[string]string{"outcome": "written"}); !ok {
			t.Error("no ferry_optimistic_batches_total on Postgres")
		}
		// A server alone shares the timers with no one.
		if v, ok := sample(m, "ferry_timer_share_nodes", nil); !ok || v != 1 {
			t.Errorf("ferry_timer_share_nodes = %v (served %v), want 1", v, ok)
		}
	}
	// The operations guide lists exactly the metrics served: each by its
	// name, but the Go runtime's and the process's own (go_*, process_*).
	// (promhttp_metric_handler_errors_total was served unlisted.)
	doc, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, n := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(string(doc), -1) {
		documented[n[1]] = true
	}
	for name := range m {
		if !documented[name] && !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
			t.Errorf("%s is served but not in docs/operations.md", name)
		}
	}
	for name := range documented {
		if m[name] == nil && !(postgresOnly[name] && db == "sqlite") {
			t.Errorf("docs/operations.md lists %s, which is not served", name)
		}
	}
	if len(documented) < 8 {
		t.Errorf("found %d metrics in docs/operations.md; the table moved?", len(documented))
	}
	// GET /metrics needs the API key.
	resp, err = http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /metrics without a key: %d, want 401", resp.StatusCode)
	}
}

// scrape reads the server's metrics as Prometheus parses them.
func scrape(t *testing.T, srv *ferrytest.Server) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+srv.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	m, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	return m
}

// find is the metric of family name whose labels include labels.
func find(m map[string]*dto.MetricFamily, name string, labels map[string]string) (*dto.Metric, bool) {
	f := m[name]
	if f == nil {
		return nil, false
	}
next:
	for _, x := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range x.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		return x, true
	}
	return nil, false
}

// sample is a counter's or gauge's value, or a histogram's count.
// postgresOnly are the ferry_ metrics a SQLite server does not serve.
var postgresOnly = map[string]bool{"ferry_optimistic_batches_total": true, "ferry_timer_share_nodes": true}

func sample(m map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	x, ok := find(m, name, labels)
	switch {
	case !ok:
		return 0, false
	case x.Counter != nil:
		return x.GetCounter().GetValue(), true
	case x.Gauge != nil:
		return x.GetGauge().GetValue(), true
	case x.Histogram != nil:
		return float64(x.GetHistogram().GetSampleCount()), true
	}
	return 0, false
}

// TestMetricsCancelledAttempt: an HTTP attempt cut short by its run's
// cancellation counts as cancelled, not as an error.
func TestMetricsCancelledAttempt(t *testing.T) {
	srv := ferrytest.Start(t)
	ctx := context.Background()
	entered := make(chan struct{}, 1)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-r.Context().Done() // until the attempt is cut short
	}))
	t.Cleanup(target.Close)
	c := client.New(srv.URL, srv.Key)
	def := fmt.Sprintf(`{"name": "cut", "tasks": {"call": {"url": %q, "timeout": "30s"}}}`, target.URL)
	if _, _, err := c.ApplyWorkflow(ctx, "cut", []byte(def)); err != nil {
		t.Fatal(err)
	}
	tr, _, err := c.Trigger(ctx, "cut", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the attempt never reached its target")
	}
	if _, err := c.CancelRun(ctx, tr.RunID); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "the cut attempt is counted", func() bool {
		_, ok := sample(scrape(t, srv), "ferry_http_step_attempt_seconds", map[string]string{"outcome": "cancelled"})
		return ok
	})
	m := scrape(t, srv)
	if n, _ := sample(m, "ferry_http_step_attempt_seconds", map[string]string{"outcome": "cancelled"}); n != 1 {
		t.Errorf("cancelled attempts: %v, want 1", n)
	}
	if _, ok := sample(m, "ferry_http_step_attempt_seconds", map[string]string{"outcome": "error"}); ok {
		t.Error("the cut attempt is counted as an error too")
	}
}

// TestMetricsClientGone: a request whose client hangs up while the server
// waits (here for the run's row lock, which another transaction holds) is
// counted with code 499 and not logged as an error. It was counted as a
// 500 and logged as "request failed" at error level, so clients' timeouts
// under load read as the server failing. (Found by an audit.)
func TestMetricsClientGone(t *testing.T) {
	dsn := pgtest.DSN(t)
	var logs syncBuffer
	srv := ferrytest.Start(t, func(c *ferry.Config) {
		c.Database = dsn
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	ctx := context.Background()
	c := client.New(srv.URL, srv.Key)
	if _, _, err := c.ApplyWorkflow(ctx, "held", []byte(`{"name": "held", "tasks": {"hook": {"wait_for_webhook": {}}}}`)); err != nil {
		t.Fatal(err)
	}
	tr, _, err := c.Trigger(ctx, "held", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var holder int
	if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid() FROM runs WHERE id = $1 FOR UPDATE`, tr.RunID).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.CancelRun(cctx, tr.RunID)
		done <- err
	}()
	testwait.Until(t, 10*time.Second, "the cancellation waits for the run's lock", func() bool {
		var n int
		return db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, holder).Scan(&n) == nil && n > 0
	})
	cancel() // the client gives up
	if err := <-done; err == nil {
		t.Fatal("the cancelled request was answered")
	}
	route := map[string]string{"route": "POST /api/v1/runs/{run_id}/cancel"}
	testwait.Until(t, 10*time.Second, "the abandoned request is counted", func() bool {
		_, ok := sample(scrape(t, srv), "ferry_api_requests_total", route)
		return ok
	})
	m := scrape(t, srv)
	if _, ok := sample(m, "ferry_api_requests_total", map[string]string{"route": route["route"], "code": "500"}); ok {
		t.Error("a request its client abandoned is counted as a 500")
	}
	if n, _ := sample(m, "ferry_api_requests_total", map[string]string{"route": route["route"], "code": "499"}); n != 1 {
		t.Errorf("requests abandoned by their client: %v, want 1 with code 499", n)
	}
	if l := logs.String(); strings.Contains(l, "level=ERROR") {
		t.Errorf("an abandoned request is logged as an error:\n%s", l)
	}
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// sendEach sends each "METHOD /path" to srv with its key, and reads
// nothing back.
func sendEach(t *testing.T, srv *ferrytest.Server, reqs ...string) {
	t.Helper()
	for _, r := range reqs {
		method, path, _ := strings.Cut(r, " ")
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+srv.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
}

// TestMetricsUnmatchedRequests: requests no route takes count under route
// "unmatched", as the docs say, whichever catch-all answers them. Since
// paths outside /api/ got a JSON 404 or 405 from the pattern "/", they
// were counted under route="/", a label the docs do not name.
func TestMetricsUnmatchedRequests(t *testing.T) {
	srv := ferrytest.Start(t)
	sendEach(t, srv, "GET /nope", "GET /", "POST /healthz", "GET /wh/abc", "GET /api/v1/nope")
	m := scrape(t, srv)
	for code, want := range map[string]float64{"404": 3, "405": 2} {
		if v, _ := sample(m, "ferry_api_requests_total", map[string]string{"route": "unmatched", "code": code}); v != want {
			t.Errorf(`ferry_api_requests_total{route="unmatched",code=%q} = %v, want %v`, code, v, want)
		}
	}
	for _, name := range []string{"ferry_api_requests_total", "ferry_api_request_seconds"} {
		for _, x := range m[name].GetMetric() {
			for _, l := range x.GetLabel() {
				if l.GetName() == "route" && l.GetValue() != "unmatched" && !slices.Contains(api.Routes, l.GetValue()) {
					t.Errorf("%s has route %q, which is neither a route nor unmatched", name, l.GetValue())
				}
			}
		}
	}
}
