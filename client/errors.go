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
