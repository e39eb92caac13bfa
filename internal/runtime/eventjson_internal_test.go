package runtime

import (
	"encoding/json"
	"testing"

	"github.com/ferryhq/ferry/internal/status"

	"pgregory.net/rapid"
)

// TestEventDataMatchesTheMaps: taskRef, attemptRef, taskEndedData,
// runStartedData and runEndedData write what
// json.Marshal writes for the maps they stand for, for ids and types of
// any bytes (quotes, escapes, HTML characters, non-ASCII, invalid UTF-8)
// and any attempt.
func TestEventDataMatchesTheMaps(t *testing.T) {
	str := rapid.OneOf(
		rapid.StringMatching(`[a-z0-9.\-]{0,36}`),
		rapid.String(),
		rapid.SampledFrom([]string{"", `"`, `\`, "<b>", "a&b", "\n", "é", "\u2028", "\xff"}),
	)
	rapid.Check(t, func(t *rapid.T) {
		id, typ, attempt := str.Draw(t, "id"), str.Draw(t, "type"), rapid.Int().Draw(t, "attempt")
		want, _ := json.Marshal(map[string]any{"task_id": id, "type": typ})
		if got := taskRef(id, typ); string(got) != string(want) {
			t.Fatalf("taskRef = %s, want %s", got, want)
		}
		want, _ = json.Marshal(map[string]any{"task_id": id, "attempt": attempt})
		if got := attemptRef(attempt, id); string(got) != string(want) {
			t.Fatalf("attemptRef = %s, want %s", got, want)
		}
		st, reason := rapid.SampledFrom([]string{status.RunCompleted, status.RunFailed, status.RunCancelled, status.RunTimeout}).Draw(t, "status"), str.Draw(t, "reason")
		want, _ = json.Marshal(map[string]any{"status": st, "reason": reason})
		if got := runEndedData(st, reason); string(got) != string(want) {
			t.Fatalf("runEndedData = %s, want %s", got, want)
		}
		want, _ = json.Marshal(map[string]any{"workflow": typ, "version": attempt})
		if got := runStartedData(typ, attempt); string(got) != string(want) {
			t.Fatalf("runStartedData = %s, want %s", got, want)
		}
		withErr := map[string]any{"attempt": attempt}
		if reason != "" {
			withErr["error"] = reason
		}
		want, _ = json.Marshal(withErr)
		if got := taskEndedData(attempt, reason); string(got) != string(want) {
			t.Fatalf("taskEndedData = %s, want %s", got, want)
		}
		if got := runEndedType(st); got != "run_"+st {
			t.Fatalf("runEndedType(%q) = %q", st, got)
		}
	})
}
