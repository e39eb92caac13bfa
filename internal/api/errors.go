package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/ferryhq/ferry/internal/httpwrap"
	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/store"
)

// Error codes returned in {"error": {"code": ...}}. Clients branch on them.
const (
	CodeUnauthorized     = "unauthorized"
	CodeNotFound         = "not_found"
	CodeInvalidJSON      = "invalid_json"
	CodeInvalidWorkflow  = "invalid_workflow"
	CodeInvalidParameter = "invalid_parameter"
	CodeAlreadyExists    = "already_exists"
	CodeConflict         = "conflict"
	CodeAlreadyDelivered = "already_delivered"
	CodeRunFinished      = "run_finished"
	CodeStepFinished     = "step_finished"
	CodeDisabled         = "workflow_disabled"
	CodeTooLarge         = "too_large"
	CodeInvalidRequest   = "invalid_request"
	CodeStaleLease       = "stale_lease"
	CodeTaskFinished     = "task_finished"
	CodeInternal         = "internal"
	// CodeMethodNotAllowed: a path outside /api/ that takes other methods
	// (POST /wh/{token} asked with GET).
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeClientClosed answers a request whose client hung up before it
	// was answered; no one reads it (see StatusClientClosed).
	CodeClientClosed = "client_closed_request"
)

// StatusClientClosed (nginx's 499, "client closed request") is what a
// request whose client hung up before it was answered is counted and
// traced as: its client's timeout, or a worker stopping while its claim
// waits. It is no failure of the server's, so it is neither a 500 nor
// logged as an error; and the answer reaches no one.
const StatusClientClosed = 499

// ErrorBody is the error envelope.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail describes what went wrong; Details locate each problem.
type ErrorDetail struct {
	Code    string            `json:"code"`
	Message string            `json:"message"`
	Details []spec.FieldError `json:"details,omitempty"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	if b, bp := encodeResponse(v); b != nil {
		w.WriteHeader(code)
		_, _ = w.Write(b)
		putResponse(bp, b)
		return
	}
	// Encoded before the status goes out: an answer encoding/json refuses
	// (JSON nested past its limit) was a 2xx with an empty body.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		_ = json.NewEncoder(w).Encode(ErrorBody{ErrorDetail{Code: CodeInternal, Message: "internal error: the answer could not be encoded"}})
		return
	}
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

func writeData(w http.ResponseWriter, code int, v any) {
	writeJSON(w, code, map[string]any{"data": v})
}

func writeError(w http.ResponseWriter, status int, code, msg string, details ...spec.FieldError) {
	writeJSON(w, status, ErrorBody{ErrorDetail{Code: code, Message: msg, Details: details}})
}

// writeErr maps domain errors to HTTP; anything unexpected is a 500
// that is logged, with no internals in the body.
func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	status, body := s.describeErr(r, err)
	writeJSON(w, status, body)
}

// describeErr is the HTTP status and error body err answers with (see
// writeErr); a batch answers each of its items with one, and logs an
// unexpected error with attrs naming the item.
func (s *Server) describeErr(r *http.Request, err error, attrs ...any) (int, ErrorBody) {
	e := func(status int, code, msg string, details ...spec.FieldError) (int, ErrorBody) {
		return status, ErrorBody{ErrorDetail{Code: code, Message: msg, Details: details}}
	}
	var ve *spec.ValidationError
	switch {
	case errors.As(err, &ve):
		return e(http.StatusUnprocessableEntity, CodeInvalidWorkflow, "the workflow definition is invalid", ve.Errors...)
	case errors.Is(err, store.ErrNotFound):
		return e(http.StatusNotFound, CodeNotFound, err.Error()) // "workflow \"x\": not found"
	case errors.Is(err, store.ErrConflict):
		return e(http.StatusConflict, CodeAlreadyExists, strings.TrimSuffix(err.Error(), ": "+store.ErrConflict.Error()))
	case errors.Is(err, runtime.ErrAlreadyDelivered):
		return e(http.StatusConflict, CodeAlreadyDelivered, err.Error())
	case errors.Is(err, runtime.ErrStepFinished):
		return e(http.StatusConflict, CodeStepFinished, err.Error())
	case errors.Is(err, runtime.ErrRunFinished):
		return e(http.StatusConflict, CodeRunFinished, err.Error())
	case errors.Is(err, runtime.ErrStaleLease):
		return e(http.StatusConflict, CodeStaleLease, err.Error())
	case errors.Is(err, runtime.ErrTaskFinished):
		return e(http.StatusConflict, CodeTaskFinished, err.Error())
	case errors.Is(err, runtime.ErrInvalidTask):
		return e(http.StatusBadRequest, CodeInvalidRequest, err.Error())
	case errors.Is(err, runtime.ErrDisabled):
		return e(http.StatusConflict, CodeDisabled, err.Error())
	case errors.Is(err, store.ErrWorkflowChanged):
		// The workflow changed under four trigger attempts in a row.
		return e(http.StatusConflict, CodeConflict, err.Error())
	}
	if r.Context().Err() != nil {
		// The client hung up (which cancelled the request's context, and
		// with it the query or the wait that then failed).
		s.log.Debug("request abandoned by its client", append([]any{"method", r.Method, "path", httpwrap.RedactPath(r.URL.Path), "err", err}, attrs...)...)
		return e(StatusClientClosed, CodeClientClosed, "the client closed the request before it was answered")
	}
	s.log.Error("request failed", append([]any{"method", r.Method, "path", httpwrap.RedactPath(r.URL.Path), "err", err}, attrs...)...)
	return e(http.StatusInternalServerError, CodeInternal, "internal error")
}
