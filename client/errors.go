package client

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Error codes the server puts in APIError.Code. They mirror the server's and
// never change meaning, so callers may branch on them.
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
	CodeInternal         = "internal"
)

// FieldDetail locates one problem, e.g. Path "tasks.send-receipt.needs[0]",
// Code "unknown_need".
type FieldDetail struct {
	Path    string `json:"path"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// APIError is an error response from the server. When the body was not
// Ferry's error envelope (a proxy's error page, say) Code is empty and
// Message holds the start of the body.
type APIError struct {
	StatusCode int
	Code       string
	Message    string
	Details    []FieldDetail
}

// Error renders the code and message on the first line and each detail on a
// line of its own:
//
//	invalid_workflow: the workflow definition is invalid
//	  tasks.send-receipt.needs[0]: unknown step "chrage"; did you mean "charge"?
func (e *APIError) Error() string {
	var b strings.Builder
	if e.Code != "" {
		b.WriteString(e.Code)
	} else {
		fmt.Fprintf(&b, "HTTP %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	for _, d := range e.Details {
		b.WriteString("\n  ")
		if d.Path != "" {
			b.WriteString(d.Path)
			b.WriteString(": ")
		}
		b.WriteString(d.Message)
	}
	return b.String()
}

// HasCode reports whether err is, or wraps, an *APIError with the given
// code.
func HasCode(err error, code string) bool {
	var e *APIError
	return errors.As(err, &e) && e.Code == code
}

// Error codes of the task protocol.
const (
	CodeInvalidRequest = "invalid_request"
	CodeStaleLease     = "stale_lease"
	CodeTaskFinished   = "task_finished"
)

// Sentinels for the task protocol's refusals; test with errors.Is. Nothing
// changed on the server when either is returned.
var (
	// ErrLeaseLost: the lease token is no longer the task's (the lease
	// expired and the task was claimed again). Stop working on the task and
	// do not report it.
	ErrLeaseLost = errors.New("ferry: task lease lost")
	// ErrTaskFinished: the task already succeeded, failed or was cancelled.
	ErrTaskFinished = errors.New("ferry: task already finished")
)

// Is makes errors.Is(err, ErrLeaseLost) hold for a 409 stale_lease answer and
// errors.Is(err, ErrTaskFinished) for a 409 task_finished one.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrLeaseLost:
		return e.StatusCode == http.StatusConflict && e.Code == CodeStaleLease
	case ErrTaskFinished:
		return e.StatusCode == http.StatusConflict && e.Code == CodeTaskFinished
	}
	return false
}
