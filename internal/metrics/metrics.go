package metrics

import (
	"database/sql"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferryhq/ferry/internal/httpwrap"
	"github.com/ferryhq/ferry/internal/store"
)

// latencyBuckets (seconds) span 0.5 ms to ≈8 s, doubling: timers and
// hand-offs are milliseconds apart when all is well and seconds when a
// backlog builds, and both ends matter.
var latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 15)

// Metrics is one engine's registry and the metrics it serves. Its
// methods are safe for concurrent use.
type Metrics struct {
	reg        *prometheus.Registry
	runEvents  *prometheus.CounterVec
	taskEvents *prometheus.CounterVec
	timerLate  *prometheus.HistogramVec
	taskWait   prometheus.Histogram
	httpSteps  *prometheus.HistogramVec
	apiTime    *prometheus.HistogramVec
	apiCount   *prometheus.CounterVec
}

// New builds the metrics of an engine on the given database backend
// ("sqlite" or "postgres"), with the Go runtime's and the process's own.
func New(backend string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		runEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_run_events_total",
			Help: "Run and step events committed by this server, by event type (run_started, step_succeeded, run_completed, …).",
		}, []string{"type"}),
		taskEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_task_events_total",
			Help: "Task events committed by this server, by event type (created, claimed, succeeded, retried, lease_expired, …).",
		}, []string{"type"}),
		timerLate: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ferry_timer_lateness_seconds",
			Help:    "How long after its due time a timer was applied, by kind (wake: a sleep's end; wait_timeout: a webhook wait's timeout; run_expire: a run's max_duration); timers that found nothing to do (a callback came first, the run had ended) are not counted.",
			Buckets: latencyBuckets,
		}, []string{"kind"}),
		taskWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ferry_task_wait_seconds",
			Help:    "How long a task was claimable (from its run_at, its last change while pending, or the end of the expired lease taken over) before a claim handed it to a worker.",
			Buckets: latencyBuckets,
		}),
		httpSteps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ferry_http_step_attempt_seconds",
			Help:    "Duration of HTTP step attempts, by outcome (2xx … 5xx, as the step records it; error when no response came, or a 2xx's body broke off; cancelled when the run was cancelled or the lease lost during the attempt).",
			Buckets: prometheus.DefBuckets,
		}, []string{"outcome"}),
		apiTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ferry_api_request_seconds",
			Help:    "Duration of API requests, by route (long-polling claims last up to their wait).",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
		apiCount: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_api_requests_total",
			Help: "API requests answered, by route and status code.",
		}, []string{"route", "code"}),
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "ferry_info",
		Help:        "Always 1; the database backend this server runs on.",
		ConstLabels: prometheus.Labels{"backend": backend},
	})
	info.Set(1)
	m.reg.MustRegister(m.runEvents, m.taskEvents, m.timerLate, m.taskWait, m.httpSteps, m.apiTime, m.apiCount, info,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the registry in Prometheus's text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry is the engine's registry, for collectors of its own.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// DB adds a connection pool's statistics (go_sql_* metrics, labelled
// db_name).
func (m *Metrics) DB(name string, db *sql.DB) {
	m.reg.MustRegister(collectors.NewDBStatsCollector(db, name))
}

// Counter adds a counter read from f at each scrape.
func (m *Metrics) Counter(name, help string, labels prometheus.Labels, f func() float64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, f))
}

// Gauge adds a gauge read from f at each scrape.
func (m *Metrics) Gauge(name, help string, labels prometheus.Labels, f func() float64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f))
}

// Events counts what a commit appended to runs' and tasks' event logs.
// Run and step events are those whose type begins run_, step_ or
// webhook_ (the API's event types); the others are task events.
func (m *Metrics) Events(counts []store.EventCount) {
	for _, c := range counts {
		vec := m.taskEvents
		if isRunEvent(c.Type) {
			vec = m.runEvents
		}
		vec.WithLabelValues(c.Type).Add(float64(c.N))
	}
}

func isRunEvent(typ string) bool {
	return strings.HasPrefix(typ, "run_") || strings.HasPrefix(typ, "step_") || strings.HasPrefix(typ, "webhook_")
}

// TimerFired observes a timer applied late after its due time.
func (m *Metrics) TimerFired(kind string, late time.Duration) {
	m.timerLate.WithLabelValues(kind).Observe(late.Seconds())
}

// TaskHandedOut observes a task handed to a worker wait after it became
// claimable.
func (m *Metrics) TaskHandedOut(wait time.Duration) { m.taskWait.Observe(wait.Seconds()) }

// HTTPAttempt observes an HTTP step's attempt.
func (m *Metrics) HTTPAttempt(outcome string, took time.Duration) {
	m.httpSteps.WithLabelValues(outcome).Observe(took.Seconds())
}

// Instrument counts and times the requests next serves, by the route
// pattern its ServeMux matched (r.Pattern, "METHOD /path/{param}"), so
// that ids in paths do not make a series each; requests no route matched
// count as "unmatched". So do those the catch-all patterns answer (the
// API's "/api/" and "/" give JSON 404s and 405s): a pattern that takes any
// path names no route, and "/" is where every stray probe lands.
func (m *Metrics) Instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := httpwrap.NewStatusWriter(w)
		// Deferred: a handler that panics (net/http answers 500, or
		// drops the connection for http.ErrAbortHandler) is counted too.
		defer func() {
			code := sw.Code
			if p := recover(); p != nil {
				if !sw.Written {
					code = http.StatusInternalServerError
				}
				defer panic(p)
			}
			route := r.Pattern
			if route == "" || route == "/api/" || route == "/" {
				route = "unmatched"
			}
			m.apiTime.WithLabelValues(route).Observe(time.Since(start).Seconds())
			m.apiCount.WithLabelValues(route, strconv.Itoa(code)).Inc()
		}()
		next.ServeHTTP(sw, r)
	})
}
