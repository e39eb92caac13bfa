package spec

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Error codes carried in FieldError.Code. They are part of the API: clients
// branch on them, so they never change meaning.
const (
	CodeInvalidJSON        = "invalid_json"
	CodeTooLarge           = "too_large"
	CodeTooManySteps       = "too_many_steps"
	CodeRequired           = "required"
	CodeUnknownField       = "unknown_field"
	CodeInvalidType        = "invalid_type"
	CodeInvalidValue       = "invalid_value"
	CodeInvalidName        = "invalid_name"
	CodeInvalidDuration    = "invalid_duration"
	CodeMissingStepType    = "missing_step_type"
	CodeConflictingTypes   = "conflicting_step_types"
	CodeFieldNotAllowed    = "field_not_allowed"
	CodeUnknownNeed        = "unknown_need"
	CodeDuplicateNeed      = "duplicate_need"
	CodeDuplicateKey       = "duplicate_key"
	CodeSelfNeed           = "self_need"
	CodeCycle              = "cycle"
	CodeInvalidCondition   = "invalid_condition"
	CodeInvalidTemplate    = "invalid_template"
	CodeUnknownNamespace   = "unknown_namespace"
	CodeUnknownStep        = "unknown_step"
	CodeNotUpstream        = "not_upstream"
	CodeNotAWaitStep       = "not_a_wait_step"
	CodeUnsupportedTrigger = "unsupported_trigger"
	CodeInvalidURL         = "invalid_url"
)

// FieldError is one problem in a definition, located by a JSON path such as
// tasks.send-receipt.needs[0].
type FieldError struct {
	Path    string `json:"path"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e FieldError) Error() string {
	if e.Path == "" {
		return e.Message
	}
	return e.Path + ": " + e.Message
}

// ValidationError carries every problem found in a definition, so a user can
// fix them all in one go.
type ValidationError struct {
	Errors []FieldError
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		parts[i] = fe.Error()
	}
	return "invalid workflow: " + strings.Join(parts, "; ")
}

type collector struct {
	errs []FieldError
	// stored: reading a stored version (Limits.Stored).
	stored bool
}

func (c *collector) add(path, code, format string, args ...any) {
	c.errs = append(c.errs, FieldError{Path: path, Code: code, Message: fmt.Sprintf(format, args...)})
}

func (c *collector) err() error {
	if len(c.errs) == 0 {
		return nil
	}
	return &ValidationError{Errors: c.errs}
}

// suggest returns the known name closest to s when it is close enough to be a
// likely typo ("chrage" → "charge").
func suggest(s string, known []string) string {
	// levenshtein is quadratic, and names come straight from the document:
	// a 100 KB name would take seconds. Valid step names are at most 64
	// characters, and a name further away in length than the threshold can
	// never be close enough, so neither is compared.
	const maxLen = 128
	if len(s) > maxLen {
		return ""
	}
	limit := max(2, len(s)/3)
	n := utf8.RuneCountInString(s)
	best, bestD := "", 1<<30
	for _, k := range known {
		if len(k) > maxLen || abs(utf8.RuneCountInString(k)-n) > limit {
			continue
		}
		if d := levenshtein(s, k); d < bestD {
			best, bestD = k, d
		}
	}
	if best != "" && bestD <= limit {
		return best
	}
	return ""
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
