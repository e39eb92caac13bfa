package ferry

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ferryhq/ferry/internal/api"
	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/httpwrap"
	"github.com/ferryhq/ferry/internal/metrics"
	"github.com/ferryhq/ferry/internal/netguard"
	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/step/httpstep"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres"
	"github.com/ferryhq/ferry/internal/store/sqlite"
	"github.com/ferryhq/ferry/internal/store/sqlstore"
	"github.com/ferryhq/ferry/internal/tracing"
	"go.opentelemetry.io/otel/trace"
)

// DefaultDatabase is the embedded default: an SQLite file in the working
// directory.
const DefaultDatabase = "sqlite:./ferry.db"

// Config configures an Engine. The zero value runs on DefaultDatabase.
type Config struct {
	// Database is "sqlite:PATH" or a postgres:// URL.
	Database string
	// PublicURL is the base of webhook callback URLs
	// (e.g. https://ferry.example.com): an absolute http or https URL
	// without a query or fragment, since callback paths (/wh/<token>) are
	// appended to it; Open refuses others.
	PublicURL string
	// EgressAllow lists CIDRs and host names that HTTP steps may reach
	// besides public addresses (comma-separated).
	EgressAllow string
	// Migrate applies pending migrations on Open.
	Migrate bool
	// MaxDefinitionBytes and MaxSteps bound workflow definitions
	// (defaults 256 KB and 100).
	MaxDefinitionBytes int
	MaxSteps           int
	// Concurrency bounds queue items processed at once (default 64).
	Concurrency int
	// Lease is how long claimed work is held before another node may take
	// it over (default 30s).
	Lease time.Duration
	// SafetyTick bounds how long the dispatcher sleeps without a wake-up
	// (default 5s).
	SafetyTick time.Duration
	Logger     *slog.Logger
	// Clock replaces the system clock (tests drive timers with a fake).
	Clock clock.Clock
	// BodyReadTimeout bounds how long a request's body may take to
	// arrive, from the request's start (default 30s; negative: no bound).
	// A client trickling a body otherwise holds a handler for as long as
	// it likes.
	BodyReadTimeout time.Duration
	// TracerProvider receives Ferry's OpenTelemetry spans (API requests,
	// triggers, HTTP steps' attempts, steps and runs); nil traces nothing.
	// `ferry server` builds one from the OTEL_* environment variables
	// (TracerProviderFromEnv).
	TracerProvider trace.TracerProvider
}

// DefaultBodyReadTimeout is Config.BodyReadTimeout's default.
const DefaultBodyReadTimeout = 30 * time.Second

// TracerProviderFromEnv builds the tracer provider the standard
// OpenTelemetry environment variables describe (a no-op one unless an
// OTLP exporter is configured; see docs/operations.md#tracing), and the
// function that flushes and stops it.
func TracerProviderFromEnv(ctx context.Context, version string) (trace.TracerProvider, func(context.Context) error, error) {
	return tracing.FromEnv(ctx, version)
}

// Engine is a running Ferry instance.
type Engine struct {
	store   store.Store
	rt      *runtime.Runtime
	api     *api.Server
	handler http.Handler // api, instrumented
	log     *slog.Logger
	limits  spec.Limits
	// closed makes Close once: an explicit Close beside a deferred one
	// must not close the store twice (SQLite's writer panicked).
	closed   sync.Once
	closeErr error
	// stopRuns ends the Run in progress at Close (closing, its context's
	// end), which waits for it in runs before the store closes; a Run
	// called once closing is set returns ErrClosed.
	runMu    sync.Mutex
	isClosed bool
	// shut is set as Close begins: every method then returns ErrClosed
	// (read on every call, so not under runMu).
	shut     atomic.Bool
	runs     sync.WaitGroup
	closing  context.Context
	stopRuns context.CancelFunc
}

// OpenStore opens the store named by a database URL.
func OpenStore(ctx context.Context, database string) (store.Store, error) {
	switch {
	case database == "":
		database = DefaultDatabase
		fallthrough
	case strings.HasPrefix(database, "sqlite:"):
		path := strings.TrimPrefix(strings.TrimPrefix(database, "sqlite:"), "//")
		return sqlite.Open(path)
	case strings.HasPrefix(database, "postgres://"), strings.HasPrefix(database, "postgresql://"):
		return postgres.Open(ctx, database)
	}
	// Not the value itself: a connection string of another form
	// ("host=… password=…") carries a password.
	if scheme, _, ok := strings.Cut(database, ":"); ok && urlScheme.MatchString(scheme) {
		return nil, fmt.Errorf("database URL scheme %q: use sqlite:PATH or a postgres:// URL", scheme)
	}
	return nil, errors.New("database: use sqlite:PATH or a postgres:// URL")
}

// urlScheme matches what may begin a URL before its colon (RFC 3986).
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// warmer is a store that can open its connections and load their caches
// before work begins (Postgres), so that the first runs after a start do
// not wait for that.
type warmer interface {
	Warm(ctx context.Context) error
}

// warmFor bounds the warm-up: past it, the engine starts and connections
// open as they are needed.
const warmFor = 2 * time.Second

// Open opens the database and builds the engine. Call Run to execute work
// and serve Handler over HTTP.
func Open(ctx context.Context, cfg Config) (*Engine, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := checkPublicURL(cfg.PublicURL); err != nil {
		return nil, err
	}
	policy, err := netguard.ParsePolicy(cfg.EgressAllow)
	if err != nil {
		return nil, fmt.Errorf("egress allow list: %w", err)
	}
	st, err := OpenStore(ctx, cfg.Database)
	if err != nil {
		return nil, err
	}
	if l, ok := st.(interface{ SetLogger(*slog.Logger) }); ok {
		l.SetLogger(cfg.Logger) // the store's own messages follow the engine's level and format
	}
	var schemaErr error
	if cfg.Migrate {
		if schemaErr = st.Migrate(ctx); schemaErr != nil && !errors.Is(schemaErr, sqlstore.ErrSchemaNewer) {
			st.Close()
			return nil, fmt.Errorf("migrate: %w", schemaErr)
		}
	} else if c, ok := st.(schemaChecker); ok {
		if schemaErr = c.CheckSchema(ctx); schemaErr != nil && !errors.Is(schemaErr, sqlstore.ErrSchemaNewer) {
			st.Close()
			return nil, schemaErr
		}
	}
	if schemaErr != nil {
		// A node left behind in a rolling upgrade: it runs, and says so.
		cfg.Logger.Error("this ferry is older than the database's schema: upgrade it; until then it may fail to read what newer servers wrote", "err", schemaErr)
	}
	if w, ok := st.(warmer); ok {
		wctx, cancel := context.WithTimeout(ctx, warmFor)
		err := w.Warm(wctx)
		cancel()
		if ctx.Err() != nil {
			st.Close()
			return nil, ctx.Err()
		}
		if err != nil {
			cfg.Logger.Warn("warming database connections failed", "err", err)
		}
	}
	limits := spec.DefaultLimits
	if cfg.MaxDefinitionBytes > 0 {
		limits.MaxBytes = cfg.MaxDefinitionBytes
	}
	if cfg.MaxSteps > 0 {
		limits.MaxSteps = cfg.MaxSteps
	}
	m := newMetrics(st)
	tr := tracing.New(cfg.TracerProvider)
	if tr.Enabled() {
		st.OnFinished(tr.Finished)
	}
	rt := runtime.New(runtime.Config{
		Observer:    m,
		Tracer:      tr,
		Store:       st,
		HTTP:        httpstep.New(policy.Transport()),
		Clock:       cfg.Clock,
		Logger:      cfg.Logger,
		PublicURL:   cfg.PublicURL,
		Concurrency: cfg.Concurrency,
		Lease:       cfg.Lease,
		SafetyTick:  cfg.SafetyTick,
	})
	srv := api.New(api.Config{Store: st, Runtime: rt, Limits: limits, Logger: cfg.Logger, Metrics: m.Handler()})
	if cfg.BodyReadTimeout == 0 {
		cfg.BodyReadTimeout = DefaultBodyReadTimeout
	}
	handler := httpwrap.BodyDeadline(m.Instrument(tr.Middleware(srv)), cfg.BodyReadTimeout)
	closing, stopRuns := context.WithCancel(context.Background())
	return &Engine{store: st, rt: rt, api: srv, handler: handler, log: cfg.Logger, limits: limits, closing: closing, stopRuns: stopRuns}, nil
}

// checkPublicURL refuses a public URL that callback URLs cannot be made
// from: one not absolute http or https, or with a query or fragment, after
// which /wh/<token> would not be a path (https://host/?via=lb/wh/…: every
// callback missed).
func checkPublicURL(public string) error {
	if public == "" {
		return nil
	}
	if u, err := url.Parse(public); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("public URL %q: want an absolute http or https URL, like https://ferry.example.com", public)
	} else if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(public, "#") {
		return fmt.Errorf("public URL %q: want a URL without a query or fragment (callback paths are appended to it)", public)
	}
	return nil
}

// newMetrics builds an engine's metrics and connects the store's: the
// events its commits append, its connection pools and, on Postgres, its
// optimistic batches.
func newMetrics(st store.Store) *metrics.Metrics {
	m := metrics.New(st.Dialect())
	st.OnEvents(m.Events)
	if s, ok := st.(interface{ DBs() (w, r *sql.DB) }); ok {
		w, r := s.DBs()
		m.DB("write", w)
		if r != w {
			m.DB("read", r)
		}
	}
	if s, ok := st.(interface {
		OptimisticBatches() (written, stale, redecided int64)
		OptimisticRereads() int64
	}); ok && st.Dialect() == "postgres" {
		for i, outcome := range []string{"written", "stale", "redecided", "reread"} {
			m.Counter("ferry_optimistic_batches_total",
				"Report batches and fire transactions decided on cached rows (Postgres), by outcome: written so, found stale at their write, decided again the locking way before anything was sent, or decided a second time on cached runs read afresh (another server had written them).",
				map[string]string{"outcome": outcome}, func() float64 {
					written, stale, redecided := s.OptimisticBatches()
					return float64([...]int64{written, stale, redecided, s.OptimisticRereads()}[i])
				})
		}
	}
	if s, ok := st.(interface{ TimerShare() (index, of int) }); ok && st.Dialect() == "postgres" {
		m.Gauge("ferry_timer_share_nodes",
			"Servers this one shares the due timers with, itself included (Postgres): those heard from within a minute that have not said goodbye or been found gone.",
			nil, func() float64 {
				_, of := s.TimerShare()
				return float64(of)
			})
	}
	return m
}

// Handler serves the REST API, webhook callbacks, /healthz and /metrics,
// counting its requests (metrics).
func (e *Engine) Handler() http.Handler { return e.handler }

// Run executes due work until ctx ends or Close is called, and returns
// once the work in flight has stopped (on Postgres, once the other
// servers have been told this one stopped). One Run at a time: another
// while one runs returns ErrRunning. Run may be called again after it
// returns, but not after Close: it then returns ErrClosed at once.
func (e *Engine) Run(ctx context.Context) error {
	e.runMu.Lock()
	if e.isClosed {
		e.runMu.Unlock()
		return ErrClosed
	}
	e.runs.Add(1)
	e.runMu.Unlock()
	defer e.runs.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.closing, cancel)()
	return e.rt.Run(ctx)
}

// ErrRunning is Run's error while another Run of the engine runs.
var ErrRunning = runtime.ErrRunning

// ErrClosed is what Run and every method that reads or writes return
// once Close has been called.
var ErrClosed = errors.New("ferry: engine closed")

// usable is ErrClosed once Close has begun: a method called after it
// failed with whatever the closed database said ("sql: database is
// closed"), which a caller could not tell apart.
func (e *Engine) usable() error {
	if e.shut.Load() {
		return ErrClosed
	}
	return nil
}

// Drain makes waiting task claims return at once (empty); call it when the
// HTTP server starts shutting down.
func (e *Engine) Drain() { e.rt.Drain() }

// Nudge asks the dispatcher to look for due work now instead of at its next
// wake-up.
func (e *Engine) Nudge() { e.rt.Nudge() }

// Close stops a Run in progress, as the end of its context does, waits
// for it to return, and releases the database. Calls after the first do
// nothing and return the first's error.
func (e *Engine) Close() error {
	e.closed.Do(func() {
		e.shut.Store(true)
		e.runMu.Lock()
		e.isClosed = true
		e.runMu.Unlock()
		e.stopRuns()
		e.runs.Wait() // its last writes (on Postgres, its goodbye) before the store closes
		e.rt.Close()
		e.closeErr = e.store.Close()
	})
	return e.closeErr
}

// Store exposes the underlying store to tools and tests in this module.
func (e *Engine) Store() store.Store { return e.store }

// EnsureAPIKey makes key a valid admin key. With an empty key it creates one
// when none exists yet and returns it (it is shown once: only its hash is
// stored); otherwise it returns "".
func (e *Engine) EnsureAPIKey(ctx context.Context, key string) (string, error) {
	if err := e.usable(); err != nil {
		return "", err
	}
	// A key read from a file (a Kubernetes secret, a .env line) often ends
	// in a newline, which no Authorization header can carry: the key was
	// registered and could never be used.
	key = strings.TrimSpace(key)
	if key != "" {
		return "", e.store.AddAPIKey(ctx, "env", api.HashKey(key))
	}
	has, err := e.store.HasAPIKeys(ctx)
	if err != nil {
		return "", err
	}
	if has {
		return "", nil
	}
	key = "fry_" + rand.Text()
	if err := e.store.AddAPIKey(ctx, "admin", api.HashKey(key)); err != nil {
		return "", err
	}
	return key, nil
}

// schemaChecker is a store that can tell whether this binary can work on
// its database (sqlstore.Store.CheckSchema).
type schemaChecker interface{ CheckSchema(context.Context) error }

// Migrate applies pending migrations to the database.
func Migrate(ctx context.Context, database string) error {
	st, err := OpenStore(ctx, database)
	if err != nil {
		return err
	}
	return errors.Join(st.Migrate(ctx), st.Close())
}

// ApplyWorkflow creates a workflow from a JSON or YAML definition, or stores
// a new version when one with that name exists. It returns the workflow id
// and version. An invalid definition is a *client.APIError as the HTTP API
// answers it: code invalid_workflow (422) with a detail per problem, located
// by its JSON path, or invalid_json (400) for text that is not JSON or YAML.
func (e *Engine) ApplyWorkflow(ctx context.Context, definition []byte) (id string, version int, err error) {
	if err := e.usable(); err != nil {
		return "", 0, err
	}
	def, err := spec.Parse(definition, e.limits)
	if err != nil {
		return "", 0, workflowErr(err)
	}
	rec := &store.Workflow{Name: def.Name, Definition: def.Source, Fingerprint: def.Fingerprint(), Enabled: def.Enabled}
	wf, err := e.store.CreateWorkflow(ctx, rec)
	if errors.Is(err, store.ErrConflict) {
		wf, err = e.store.UpdateWorkflow(ctx, def.Name, rec)
	}
	if err != nil {
		return "", 0, workflowErr(err)
	}
	return wf.ID, wf.Version, nil
}

// Trigger starts a run of the workflow named by id or name with a JSON
// input; a repeated idempotency key returns the first run's id. What the
// HTTP API refuses is a *client.APIError with its code: not_found for no
// such workflow, workflow_disabled for a disabled one, invalid_json,
// too_large or invalid_request for the input or key (details[0].path names
// it).
func (e *Engine) Trigger(ctx context.Context, workflow string, input json.RawMessage, idempotencyKey string) (runID string, err error) {
	if err := e.usable(); err != nil {
		return "", err
	}
	if err := checkTrigger(-1, input, idempotencyKey); err != nil {
		return "", err
	}
	if !spec.CleanText(workflow) {
		return "", workflowErr(fmt.Errorf("workflow %q: %w", workflow, store.ErrNotFound)) // no workflow has such a name or id
	}
	run, _, err := e.rt.Trigger(ctx, runtime.TriggerRequest{Workflow: workflow, Input: input, IdempotencyKey: idempotencyKey})
	if err != nil {
		return "", workflowErr(err)
	}
	return run.ID, nil
}

// checkTrigger refuses, as the HTTP API does, an input over 1 MiB
// (too_large), not JSON (UTF-8, RFC 8259) or nested more than
// api.MaxJSONNesting levels deep (invalid_json), and an
// idempotency key the databases cannot index or store as text. It checks
// the batch's item i, or a single trigger when i < 0 (the path then has
// no prefix); the path is built only for an error: a batch's thousand good
// inputs cost none.
func checkTrigger(i int, input json.RawMessage, key string) error {
	path := func(field string) string {
		if i < 0 {
			return field
		}
		return "inputs[" + strconv.Itoa(i) + "]." + field
	}
	switch {
	case len(input) > api.MaxTriggerBody:
		return tooLarge(fmt.Sprintf("%s is over %d bytes", path("input"), api.MaxTriggerBody))
	case len(input) > 0 && !jsonText(input):
		return invalidJSON(path("input"), "the input is not valid JSON")
	case api.NestsTooDeep(input):
		return invalidJSON(path("input"), fmt.Sprintf("%s nests more than %d levels deep", path("input"), api.MaxJSONNesting))
	case !spec.ValidKey(key):
		return invalid(path("idempotency_key"), "an idempotency key is UTF-8 text of at most 255 bytes without control characters (but the tab) or spaces or tabs at its ends")
	}
	return nil
}

// jsonText tells whether b is JSON: valid, and UTF-8 (which json.Valid
// does not check).
func jsonText(b []byte) bool { return utf8.Valid(b) && json.Valid(b) }

// TriggerInput is one run of TriggerBatch.
type TriggerInput struct {
	Input          json.RawMessage // nil is {}
	IdempotencyKey string          // optional
}

// Triggered is one run started (or found) by TriggerBatch.
type Triggered struct {
	RunID   string
	Created bool // false: the idempotency key named an existing run
}

// MaxTriggerBatch is the most runs one TriggerBatch call starts.
const MaxTriggerBatch = runtime.MaxTriggerBatch

// TriggerBatch starts runs of one workflow, one per input, in a single
// transaction (at most MaxTriggerBatch): a backfill costs one commit per
// batch instead of one per run. Results are in input order; a repeated
// idempotency key returns the first run, also within the batch. On an
// error no run was started. An empty batch starts nothing. Errors are
// Trigger's, an input's or key's located at inputs[N]; more than
// MaxTriggerBatch inputs are refused as invalid_request at inputs.
func (e *Engine) TriggerBatch(ctx context.Context, workflow string, inputs []TriggerInput) ([]Triggered, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	if !spec.CleanText(workflow) {
		return nil, workflowErr(fmt.Errorf("workflow %q: %w", workflow, store.ErrNotFound))
	}
	if len(inputs) > MaxTriggerBatch {
		return nil, invalid("inputs", fmt.Sprintf("a batch starts at most %d runs (got %d)", MaxTriggerBatch, len(inputs)))
	}
	reqs := make([]runtime.TriggerRequest, len(inputs))
	for i, in := range inputs {
		if err := checkTrigger(i, in.Input, in.IdempotencyKey); err != nil {
			return nil, err
		}
		reqs[i] = runtime.TriggerRequest{Input: in.Input, IdempotencyKey: in.IdempotencyKey}
	}
	res, err := e.rt.TriggerBatch(ctx, workflow, reqs)
	if err != nil {
		return nil, workflowErr(err)
	}
	out := make([]Triggered, len(res))
	for i, r := range res {
		out[i] = Triggered{RunID: r.Run.ID, Created: r.Created}
	}
	return out, nil
}
