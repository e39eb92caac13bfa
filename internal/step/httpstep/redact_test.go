package httpstep_test

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/step/httpstep"
)

// TestRedactURLHidesBareQueryKeys: a query parameter without a value (a
// token given as the key, "?sk_live_abc") is replaced whole; it was kept
// as a key ("sk_live_abc=REDACTED"), the secret in plain sight. Values,
// user information and the fragment go as before.
func TestRedactURLHidesBareQueryKeys(t *testing.T) {
	got := httpstep.RedactURL("https://svc:pa55@api.test/v1?sk_live_abc&api_key=k3y&&x=1#frag")
	if want := "https://REDACTED:REDACTED@api.test/v1?REDACTED&api_key=REDACTED&&x=REDACTED"; got != want {
		t.Errorf("RedactURL = %q, want %q", got, want)
	}
	for _, secret := range []string{"sk_live_abc", "k3y", "pa55", "frag"} {
		if strings.Contains(got, secret) {
			t.Errorf("%q shows %q", got, secret)
		}
	}
}
