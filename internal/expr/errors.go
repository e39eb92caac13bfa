package expr

import "fmt"

// SyntaxError reports text that is not a valid template, path or condition.
// Pos is a 0-based byte offset into Input.
type SyntaxError struct {
	Pos   int
	Msg   string
	Input string // the text that failed to parse; Pos is relative to it
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("%s at %d", e.Msg, e.Pos)
}

// ResolveError reports a template reference that could not be resolved
// against a Scope. Reason is meant for users and is stable enough to be
// shown verbatim (the truncated-body reason in particular).
type ResolveError struct {
	Path   string
	Reason string
}

func (e *ResolveError) Error() string {
	return "Failed to resolve {{" + e.Path + "}}: " + e.Reason
}

// DuplicateKeyError reports that two keys of one JSON object rendered to the
// same text in RenderJSON; silently dropping one would lose data.
type DuplicateKeyError struct {
	Key string
}

func (e *DuplicateKeyError) Error() string {
	return fmt.Sprintf("two object keys render to the same key %q", e.Key)
}
