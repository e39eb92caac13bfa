package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/store"
)

// MaxTaskBody bounds task requests (payloads and results).
const MaxTaskBody = 1 << 20

// decodeStrict reads a JSON object into v, rejecting unknown fields and
// wrong types with a 400 that names the field.
func decodeStrict(w http.ResponseWriter, r *http.Request, v any) bool {
	return decodeStrictLimit(w, r, v, MaxTaskBody)
}

func decodeStrictLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) bool {
	b, ok := readObject(w, r, limit)
	if !ok {
		return false
	}
	if fe := decodeStrictBytes(b, v, ""); fe != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, fe.Message, *fe)
		return false
	}
	return true
}

// decodeStrictBytes decodes the JSON object b into v as decodeStrict
// does, and names what is wrong with it under the path prefix ("" for the
// body; "completions[2]" for an item of it), or returns nil.
func decodeStrictBytes(b []byte, v any, prefix string) *spec.FieldError {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// Nothing may follow the object (More is false before a stray
		// } or ]).
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("unexpected data after the JSON object")
		}
	}
	if err == nil {
		// A string with NUL ("\u0000") decodes, but no database stores
		// it as text (Postgres refuses it, failing the writes batched
		// with it).
		field, found := nulField(reflect.ValueOf(v))
		if !found {
			return nil
		}
		if prefix != "" {
			field = prefix + "." + field
		}
		return &spec.FieldError{Path: field, Code: CodeInvalidRequest, Message: field + " must not contain NUL (\\u0000)"}
	}
	path, msg := "", err.Error()
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	field, problem, unknown := fieldProblem(err)
	switch {
	case field != "":
		path, msg = field, problem
	case errors.As(err, &te):
		msg = "request body must be a JSON object"
		if prefix != "" {
			msg = prefix + " must be a JSON object"
		}
	case errors.As(err, &se):
		msg = fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		msg = "truncated JSON"
	}
	switch {
	case prefix == "":
	case path == "":
		path = prefix
	case unknown: // `unknown field "extra"`
		path = prefix + "." + path
		msg += " in " + prefix
	default: // "lease_token must be a string"
		path = prefix + "." + path
		msg = prefix + "." + msg
	}
	return &spec.FieldError{Path: path, Code: CodeInvalidRequest, Message: msg}
}

// nulField is the JSON path of the first decoded string in v holding NUL,
// if any. The path is built only for what is found: the walk runs for
// every request. Raw JSON fields are not looked into (stored as JSON
// text, NUL stays escaped), nor fields tagged nul:"clean" (their handler
// replaces NUL).
func nulField(v reflect.Value) (string, bool) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return nulField(v.Elem())
		}
	case reflect.String:
		return "", strings.IndexByte(v.String(), 0) >= 0
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" || f.Tag.Get("nul") == "clean" {
				continue
			}
			if p, ok := nulField(v.Field(i)); ok {
				if name == "" {
					name = f.Name
				}
				return join(name, p), true
			}
		}
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return "", false // bytes: json.RawMessage
		}
		for i := range v.Len() {
			if p, ok := nulField(v.Index(i)); ok {
				return join(fmt.Sprintf("[%d]", i), p), true
			}
		}
	case reflect.Map:
		iter := v.MapRange()
		for iter.Next() {
			k := fmt.Sprint(iter.Key().Interface())
			if strings.IndexByte(k, 0) >= 0 {
				return k, true
			}
			if p, ok := nulField(iter.Value()); ok {
				return join(k, p), true
			}
		}
	}
	return "", false
}

// join is the path of rest under name: "a" and "b" → "a.b", "a" and
// "[1].b" → "a[1].b".
func join(name, rest string) string {
	switch {
	case rest == "":
		return name
	case strings.HasPrefix(rest, "["):
		return name + rest
	}
	return name + "." + rest
}

// fieldProblem names the field of an object that a strict decode failed
// on (a wrong type or an unknown field) and what is wrong with it; field
// is "" when the error is not about one field.
func fieldProblem(err error) (field, problem string, unknown bool) {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return te.Field, fmt.Sprintf("%s must be %s", te.Field, jsonKind(te.Type.Kind().String())), false
	}
	if msg := err.Error(); strings.HasPrefix(msg, "json: unknown field ") {
		field = strings.Trim(strings.TrimPrefix(msg, "json: unknown field "), `"`)
		return field, fmt.Sprintf("unknown field %q", field), true
	}
	return "", "", false
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "int", "int64", "float64":
		return "a number"
	case "bool":
		return "true or false"
	case "slice":
		return "an array"
	}
	return "a " + k
}

func badField(w http.ResponseWriter, path, msg string) {
	writeError(w, http.StatusBadRequest, CodeInvalidRequest, msg, spec.FieldError{Path: path, Code: CodeInvalidRequest, Message: msg})
}

func (s *Server) taskJSON(r *http.Request, t *store.Task) any {
	maxAttempts, delay := s.rt.TaskDefaults(r.Context(), t)
	o := &ordered{}
	o.set("id", t.ID)
	o.set("type", t.Type)
	o.set("status", t.Status)
	o.set("payload", t.Payload)
	o.set("priority", t.Priority)
	o.set("run_at", t.RunAt.UTC())
	o.set("attempt", t.Attempt)
	o.set("max_attempts", maxAttempts)
	o.set("retry_delay", spec.FormatDuration(delay))
	if t.IdempotencyKey != "" {
		o.set("idempotency_key", t.IdempotencyKey)
	} else {
		o.set("idempotency_key", nil)
	}
	o.set("leased_by", nullable(t.LeasedBy))
	o.set("lease_until", utc(t.LeaseUntil))
	o.set("cancel_requested", t.CancelRequested)
	o.set("result", t.Result)
	o.set("last_error", nullable(t.LastError))
	o.set("run_id", nullable(t.RunID))
	o.set("step", nullable(t.Step))
	o.set("created_at", t.CreatedAt.UTC())
	o.set("updated_at", t.UpdatedAt.UTC())
	o.set("finished_at", utc(t.FinishedAt))
	return o
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// given reports whether an optional field was set: absent and null both
// mean "use the default", so that what GET shows (null for an unset
// retry_delay) can be sent back with PUT.
func given(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

type createTaskRequest struct {
	Type           string          `json:"type"`
	Payload        json.RawMessage `json:"payload"`
	Priority       *int            `json:"priority"`
	RunAt          json.RawMessage `json:"run_at"`
	IdempotencyKey string          `json:"idempotency_key"`
	MaxAttempts    int             `json:"max_attempts"`
	RetryDelay     json.RawMessage `json:"retry_delay"`
}

func (s *Server) createTask(w http.ResponseWriter, r *http.Request) {
	var req createTaskRequest
	if !decodeStrict(w, r, &req) {
		return
	}
	switch {
	case req.Type == "":
		badField(w, "type", "type is required")
		return
	case !spec.ValidTaskType(req.Type):
		badField(w, "type", fmt.Sprintf("type %q must be a versioned name like \"billing.invoice.v1\"", req.Type))
		return
	case req.Priority != nil && (*req.Priority < 0 || *req.Priority > 1000):
		badField(w, "priority", "priority must be from 0 to 1000 (lower runs first)")
		return
	case req.MaxAttempts < 0 || req.MaxAttempts > 100:
		badField(w, "max_attempts", "max_attempts must be from 1 to 100")
		return
	}
	if msg := checkIdempotencyKey(req.IdempotencyKey); msg != "" {
		badField(w, "idempotency_key", msg)
		return
	}
	if len(req.Payload) > 0 && !json.Valid(req.Payload) {
		badField(w, "payload", "payload must be JSON")
		return
	}
	nt := runtime.NewTask{Type: req.Type, Payload: req.Payload, Priority: req.Priority, IdempotencyKey: req.IdempotencyKey, MaxAttempts: req.MaxAttempts}
	if given(req.RunAt) {
		var at time.Time
		if err := json.Unmarshal(req.RunAt, &at); err != nil {
			badField(w, "run_at", `run_at must be an RFC 3339 time like "2026-03-01T09:00:00Z"`)
			return
		}
		if at.After(runtime.MaxRunAt) {
			badField(w, "run_at", "run_at must be no later than 9999-12-31T23:59:59.999999Z")
			return
		}
		nt.RunAt = &at
	}
	if given(req.RetryDelay) {
		d, err := spec.DurationFromJSON(req.RetryDelay, time.Second)
		if err != nil || d < time.Millisecond {
			badField(w, "retry_delay", "retry_delay must be a duration of at least 1ms, like \"30s\", or seconds as a number")
			return
		}
		nt.RetryDelay = d
	}
	t, created, err := s.rt.CreateTask(r.Context(), nt)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	code := http.StatusCreated
	if !created {
		code = http.StatusOK
	}
	writeData(w, code, s.taskJSON(r, t))
}

func (s *Server) getTask(w http.ResponseWriter, r *http.Request) {
	t, err := s.st.GetTask(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeData(w, http.StatusOK, s.taskJSON(r, t))
}

func (s *Server) cancelTask(w http.ResponseWriter, r *http.Request) {
	t, err := s.rt.CancelTask(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeData(w, http.StatusOK, s.taskJSON(r, t))
}

func (s *Server) taskEvents(w http.ResponseWriter, r *http.Request) {
	if _, err := s.st.GetTask(r.Context(), r.PathValue("id")); err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.events(w, r, r.PathValue("id"), "task_id")
}

type claimRequest struct {
	Types        []string `json:"types"`
	WorkerID     string   `json:"worker_id"`
	LeaseSeconds float64  `json:"lease_seconds"`
	Max          int      `json:"max"`
	WaitSeconds  float64  `json:"wait_seconds"`
}

func (s *Server) claimTasks(w http.ResponseWriter, r *http.Request) {
	var req claimRequest
	if !decodeStrict(w, r, &req) {
		return
	}
	rq, ok := req.check(w, "")
	if !ok {
		return
	}
	ts, err := s.rt.ClaimTasks(r.Context(), rq)
	if err != nil {
		s.writeErr(w, r, err) // (a worker gone: StatusClientClosed)
		return
	}
	if r.Context().Err() != nil {
		// The worker hung up while we claimed: give the tasks back rather
		// than leave them leased to nobody until the lease ends.
		s.rt.ReleaseTasks(context.WithoutCancel(r.Context()), ts)
		w.WriteHeader(StatusClientClosed)
		return
	}
	writeData(w, http.StatusOK, s.claimedJSON(r, ts))
}

// check validates the claim, naming bad fields under prefix.
func (req *claimRequest) check(w http.ResponseWriter, prefix string) (runtime.ClaimRequest, bool) {
	// Checked as given: a fraction of a second would round to no lease,
	// which means the default.
	if req.LeaseSeconds != 0 && (req.LeaseSeconds < 1 || req.LeaseSeconds > 3600) {
		badField(w, prefix+"lease_seconds", "lease_seconds must be from 1 to 3600")
		return runtime.ClaimRequest{}, false
	}
	rq := runtime.ClaimRequest{
		Types: req.Types, WorkerID: req.WorkerID, Max: req.Max,
		Lease: time.Duration(req.LeaseSeconds * float64(time.Second)),
		Wait:  time.Duration(req.WaitSeconds * float64(time.Second)),
	}
	if fe := runtime.CheckClaim(&rq); fe != nil {
		badField(w, prefix+fe.Path, fe.Msg)
		return rq, false
	}
	return rq, true
}

func (s *Server) claimedJSON(r *http.Request, ts []*store.Task) []any {
	out := make([]any, 0, len(ts))
	for _, t := range ts {
		maxAttempts, _ := s.rt.TaskDefaults(r.Context(), t)
		o := &ordered{}
		o.set("id", t.ID)
		o.set("type", t.Type)
		o.set("payload", t.Payload)
		o.set("attempt", t.Attempt)
		o.set("max_attempts", maxAttempts)
		o.set("lease_token", t.LeaseToken)
		o.set("lease_until", utc(t.LeaseUntil))
		o.set("run_id", nullable(t.RunID))
		o.set("step", nullable(t.Step))
		if t.TraceParent != "" {
			o.set("traceparent", t.TraceParent)
		}
		out = append(out, o)
	}
	return out
}

type heartbeatRequest struct {
	LeaseToken   string  `json:"lease_token"`
	LeaseSeconds float64 `json:"lease_seconds"`
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) {
	var req heartbeatRequest
	if !decodeStrict(w, r, &req) {
		return
	}
	if req.LeaseToken == "" {
		badField(w, "lease_token", "lease_token is required")
		return
	}
	if req.LeaseSeconds == 0 {
		req.LeaseSeconds = 30
	}
	if req.LeaseSeconds < 1 || req.LeaseSeconds > 3600 {
		badField(w, "lease_seconds", "lease_seconds must be from 1 to 3600")
		return
	}
	res, err := s.rt.Heartbeat(r.Context(), r.PathValue("id"), req.LeaseToken, time.Duration(req.LeaseSeconds*float64(time.Second)))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeData(w, http.StatusOK, map[string]any{"lease_until": res.LeaseUntil.UTC(), "cancel_requested": res.CancelRequested})
}

type completeRequest struct {
	LeaseToken string          `json:"lease_token"`
	Result     json.RawMessage `json:"result"`
	// Next asks for the tasks the completion starts (eager dispatch); the
	// answer lists them in "next" beside "data".
	Next *claimRequest `json:"next"`
}

func (s *Server) completeTask(w http.ResponseWriter, r *http.Request) {
	var req completeRequest
	if !decodeStrict(w, r, &req) {
		return
	}
	if req.LeaseToken == "" {
		badField(w, "lease_token", "lease_token is required")
		return
	}
	if req.Next == nil {
		t, err := s.rt.CompleteTask(r.Context(), r.PathValue("id"), req.LeaseToken, req.Result)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		writeData(w, http.StatusOK, s.taskJSON(r, t))
		return
	}
	if req.Next.WaitSeconds != 0 {
		badField(w, "next.wait_seconds", "a completion does not wait: leave wait_seconds out")
		return
	}
	next, ok := req.Next.check(w, "next.")
	if !ok {
		return
	}
	t, ts, err := s.rt.CompleteTaskAndClaim(r.Context(), r.PathValue("id"), req.LeaseToken, req.Result, next)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if r.Context().Err() != nil {
		// The worker hung up: the completion stands, but the tasks it was
		// handed go back rather than wait out their lease.
		s.rt.ReleaseTasks(context.WithoutCancel(r.Context()), ts)
		w.WriteHeader(StatusClientClosed)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": s.taskJSON(r, t), "next": s.claimedJSON(r, ts)})
}

// MaxCompleteBatch is the most completions one complete-many request
// carries, and MaxCompleteBatchBody bounds its body.
const (
	MaxCompleteBatch     = 100
	MaxCompleteBatchBody = 16 << 20
)

// completeManyRequest reports several tasks' success in one request.
// Each completion is applied as its own complete request would be (in
// the report batches the runtime writes anyway) and answered on its own;
// the request only saves the round trips, which over HTTP cost a worker
// with many short tasks more than the completions did (when each went in
// a request of its own, one request a job; docs/performance.md, "Through
// the HTTP API").
type completeManyRequest struct {
	Completions []completeItem `json:"completions"`
	// Next, as in a single completion: each completion takes up to
	// next.max of the tasks it starts.
	Next *claimRequest `json:"next"`
}

type completeItem struct {
	ID         string          `json:"id"`
	LeaseToken string          `json:"lease_token"`
	Result     json.RawMessage `json:"result"`
}

func (s *Server) completeTasks(w http.ResponseWriter, r *http.Request) {
	b, ok := readObject(w, r, MaxCompleteBatchBody)
	if !ok {
		return
	}
	var req completeManyRequest
	if fe := decodeStrictBytes(b, &req, ""); fe != nil {
		if located := locateCompleteProblem(b); located != nil {
			fe = located
		}
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, fe.Message, *fe)
		return
	}
	n := len(req.Completions)
	if n == 0 || n > MaxCompleteBatch {
		badField(w, "completions", fmt.Sprintf("completions must hold 1 to %d tasks", MaxCompleteBatch))
		return
	}
	seen := make(map[string]bool, n)
	for i, c := range req.Completions {
		p := func(field string) string { return fmt.Sprintf("completions[%d].%s", i, field) } // only for an error
		switch {
		case c.ID == "":
			badField(w, p("id"), "id is required")
			return
		case c.LeaseToken == "":
			badField(w, p("lease_token"), "lease_token is required")
			return
		case seen[c.ID]:
			badField(w, p("id"), "task "+c.ID+" is completed twice in this request")
			return
		}
		seen[c.ID] = true
	}
	var next runtime.ClaimRequest
	if req.Next != nil {
		if req.Next.WaitSeconds != 0 {
			badField(w, "next.wait_seconds", "a completion does not wait: leave wait_seconds out")
			return
		}
		var ok bool
		if next, ok = req.Next.check(w, "next."); !ok {
			return
		}
	}
	type outcome struct {
		task *store.Task
		next []*store.Task
		err  error
	}
	out := make([]outcome, n)
	var wg sync.WaitGroup
	for i, c := range req.Completions {
		if len(c.LeaseToken)+len(c.Result)+len(`{"lease_token":"","result":}`) > MaxTaskBody {
			// What its own request's body (the id is in its path) would
			// have been refused for: 413.
			out[i].err = errTooLarge
			continue
		}
		complete := func() {
			o := &out[i]
			if req.Next == nil {
				_, o.err = s.rt.CompleteTask(r.Context(), c.ID, c.LeaseToken, c.Result)
			} else {
				_, o.next, o.err = s.rt.CompleteTaskAndClaim(r.Context(), c.ID, c.LeaseToken, c.Result, next)
			}
		}
		if n == 1 {
			complete() // no goroutine to hand it to
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			complete()
		}()
	}
	wg.Wait()
	if r.Context().Err() != nil {
		// The worker hung up: the completions stand, the tasks they
		// were handed go back (see completeTask).
		for _, o := range out {
			s.rt.ReleaseTasks(context.WithoutCancel(r.Context()), o.next)
		}
		w.WriteHeader(StatusClientClosed)
		return
	}
	items := make([]any, n)
	for i, o := range out {
		item := &ordered{}
		item.set("id", req.Completions[i].ID)
		if errors.Is(o.err, errTooLarge) {
			item.set("status", http.StatusRequestEntityTooLarge)
			item.set("error", errorJSON(ErrorDetail{Code: CodeTooLarge, Message: o.err.Error()}))
		} else if o.err != nil {
			status, body := s.describeErr(r, o.err, "task_id", req.Completions[i].ID)
			item.set("status", status)
			item.set("error", errorJSON(body.Error))
		} else {
			item.set("status", http.StatusOK)
			if req.Next != nil {
				item.set("next", s.claimedJSON(r, o.next))
			}
		}
		items[i] = item
	}
	writeData(w, http.StatusOK, items)
}

// locateCompleteProblem names what is wrong with a complete-many body by
// its whole path (completions[2].result), decoding the items and next one
// by one: encoding/json's errors do not give the path of a nested object.
// A valid body is decoded whole in one pass; this runs only for one that
// is not. It returns nil if the problem is not in an item or in next.
func locateCompleteProblem(b []byte) *spec.FieldError {
	var raw struct {
		Completions []json.RawMessage `json:"completions"`
		Next        json.RawMessage   `json:"next"`
	}
	// Leniently: a stray top-level field must not hide an item's
	// problem, which encoding/json may have met first (and named without
	// its path); with no problem in an item, the body's own error names
	// the stray field.
	if json.Unmarshal(b, &raw) != nil {
		return nil // the body itself: its own error says it
	}
	for i, item := range raw.Completions {
		if fe := decodeStrictBytes(item, &completeItem{}, fmt.Sprintf("completions[%d]", i)); fe != nil {
			return fe
		}
	}
	if given(raw.Next) {
		return decodeStrictBytes(raw.Next, &claimRequest{}, "next")
	}
	return nil
}

// errTooLarge is a completion of a batch whose lease token and result
// pass what a request of its own may carry (MaxTaskBody).
var errTooLarge = fmt.Errorf("completion exceeds %d bytes", MaxTaskBody)

// errorJSON is an error's detail as an ordered object (the fast response
// path writes those; ErrorDetail is a struct).
func errorJSON(d ErrorDetail) *ordered {
	o := &ordered{}
	o.set("code", d.Code)
	o.set("message", d.Message)
	return o
}

type failRequest struct {
	LeaseToken string `json:"lease_token"`
	Error      string `json:"error" nul:"clean"`
	Retryable  *bool  `json:"retryable"`
}

func (s *Server) failTask(w http.ResponseWriter, r *http.Request) {
	var req failRequest
	if !decodeStrict(w, r, &req) {
		return
	}
	if req.LeaseToken == "" {
		badField(w, "lease_token", "lease_token is required")
		return
	}
	retryable := req.Retryable == nil || *req.Retryable
	// A worker's error text (a subprocess's output, say) may hold NUL:
	// it is stored with U+FFFD in its place rather than refused, which
	// would lose the outcome.
	msg := strings.ReplaceAll(req.Error, "\x00", "\uFFFD")
	t, err := s.rt.FailTask(r.Context(), r.PathValue("id"), req.LeaseToken, msg, retryable)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeData(w, http.StatusOK, s.taskJSON(r, t))
}

// ---- task types ----

type taskTypeRequest struct {
	Description string          `json:"description"`
	Enabled     *bool           `json:"enabled"`
	MaxAttempts int             `json:"max_attempts"`
	RetryDelay  json.RawMessage `json:"retry_delay"`
}

func taskTypeJSON(tt *store.TaskType) any {
	o := &ordered{}
	o.set("type", tt.Type)
	o.set("description", tt.Description)
	o.set("enabled", tt.Enabled)
	if tt.MaxAttempts > 0 {
		o.set("max_attempts", tt.MaxAttempts)
	} else {
		o.set("max_attempts", nil)
	}
	if tt.RetryDelay > 0 {
		o.set("retry_delay", spec.FormatDuration(tt.RetryDelay))
	} else {
		o.set("retry_delay", nil)
	}
	o.set("created_at", tt.CreatedAt.UTC())
	o.set("updated_at", tt.UpdatedAt.UTC())
	return o
}

func (s *Server) putTaskType(w http.ResponseWriter, r *http.Request) {
	typ := r.PathValue("type")
	if !spec.ValidTaskType(typ) {
		badField(w, "type", fmt.Sprintf("type %q must be a versioned name like \"billing.invoice.v1\"", typ))
		return
	}
	var req taskTypeRequest
	if !decodeStrict(w, r, &req) {
		return
	}
	if req.MaxAttempts < 0 || req.MaxAttempts > 100 {
		badField(w, "max_attempts", "max_attempts must be from 1 to 100")
		return
	}
	tt := &store.TaskType{Type: typ, Description: req.Description, Enabled: req.Enabled == nil || *req.Enabled, MaxAttempts: req.MaxAttempts}
	if given(req.RetryDelay) {
		d, err := spec.DurationFromJSON(req.RetryDelay, time.Second)
		if err != nil || d < time.Millisecond {
			badField(w, "retry_delay", "retry_delay must be a duration of at least 1ms, like \"30s\", or seconds as a number")
			return
		}
		tt.RetryDelay = d
	}
	got, err := s.st.PutTaskType(r.Context(), tt)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.rt.TaskTypesChanged()
	writeData(w, http.StatusOK, taskTypeJSON(got))
}

func (s *Server) getTaskType(w http.ResponseWriter, r *http.Request) {
	tt, err := s.st.GetTaskType(r.Context(), r.PathValue("type"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeData(w, http.StatusOK, taskTypeJSON(tt))
}

func (s *Server) listTaskTypes(w http.ResponseWriter, r *http.Request) {
	tts, err := s.st.ListTaskTypes(r.Context())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]any, 0, len(tts))
	for _, tt := range tts {
		out = append(out, taskTypeJSON(tt))
	}
	writeData(w, http.StatusOK, out)
}
