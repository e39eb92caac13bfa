package status

// Run statuses.
const (
	RunRunning   = "running"
	RunPaused    = "paused"
	RunCompleted = "completed"
	RunFailed    = "failed"
	RunCancelled = "cancelled"
	RunTimeout   = "timeout"
)

// Step statuses.
const (
	StepPending       = "pending"
	StepRunning       = "running"
	StepSleeping      = "sleeping"
	StepWaiting       = "waiting"
	StepSuccess       = "success"
	StepFailed        = "failed"
	StepTimeout       = "timeout"
	StepSkipped       = "skipped"
	StepTemplateError = "template_error"
	StepCancelled     = "cancelled"
)

// RunTerminal reports whether a run in status s can change no more.
func RunTerminal(s string) bool {
	switch s {
	case RunCompleted, RunFailed, RunCancelled, RunTimeout:
		return true
	}
	return false
}

// StepTerminal reports whether a step in status s is finished.
func StepTerminal(s string) bool {
	switch s {
	case StepSuccess, StepFailed, StepTimeout, StepSkipped, StepTemplateError, StepCancelled:
		return true
	}
	return false
}

// StepFailure reports whether s is a terminal outcome that means the step's
// work did not happen as designed (dependents without an `if` are blocked).
func StepFailure(s string) bool {
	switch s {
	case StepFailed, StepTimeout, StepTemplateError, StepCancelled:
		return true
	}
	return false
}

// Task statuses (the durable inbox's names).
const (
	TaskPending   = "pending"
	TaskLeased    = "leased"
	TaskSucceeded = "succeeded"
	TaskFailed    = "failed"
	TaskCancelled = "cancelled"
)

// TaskTerminal reports whether a task in status s is finished.
func TaskTerminal(s string) bool {
	return s == TaskSucceeded || s == TaskFailed || s == TaskCancelled
}
