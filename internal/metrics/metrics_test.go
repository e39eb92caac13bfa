package metrics

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/internal/store"
)

// Events go to the run or the task family by their type's prefix, and a
// commit's counts add up.
func TestEventsByFamily(t *testing.T) {
	m := New("sqlite")
	m.Events([]store.EventCount{{Type: "run_started", N: 2}, {Type: "step_succeeded", N: 3}, {Type: "webhook_received", N: 1}, {Type: "claimed", N: 4}})
	m.Events([]store.EventCount{{Type: "claimed", N: 1}, {Type: "step_succeeded", N: 1}})
	for _, c := range []struct {
		run  bool
		typ  string
		want float64
	}{
		{true, "run_started", 2}, {true, "step_succeeded", 4}, {true, "webhook_received", 1}, {false, "claimed", 5},
	} {
		vec := m.taskEvents
		if c.run {
			vec = m.runEvents
		}
		if got := testutil.ToFloat64(vec.WithLabelValues(c.typ)); got != c.want {
			t.Errorf("%s: %v, want %v", c.typ, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.taskEvents); n != 1 {
		t.Errorf("task events: %d series, want only claimed", n)
	}
}

// Requests count by the pattern their mux matched (ids in paths make no
// series of their own), with the status written, 200 when none was; the
// catch-all patterns count as unmatched.
func TestInstrumentRoutes(t *testing.T) {
	m := New("sqlite")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/runs/{id}", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("{}")) })
	mux.HandleFunc("POST /api/v1/runs/{id}/cancel", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusConflict) })
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotFound) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotFound) })
	h := m.Instrument(mux)
	for _, req := range []*http.Request{
		httptest.NewRequest("GET", "/api/v1/runs/a", nil),
		httptest.NewRequest("GET", "/api/v1/runs/b", nil),
		httptest.NewRequest("POST", "/api/v1/runs/a/cancel", nil),
		httptest.NewRequest("GET", "/api/v1/nothing", nil),
		httptest.NewRequest("GET", "/elsewhere", nil),
		httptest.NewRequest("GET", "/", nil),
	} {
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	want := `
# HELP ferry_api_requests_total API requests answered, by route and status code.
# TYPE ferry_api_requests_total counter
ferry_api_requests_total{code="200",route="GET /api/v1/runs/{id}"} 2
ferry_api_requests_total{code="404",route="unmatched"} 3
ferry_api_requests_total{code="409",route="POST /api/v1/runs/{id}/cancel"} 1
`
	if err := testutil.CollectAndCompare(m.apiCount, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// A handler that panics is counted (500 unless it had written), and the
// panic goes on to net/http.
func TestInstrumentCountsPanics(t *testing.T) {
	m := New("sqlite")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /boom", func(w http.ResponseWriter, r *http.Request) { panic(http.ErrAbortHandler) })
	h := m.Instrument(mux)
	func() {
		defer func() {
			if p := recover(); p != http.ErrAbortHandler {
				t.Errorf("recovered %v, want the handler's panic passed on", p)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/boom", nil))
	}()
	if got := testutil.ToFloat64(m.apiCount.WithLabelValues("GET /boom", "500")); got != 1 {
		t.Errorf("panicking request counted %v times as a 500, want 1", got)
	}
}
