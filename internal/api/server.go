package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/internal/httpwrap"
	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/store"
)

//go:embed openapi.yaml
var openAPI []byte

// OpenAPI returns the OpenAPI document describing this API.
func OpenAPI() []byte { return openAPI }

// MaxTriggerBody and MaxWebhookBody bound request bodies.
const (
	MaxTriggerBody = 1 << 20
	// MaxTriggerBatchBody bounds a trigger-batch request (each input is
	// still at most MaxTriggerBody).
	MaxTriggerBatchBody = 16 << 20
	MaxWebhookBody      = 1 << 20
)

// Config wires the server.
type Config struct {
	Store   store.Store
	Runtime *runtime.Runtime
	Limits  spec.Limits
	Logger  *slog.Logger
	// Metrics serves GET /metrics (Prometheus), behind the API key; nil
	// answers 404.
	Metrics http.Handler
}

// Server serves the HTTP API.
type Server struct {
	st      store.Store
	rt      *runtime.Runtime
	limits  spec.Limits
	log     *slog.Logger
	mux     *http.ServeMux
	metrics http.Handler

	keyMu sync.RWMutex
	keys  map[string]time.Time // verified key hashes, and when
	// keyTTL is keyRecheck (tests shorten it).
	keyTTL time.Duration
}

// New builds the API server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Limits == (spec.Limits{}) {
		cfg.Limits = spec.DefaultLimits
	}
	s := &Server{st: cfg.Store, rt: cfg.Runtime, limits: cfg.Limits, log: cfg.Logger, mux: http.NewServeMux(), metrics: cfg.Metrics, keys: map[string]time.Time{}, keyTTL: keyRecheck}
	s.routes()
	return s
}

// Routes lists every route as "METHOD /pattern"; tests compare it with the
// OpenAPI document.
var Routes = []string{
	"GET /healthz",
	"GET /metrics",
	"GET /openapi.yaml",
	"POST /wh/{token}",
	"POST /api/v1/workflows",
	"GET /api/v1/workflows",
	"GET /api/v1/workflows/{id}",
	"PUT /api/v1/workflows/{id}",
	"DELETE /api/v1/workflows/{id}",
	"POST /api/v1/workflows/{id}/trigger",
	"POST /api/v1/workflows/{id}/trigger-batch",
	"GET /api/v1/workflows/{id}/runs",
	"GET /api/v1/workflows/{id}/runs/{run_id}",
	"POST /api/v1/workflows/{id}/runs/{run_id}/cancel",
	"GET /api/v1/runs/{run_id}",
	"POST /api/v1/runs/{run_id}/cancel",
	"GET /api/v1/runs/{run_id}/events",
	"POST /api/v1/tasks",
	"POST /api/v1/tasks/claim",
	"POST /api/v1/tasks/complete",
	"GET /api/v1/tasks/{id}",
	"POST /api/v1/tasks/{id}/cancel",
	"POST /api/v1/tasks/{id}/heartbeat",
	"POST /api/v1/tasks/{id}/complete",
	"POST /api/v1/tasks/{id}/fail",
	"GET /api/v1/tasks/{id}/events",
	"GET /api/v1/task-types",
	"GET /api/v1/task-types/{type}",
	"PUT /api/v1/task-types/{type}",
}

func (s *Server) routes() {
	h := map[string]http.HandlerFunc{
		"GET /healthz":                                     s.healthz,
		"GET /metrics":                                     s.auth(s.serveMetrics),
		"GET /openapi.yaml":                                s.openapi,
		"POST /wh/{token}":                                 s.webhook,
		"POST /api/v1/workflows":                           s.auth(s.createWorkflow),
		"GET /api/v1/workflows":                            s.auth(s.listWorkflows),
		"GET /api/v1/workflows/{id}":                       s.auth(s.getWorkflow),
		"PUT /api/v1/workflows/{id}":                       s.auth(s.updateWorkflow),
		"DELETE /api/v1/workflows/{id}":                    s.auth(s.deleteWorkflow),
		"POST /api/v1/workflows/{id}/trigger":              s.auth(s.trigger),
		"POST /api/v1/workflows/{id}/trigger-batch":        s.auth(s.triggerBatch),
		"GET /api/v1/workflows/{id}/runs":                  s.auth(s.listRuns),
		"GET /api/v1/workflows/{id}/runs/{run_id}":         s.auth(s.getRun),
		"POST /api/v1/workflows/{id}/runs/{run_id}/cancel": s.auth(s.cancelRun),
		"GET /api/v1/runs/{run_id}":                        s.auth(s.getRun),
		"POST /api/v1/runs/{run_id}/cancel":                s.auth(s.cancelRun),
		"GET /api/v1/runs/{run_id}/events":                 s.auth(s.listEvents),
		"POST /api/v1/tasks":                               s.auth(s.createTask),
		"POST /api/v1/tasks/claim":                         s.auth(s.claimTasks),
		"POST /api/v1/tasks/complete":                      s.auth(s.completeTasks),
		"GET /api/v1/tasks/{id}":                           s.auth(s.getTask),
		"POST /api/v1/tasks/{id}/cancel":                   s.auth(s.cancelTask),
		"POST /api/v1/tasks/{id}/heartbeat":                s.auth(s.heartbeat),
		"POST /api/v1/tasks/{id}/complete":                 s.auth(s.completeTask),
		"POST /api/v1/tasks/{id}/fail":                     s.auth(s.failTask),
		"GET /api/v1/tasks/{id}/events":                    s.auth(s.taskEvents),
		"GET /api/v1/task-types":                           s.auth(s.listTaskTypes),
		"GET /api/v1/task-types/{type}":                    s.auth(s.getTaskType),
		"PUT /api/v1/task-types/{type}":                    s.auth(s.putTaskType),
	}
	for _, r := range Routes {
		s.mux.HandleFunc(r, h[r])
	}
	// Anything else under the API is a JSON 404, not the mux's text page.
	s.mux.HandleFunc("/api/", s.auth(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, CodeNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
	}))
	// And outside it (callbacks, the system endpoints): a JSON 405 for a
	// path one of them takes with another method, else a JSON 404. With
	// a pattern for every path, the mux no longer answers either itself
	// (as text: a callback sender or a probe got "page not found").
	s.mux.HandleFunc("/", s.elsewhere)
}

// elsewhere answers a request outside /api/ that no route takes.
func (s *Server) elsewhere(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "/" && pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, r.Method+" "+httpwrap.RedactPath(r.URL.Path)+": use "+strings.Join(allow, " or "))
		return
	}
	writeError(w, http.StatusNotFound, CodeNotFound, "no such endpoint: "+r.Method+" "+httpwrap.RedactPath(r.URL.Path))
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// No id, token or name is anything but UTF-8 text without NUL; the
	// databases would refuse to compare with one (Postgres: a 500).
	if !spec.CleanText(r.URL.Path) {
		writeError(w, http.StatusNotFound, CodeNotFound, "no such resource")
		return
	}
	if p, ok := lowerIDs(r.URL.Path); ok {
		// Ids are UUIDs, which are case-insensitive (RFC 9562): one
		// copied in upper case (some tools print them so) names the same
		// run or task. Names cannot be UUIDs (spec), tokens are not.
		r.URL.Path = p
		if r.URL.RawPath != "" {
			r.URL.RawPath, _ = lowerIDs(r.URL.RawPath)
		}
	}
	if cleanPath(r.URL.Path) != r.URL.Path {
		// The mux would answer with an HTML redirect to the cleaned path,
		// which names another resource: /api/v1/workflows//runs (an empty
		// id) is not /api/v1/workflows/runs.
		writeError(w, http.StatusNotFound, CodeNotFound, "no such resource: the path has an empty segment, . or ..")
		return
	}
	s.mux.ServeHTTP(w, r)
}

// lowerIDs is p with every segment that is a UUID written with upper-case
// letters in lower case, and whether there was one.
func lowerIDs(p string) (string, bool) {
	if strings.IndexFunc(p, func(c rune) bool { return c >= 'A' && c <= 'F' }) < 0 {
		return p, false // the common case: nothing to do
	}
	segs := strings.Split(p, "/")
	changed := false
	for i, seg := range segs {
		if len(seg) == 36 && seg != strings.ToLower(seg) && isRunID(strings.ToLower(seg)) {
			segs[i] = strings.ToLower(seg)
			changed = true
		}
	}
	if !changed {
		return p, false
	}
	return strings.Join(segs, "/"), true
}

// cleanPath is p as http.ServeMux cleans it before routing: one slash
// between segments, no . or .., a trailing slash kept.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// MaxJSONNesting bounds how deeply a run's input (a trigger body) nests,
// and how deeply a callback payload may nest to be answered as JSON. A run
// is answered with them 2 to 4 levels down (data.input,
// data.tasks.<step>.body), and encoding/json (here, and in clients) reads
// and writes at most 10,000 levels: a trigger body of 10,000 levels was
// started, and its run was answered 200 with an empty body ever after.
const MaxJSONNesting = 1000

// nestsTooDeep says whether the JSON text b nests its arrays and objects
// more than MaxJSONNesting levels. Every trigger and every read of a run
// asks, so it stops at the first level past the limit, and text too
// short to hold that many brackets is not scanned at all.
func nestsTooDeep(b []byte) bool { return NestsTooDeep(b) }

// NestsTooDeep is nestsTooDeep, for the embedded engine's triggers (package
// ferry), which refuse what the HTTP API refuses.
func NestsTooDeep(b []byte) bool {
	if len(b) <= 2*MaxJSONNesting {
		return false
	}
	depth, inString := 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			if depth++; depth > MaxJSONNesting {
				return true
			}
		case ']', '}':
			depth--
		}
	}
	return false
}

// MaxIdempotencyKey bounds idempotency keys (they are indexed).
const MaxIdempotencyKey = 255

// checkIdempotencyKey names what is wrong with an idempotency key, or
// returns "".
func checkIdempotencyKey(k string) string {
	switch {
	case len(k) > MaxIdempotencyKey:
		return fmt.Sprintf("an idempotency key must be at most %d bytes", MaxIdempotencyKey)
	case !spec.ValidKey(k):
		return "an idempotency key must be UTF-8 text without control characters (but the tab) or spaces or tabs at its ends"
	}
	return ""
}

// HashKey is how API keys are stored: SHA-256, hex.
func HashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

func (s *Server) auth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := bearerKey(r.Header.Get("Authorization"))
		if key == "" {
			unauthorized(w, "missing API key: send Authorization: Bearer <key>")
			return
		}
		good, err := s.checkKey(r.Context(), key)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		if !good {
			unauthorized(w, "invalid API key")
			return
		}
		next(w, r)
	}
}

// unauthorized answers 401 with the challenge HTTP requires of one
// (RFC 9110 section 15.5.2), which HTTP clients read to know what to send.
func unauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
	writeError(w, http.StatusUnauthorized, CodeUnauthorized, msg)
}

// bearerKey is the key an Authorization header carries, "" for none:
// the scheme is "Bearer" in any case (RFC 9110 section 11.1: "bearer"
// was refused as no key at all), then one or more spaces (RFC 6750).
func bearerKey(h string) string {
	scheme, key, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimLeft(key, " ")
}

// keyRecheck is how long a verified key is taken as valid before the
// database is asked again: a key whose row was deleted (how a key is
// revoked) stops working within it, on every server.
const keyRecheck = 30 * time.Second

func (s *Server) checkKey(ctx context.Context, key string) (bool, error) {
	hash := HashKey(key)
	s.keyMu.RLock()
	for k, at := range s.keys {
		if subtle.ConstantTimeCompare([]byte(k), []byte(hash)) == 1 && time.Since(at) < s.keyTTL {
			s.keyMu.RUnlock()
			return true, nil
		}
	}
	s.keyMu.RUnlock()
	ok, err := s.st.APIKeyExists(ctx, hash)
	s.keyMu.Lock()
	defer s.keyMu.Unlock()
	if err != nil || !ok {
		if err == nil {
			delete(s.keys, hash) // revoked
		}
		return false, err
	}
	s.keys[hash] = time.Now()
	return true, nil
}

// writeStopper is a store that can stop writing for good (SQLite after a
// failed sync: sqlstore.Store.WriteError).
type writeStopper interface{ WriteError() error }

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if _, err := s.st.HasAPIKeys(ctx); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "unavailable", "error": "database unreachable"})
		return
	}
	if ws, ok := s.st.(writeStopper); ok {
		if err := ws.WriteError(); err != nil {
			// Reads still answer, but no write will until a restart.
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "unavailable", "error": "database not writable: " + err.Error()})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "database": s.st.Dialect()})
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if s.metrics == nil {
		writeError(w, http.StatusNotFound, CodeNotFound, "metrics are not served by this server")
		return
	}
	s.metrics.ServeHTTP(w, r)
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(openAPI)
}

// readBody reads at most limit bytes; a larger body is a 413.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("request body exceeds %d bytes", limit))
		} else {
			writeError(w, http.StatusBadRequest, CodeInvalidJSON, "could not read request body")
		}
		return nil, false
	}
	return b, true
}

// readObject is readBody for a JSON object: an empty body reads as {}.
// JSON is UTF-8 (RFC 8259): other bytes are refused, not stored to be
// answered back as they came (or, on Postgres, refused by the database,
// failing the writes batched with them).
func readObject(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	b, ok := readBody(w, r, limit)
	if !ok {
		return nil, false
	}
	if !utf8.Valid(b) {
		msg := "request body is not UTF-8 text"
		writeError(w, http.StatusBadRequest, CodeInvalidJSON, msg, spec.FieldError{Path: "", Code: CodeInvalidJSON, Message: msg})
		return nil, false
	}
	if len(bytes.TrimSpace(b)) == 0 {
		b = []byte("{}")
	}
	return b, true
}

// page reads a list's page parameters. cursor is a next_cursor of that
// list when valid says so: a cursor of another list or a made-up one
// is refused, not read as a position (a workflow name given to a run
// list answered its first page again, a run id given to the workflow
// list its end).
func page(w http.ResponseWriter, r *http.Request, valid func(cursor string) bool) (store.Page, bool) {
	p := store.Page{Cursor: r.URL.Query().Get("cursor")}
	if len(p.Cursor) > 255 || !spec.CleanText(p.Cursor) || (p.Cursor != "" && !valid(p.Cursor)) {
		writeError(w, http.StatusBadRequest, CodeInvalidParameter, "cursor must be a next_cursor this list returned",
			spec.FieldError{Path: "cursor", Code: CodeInvalidParameter, Message: "not a cursor of this list"})
		return p, false
	}
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 500 {
			writeError(w, http.StatusBadRequest, CodeInvalidParameter, "limit must be a whole number from 1 to 500",
				spec.FieldError{Path: "limit", Code: CodeInvalidParameter, Message: "limit must be 1..500"})
			return p, false
		}
		p.Limit = n
	}
	return p, true
}

// isRunID tells whether s is a run id as runs are given theirs: a UUID in
// its lower-case canonical form (the run list's cursors are run ids).
func isRunID(s string) bool {
	u, err := uuid.Parse(s)
	return err == nil && u.String() == s
}

func writeList(w http.ResponseWriter, items any, next string) {
	body := map[string]any{"data": items}
	if next != "" {
		body["next_cursor"] = next
	} else {
		body["next_cursor"] = nil
	}
	writeJSON(w, http.StatusOK, body)
}

// ---- workflows ----

func (s *Server) parseDefinition(w http.ResponseWriter, r *http.Request) (*spec.Workflow, bool) {
	limit := int64(s.limits.MaxBytes)
	if limit <= 0 {
		limit = int64(spec.DefaultLimits.MaxBytes)
	}
	// Read one byte past the limit so spec.Parse reports the size as a
	// validation error (422 too_large) without reading an unbounded body.
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidJSON, "could not read request body")
		return nil, false
	}
	def, err := spec.Parse(b, s.limits)
	if err != nil {
		var ve *spec.ValidationError
		if errors.As(err, &ve) && len(ve.Errors) == 1 && ve.Errors[0].Code == spec.CodeInvalidJSON {
			writeError(w, http.StatusBadRequest, CodeInvalidJSON, ve.Errors[0].Message, ve.Errors...)
			return nil, false
		}
		s.writeErr(w, r, err)
		return nil, false
	}
	return def, true
}

func (s *Server) createWorkflow(w http.ResponseWriter, r *http.Request) {
	def, ok := s.parseDefinition(w, r)
	if !ok {
		return
	}
	wf, err := s.st.CreateWorkflow(r.Context(), &store.Workflow{Name: def.Name, Definition: def.Source, Fingerprint: def.Fingerprint(), Enabled: def.Enabled})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeData(w, http.StatusCreated, workflowJSON(wf, def, false))
}

func (s *Server) updateWorkflow(w http.ResponseWriter, r *http.Request) {
	def, ok := s.parseDefinition(w, r)
	if !ok {
		return
	}
	wf, err := s.st.UpdateWorkflow(r.Context(), r.PathValue("id"), &store.Workflow{Name: def.Name, Definition: def.Source, Fingerprint: def.Fingerprint(), Enabled: def.Enabled})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if !bytes.Equal(wf.Definition, def.Source) {
		// An equivalent definition kept the version, and with it the text
		// first submitted: the answer is what a read shows.
		if def, err = s.loadDef(r.Context(), wf); err != nil {
			s.writeErr(w, r, err)
			return
		}
	}
	writeData(w, http.StatusOK, workflowJSON(wf, def, true))
}

func (s *Server) loadDef(ctx context.Context, wf *store.Workflow) (*spec.Workflow, error) {
	return s.rt.Definition(ctx, wf.ID, wf.Version)
}

func (s *Server) getWorkflow(w http.ResponseWriter, r *http.Request) {
	wf, err := s.st.GetWorkflow(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	def, err := s.loadDef(r.Context(), wf)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeData(w, http.StatusOK, workflowJSON(wf, def, true))
}

func (s *Server) listWorkflows(w http.ResponseWriter, r *http.Request) {
	p, ok := page(w, r, spec.ValidName)
	if !ok {
		return
	}
	wfs, next, err := s.st.ListWorkflows(r.Context(), p)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]any, 0, len(wfs))
	for _, wf := range wfs {
		def, err := s.loadDef(r.Context(), wf)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		out = append(out, workflowJSON(wf, def, false))
	}
	writeList(w, out, next)
}

func (s *Server) deleteWorkflow(w http.ResponseWriter, r *http.Request) {
	if err := s.st.DeleteWorkflow(r.Context(), r.PathValue("id")); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ---- runs ----

// Headers that carry credentials are not exposed to templates as
// trigger.headers.
var privateHeaders = map[string]bool{"Authorization": true, "Cookie": true, "Proxy-Authorization": true}

func (s *Server) trigger(w http.ResponseWriter, r *http.Request) {
	b, ok := readObject(w, r, MaxTriggerBody)
	if !ok {
		return
	}
	if !json.Valid(b) {
		var v any
		err := json.Unmarshal(b, &v)
		writeError(w, http.StatusBadRequest, CodeInvalidJSON, "trigger body must be JSON", spec.FieldError{Path: "", Code: CodeInvalidJSON, Message: err.Error()})
		return
	}
	if nestsTooDeep(b) {
		msg := fmt.Sprintf("trigger body nests more than %d levels deep", MaxJSONNesting)
		writeError(w, http.StatusBadRequest, CodeInvalidJSON, msg, spec.FieldError{Path: "", Code: CodeInvalidJSON, Message: msg})
		return
	}
	if msg := checkIdempotencyKey(r.Header.Get("Idempotency-Key")); msg != "" {
		badField(w, "Idempotency-Key", msg)
		return
	}
	var compact bytes.Buffer
	_ = json.Compact(&compact, b)
	run, created, err := s.rt.Trigger(r.Context(), runtime.TriggerRequest{
		Workflow: r.PathValue("id"), Input: compact.Bytes(), Headers: triggerHeaders(r),
		IdempotencyKey: r.Header.Get("Idempotency-Key"),
	})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	code := http.StatusCreated
	if !created {
		code = http.StatusOK
	}
	writeData(w, code, triggeredJSON(run))
}

// triggerHeaders are the request's headers a run records, but for
// credentials.
func triggerHeaders(r *http.Request) map[string]string {
	headers := map[string]string{}
	for k, v := range r.Header {
		if !privateHeaders[k] && len(v) > 0 {
			headers[k] = v[0]
		}
	}
	return headers
}

func triggeredJSON(run *store.Run) map[string]any {
	return map[string]any{
		"run_id": run.ID, "workflow_id": run.WorkflowID, "version": run.Version,
		"status": run.Status, "started_at": run.StartedAt.UTC(),
	}
}

// triggerBatch starts up to runtime.MaxTriggerBatch runs of one workflow in
// one transaction: {"runs": [{"input": …, "idempotency_key": "…"}, …]}.
func (s *Server) triggerBatch(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Runs []json.RawMessage `json:"runs"`
	}
	if !decodeStrictLimit(w, r, &body, MaxTriggerBatchBody) {
		return
	}
	if len(body.Runs) == 0 || len(body.Runs) > runtime.MaxTriggerBatch {
		badField(w, "runs", fmt.Sprintf("runs must be an array of 1 to %d runs (got %d)", runtime.MaxTriggerBatch, len(body.Runs)))
		return
	}
	if r.Header.Get("Idempotency-Key") != "" {
		badField(w, "", "the Idempotency-Key header applies to single triggers: give each item of runs an idempotency_key")
		return
	}
	headers := triggerHeaders(r)
	size := 0
	for k, v := range headers {
		size += len(k) + len(v)
	}
	if size*len(body.Runs) > MaxTriggerBatchBody {
		msg := fmt.Sprintf("the request headers (%d bytes), stored with each of %d runs, are over %d bytes in all", size, len(body.Runs), MaxTriggerBatchBody)
		writeError(w, http.StatusRequestEntityTooLarge, CodeTooLarge, msg, spec.FieldError{Path: "", Code: CodeTooLarge, Message: msg})
		return
	}
	reqs := make([]runtime.TriggerRequest, len(body.Runs))
	for i, raw := range body.Runs {
		path := fmt.Sprintf("runs[%d]", i)
		if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			badField(w, path, path+" must be an object with input and idempotency_key")
			return
		}
		var item struct {
			Input          json.RawMessage `json:"input"`
			IdempotencyKey string          `json:"idempotency_key"`
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&item); err != nil {
			msg := path + " must be an object with input and idempotency_key"
			if field, problem, _ := fieldProblem(err); field != "" {
				msg = path + ": " + problem
				path += "." + field
			}
			badField(w, path, msg)
			return
		}
		if msg := checkIdempotencyKey(item.IdempotencyKey); msg != "" {
			badField(w, path+".idempotency_key", path+".idempotency_key: "+msg)
			return
		}
		input := []byte("{}")
		if len(item.Input) > 0 {
			if len(item.Input) > MaxTriggerBody {
				msg := fmt.Sprintf("%s.input is over %d bytes", path, MaxTriggerBody)
				writeError(w, http.StatusRequestEntityTooLarge, CodeTooLarge, msg, spec.FieldError{Path: path + ".input", Code: CodeTooLarge, Message: msg})
				return
			}
			if nestsTooDeep(item.Input) {
				badField(w, path+".input", fmt.Sprintf("%s.input nests more than %d levels deep", path, MaxJSONNesting))
				return
			}
			var compact bytes.Buffer
			_ = json.Compact(&compact, item.Input)
			input = compact.Bytes()
		}
		reqs[i] = runtime.TriggerRequest{Input: input, Headers: headers, IdempotencyKey: item.IdempotencyKey}
	}
	res, err := s.rt.TriggerBatch(r.Context(), r.PathValue("id"), reqs)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	code := http.StatusOK
	out := make([]any, len(res))
	for i, t := range res {
		o := triggeredJSON(t.Run)
		o["created"] = t.Created
		out[i] = o
		if t.Created {
			code = http.StatusCreated
		}
	}
	writeData(w, code, map[string]any{"runs": out})
}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	p, ok := page(w, r, isRunID)
	if !ok {
		return
	}
	wf, err := s.st.GetWorkflow(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	runs, next, err := s.st.ListRuns(r.Context(), wf.ID, p)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]any, 0, len(runs))
	for _, run := range runs {
		out = append(out, runJSON(run, nil, s.rt))
	}
	writeList(w, out, next)
}

// runFor loads a run; under /workflows/{id}/runs the run must belong to that
// workflow.
func (s *Server) runFor(w http.ResponseWriter, r *http.Request) (*store.Run, []*store.StepRun, bool) {
	run, steps, err := s.st.GetRun(r.Context(), r.PathValue("run_id"))
	if err != nil {
		s.writeErr(w, r, err)
		return nil, nil, false
	}
	if ref := r.PathValue("id"); ref != "" && ref != run.WorkflowID {
		// An id names one workflow forever (its runs stay readable after
		// it is deleted); a name, the live workflow that has it now: a run
		// of a deleted workflow whose name was taken again is not the new
		// one's.
		wf, err := s.st.GetWorkflow(r.Context(), ref)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			s.writeErr(w, r, err)
			return nil, nil, false
		}
		if wf == nil || wf.ID != run.WorkflowID {
			writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("run %q does not belong to workflow %q", run.ID, ref))
			return nil, nil, false
		}
	}
	return run, steps, true
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request) {
	run, steps, ok := s.runFor(w, r)
	if !ok {
		return
	}
	writeData(w, http.StatusOK, runJSON(run, steps, s.rt))
}

func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request) {
	if _, _, ok := s.runFor(w, r); !ok {
		return
	}
	if _, err := s.rt.Cancel(r.Context(), r.PathValue("run_id")); err != nil {
		s.writeErr(w, r, err)
		return
	}
	run, steps, err := s.st.GetRun(r.Context(), r.PathValue("run_id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeData(w, http.StatusOK, runJSON(run, steps, s.rt))
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) {
	if _, _, ok := s.runFor(w, r); !ok {
		return
	}
	s.events(w, r, r.PathValue("run_id"), "run_id")
}

// events lists a run's or a task's events after ?after=<seq>.
func (s *Server) events(w http.ResponseWriter, r *http.Request, subject, subjectKey string) {
	after := int64(0)
	if a := r.URL.Query().Get("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, CodeInvalidParameter, "after must be a non-negative sequence number",
				spec.FieldError{Path: "after", Code: CodeInvalidParameter, Message: "not a sequence number"})
			return
		}
		after = n
	}
	evs, err := s.st.ListEvents(r.Context(), subject, after, 1000)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeData(w, http.StatusOK, eventsJSON(evs, subjectKey))
}

// eventsJSON renders events with the subject under its own name (run_id or
// task_id): both share one append-only log.
func eventsJSON(evs []*store.Event, subjectKey string) []any {
	out := make([]any, 0, len(evs))
	for _, e := range evs {
		o := &ordered{}
		o.set(subjectKey, e.RunID)
		o.set("seq", e.Seq)
		o.set("type", e.Type)
		if e.Step != "" {
			o.set("step", e.Step)
		}
		if e.Data != nil {
			o.set("data", e.Data)
		}
		o.set("at", e.At)
		out = append(out, o)
	}
	return out
}

// ---- webhook callbacks ----

func (s *Server) webhook(w http.ResponseWriter, r *http.Request) {
	b, ok := readBody(w, r, MaxWebhookBody)
	if !ok {
		return
	}
	headers := map[string]string{}
	for k, v := range r.Header {
		if !privateHeaders[k] && len(v) > 0 {
			headers[k] = v[0]
		}
	}
	if err := s.rt.DeliverWebhook(r.Context(), r.PathValue("token"), b, headers); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			writeError(w, http.StatusNotFound, CodeNotFound, "unknown callback token")
			return
		}
		s.writeErr(w, r, err)
		return
	}
	writeData(w, http.StatusAccepted, map[string]any{"status": "accepted"})
}
