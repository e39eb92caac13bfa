package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

// TestRedactHidesPasswords: the start-up line shows no Postgres password,
// in the URL's user part or as a password parameter.
func TestRedactHidesPasswords(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@db/f":                          "postgres://u:xxxxx@db/f",
		"postgres://u@db/f?sslmode=disable&password=secret": "postgres://u@db/f?password=xxxxx&sslmode=disable",
		"postgres://u@db/f?sslmode=disable":                 "postgres://u@db/f?sslmode=disable",
		"sqlite:ferry.db":                                   "sqlite:ferry.db",
		"postgres://u:sec%ret@db/f":                         "(not shown: not a URL, so its password cannot be hidden)",
		"host=db user=u password=secret":                    "(not shown: not a URL, so its password cannot be hidden)",
	} {
		if got := redact(in); got != want || strings.Contains(got, "secret") {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDefaultPublicURLIsTheBoundAddress: the default public URL is the
// address bound (the port the kernel picked for port 0), loopback with a
// warning when the host is unspecified.
func TestDefaultPublicURLIsTheBoundAddress(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	for addr, want := range map[string]string{
		"127.0.0.1:4321": "http://127.0.0.1:4321",
		"0.0.0.0:4321":   "http://127.0.0.1:4321",
		"[::]:4321":      "http://127.0.0.1:4321",
		"[::1]:4321":     "http://[::1]:4321",
	} {
		tcp, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := defaultPublicURL(tcp, log); got != want {
			t.Errorf("defaultPublicURL(%s) = %s, want %s", addr, got, want)
		}
	}
	if n := strings.Count(logged.String(), "set --public-url"); n != 2 {
		t.Errorf("%d warnings for the two unspecified hosts:\n%s", n, logged.String())
	}
}

// TestServerRefusesBadFlags: values the server would otherwise replace
// with its defaults without a word are refused, naming the flag.
func TestServerRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--lease", "0s"}, {"--lease", "-5s"}, {"--safety-tick", "0s"}, {"--max-steps", "-1"},
		{"--max-definition-bytes", "0"}, {"--public-url", "notaurl"}, {"--public-url", "ftp://x"},
		// Callback URLs are the public URL and /wh/<token>: after a query
		// or a fragment that is no path (a server started with them).
		{"--public-url", "https://ferry.example.com/?via=lb"}, {"--public-url", "https://ferry.example.com/#x"},
		{"--public-url", "https://ferry.example.com?"}, {"--public-url", "https://ferry.example.com#"},
	} {
		var stderr bytes.Buffer
		all := append([]string{"server", "--database", "sqlite:" + t.TempDir() + "/f.db", "--listen", "127.0.0.1:0"}, args...)
		// A server that starts instead is stopped (exit 0) at the deadline.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		code := Execute(ctx, all, io.Discard, &stderr)
		cancel()
		if code == 0 || !strings.Contains(stderr.String(), args[0]) {
			t.Errorf("server %v: exit %d, stderr %q; want refused naming %s", args, code, stderr.String(), args[0])
		}
	}
}

// TestHelpHidesDatabasePassword: --help shows --database's default, read
// from FERRY_DATABASE, without its password (it showed the URL whole).
func TestHelpHidesDatabasePassword(t *testing.T) {
	for _, db := range []string{"postgres://ferry:secret@db:5432/ferry", "postgres://ferry:sec%ret@db:5432/ferry"} {
		t.Setenv("FERRY_DATABASE", db)
		for _, cmd := range []string{"server", "migrate"} {
			var out bytes.Buffer
			if code := Execute(context.Background(), []string{cmd, "--help"}, &out, io.Discard); code != 0 {
				t.Fatalf("%s --help: exit %d", cmd, code)
			}
			if help := out.String(); strings.Contains(help, "secret") || strings.Contains(help, "sec%ret") || !strings.Contains(help, "--database") {
				t.Errorf("FERRY_DATABASE=%s %s --help shows the password:\n%s", db, cmd, help)
			}
		}
	}
	t.Setenv("FERRY_DATABASE", "postgres://ferry:secret@db:5432/ferry")
	var out bytes.Buffer
	Execute(context.Background(), []string{"server", "--help"}, &out, io.Discard)
	if !strings.Contains(out.String(), `(default "postgres://ferry:xxxxx@db:5432/ferry")`) {
		t.Errorf("the default is not shown redacted:\n%s", out.String())
	}
}
