package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/cli"
)

// TestBenchTransportAndLog: `ferry bench` takes --transport and sends the
// engine's log to stderr from --log-level up (off: nothing), and refuses
// a level it does not know.
func TestBenchTransportAndLog(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a workload")
	}
	run := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := cli.Execute(context.Background(), append([]string{"bench", "--workload", "jobs", "-n", "4", "--workers", "2", "--json"}, args...), &out, &errb)
		return out.String(), errb.String(), code
	}
	out, stderr, code := run("--transport", "http", "--log-level", "info")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var r struct {
		Completed int            `json:"completed"`
		Settings  map[string]any `json:"settings"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Completed != 4 || r.Settings["transport"] != "http" {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(stderr, "worker stopped") {
		t.Errorf("info log missing from stderr:\n%s", stderr)
	}
	if _, stderr, code := run("--log-level", "off"); code != 0 || stderr != "" {
		t.Errorf("--log-level off: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := run("--log-level", "loud"); code == 0 || !strings.Contains(stderr, "--log-level") {
		t.Errorf("--log-level loud: exit %d, stderr %q", code, stderr)
	}
}
