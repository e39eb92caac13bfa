package testwait

import (
	"testing"
	"time"
)

// Until polls cond every millisecond until it holds, and fails t with
// "timed out waiting for <what>" once within has passed.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // polling, under the deadline
	}
}
