package netguard_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/netguard"
)

func mustPolicy(t *testing.T, allow string) *netguard.Policy {
	t.Helper()
	p, err := netguard.ParsePolicy(allow)
	if err != nil {
		t.Fatalf("ParsePolicy(%q): %v", allow, err)
	}
	return p
}

func client(p *netguard.Policy) *http.Client {
	tr := p.Transport()
	return &http.Client{Transport: tr}
}

// get performs a GET with a deadline so a broken guard can never hang a test.
func get(t *testing.T, c *http.Client, u string) (*http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c.Do(req)
}

func okServer(t *testing.T, hits *atomic.Int32) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits != nil {
			hits.Add(1)
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestParsePolicy(t *testing.T) {
	p, err := netguard.ParsePolicy(" 127.0.0.0/8 , 10.1.2.3,Internal.Example.COM.,localhost,, ::1 ,10.0.0.7/8,localhost ")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.String(), "127.0.0.0/8,10.1.2.3,internal.example.com,localhost,::1,10.0.0.0/8"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	for _, s := range []string{"", "  ", ",", " , "} {
		p, err := netguard.ParsePolicy(s)
		if err != nil || p.String() != "" {
			t.Errorf("ParsePolicy(%q) = %q, %v; want empty policy", s, p.String(), err)
		}
	}

	bad := []string{
		"10.0.0.0/33",
		"300.1.1.1",
		"10.1.2",
		"1.2.3.4:80",
		"foo bar",
		"http://internal.example.com",
		"-bad.example.com",
		"a..b",
		"*.example.com",
		"fe80::1%eth0",
		"10.0.0.0/",
	}
	for _, entry := range bad {
		_, err := netguard.ParsePolicy("127.0.0.1, " + entry + " ,localhost")
		if err == nil {
			t.Errorf("entry %q: no error", entry)
			continue
		}
		if !strings.Contains(err.Error(), `"`+entry+`"`) {
			t.Errorf("entry %q: error %q does not name the entry", entry, err)
		}
	}
}

func TestAllowedLoopbackByCIDR(t *testing.T) {
	srv := okServer(t, nil)
	resp, err := get(t, client(mustPolicy(t, "127.0.0.0/8")), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "ok" {
		t.Fatalf("got %d %q", resp.StatusCode, b)
	}
}

func TestAllowedLoopbackByHostName(t *testing.T) {
	srv := okServer(t, nil)
	c := client(mustPolicy(t, "localhost"))
	u := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	resp, err := get(t, c, u)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}

	// The host-name allowance is for that name only, not for the address
	// it resolves to.
	_, err = get(t, c, srv.URL)
	if !netguard.IsDenied(err) {
		t.Fatalf("GET %s with only localhost allowed: err = %v, want denied", srv.URL, err)
	}
}

func TestDeniedLoopback(t *testing.T) {
	var hits atomic.Int32
	srv := okServer(t, &hits)
	c := client(mustPolicy(t, "10.0.0.0/8,internal.example.com"))

	start := time.Now()
	resp, err := get(t, c, srv.URL)
	if resp != nil {
		resp.Body.Close()
		t.Fatal("request succeeded")
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("refusal took %v", el)
	}
	var de *netguard.DeniedError
	if !errors.As(err, &de) {
		t.Fatalf("err = %v, want DeniedError in chain", err)
	}
	var ue *url.Error
	var oe *net.OpError
	if !errors.As(err, &ue) || !errors.As(err, &oe) {
		t.Errorf("err %T = %v: want url.Error and net.OpError in chain", err, err)
	}
	wantAddr := strings.TrimPrefix(srv.URL, "http://")
	if de.Addr != wantAddr || de.Reason != "loopback address not in --egress-allow" {
		t.Errorf("got %+v", de)
	}
	if want := "egress to " + wantAddr + " denied: loopback address not in --egress-allow"; de.Error() != want {
		t.Errorf("Error() = %q, want %q", de.Error(), want)
	}

	// Through a host name, the refusal comes from the dialer's Control hook
	// on the resolved address.
	u := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	if _, err := get(t, c, u); !netguard.IsDenied(err) {
		t.Fatalf("GET %s: err = %v, want denied", u, err)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("server was reached %d times", n)
	}

	// A nil policy is the empty policy.
	var nilPolicy *netguard.Policy
	if _, err := get(t, client(nilPolicy), srv.URL); !netguard.IsDenied(err) {
		t.Fatalf("nil policy: err = %v, want denied", err)
	}
}

// TestMetadataAlwaysDenied dials metadata addresses directly, with covering
// CIDRs in the allow list. The refusal happens before any socket is
// connected; the short deadline is a guard against a hang.
func TestMetadataAlwaysDenied(t *testing.T) {
	p := mustPolicy(t, "169.254.0.0/16,169.254.169.254,fd00::/8,100.64.0.0/10")
	for _, addr := range []string{"169.254.169.254:80", "[fd00:ec2::254]:80", "100.100.100.200:80", "169.254.1.1:443"} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		conn, err := p.DialContext(ctx, "tcp", addr)
		cancel()
		if conn != nil {
			conn.Close()
			t.Fatalf("%s: connected", addr)
		}
		var de *netguard.DeniedError
		if !errors.As(err, &de) {
			t.Fatalf("%s: err = %v, want DeniedError", addr, err)
		}
		if !strings.Contains(de.Reason, "never allowed") {
			t.Errorf("%s: reason %q", addr, de.Reason)
		}
	}
	if _, err := p.DialContext(context.Background(), "udp", "127.0.0.1:53"); !netguard.IsDenied(err) {
		t.Errorf("udp dial: err = %v, want denied", err)
	}
}

func TestRedirectToDeniedAddress(t *testing.T) {
	var targetHits atomic.Int32
	target := okServer(t, &targetHits)

	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	}))
	t.Cleanup(redirector.Close)

	tests := []struct {
		allow, from, to string
	}{
		// Reached through an allowed host name; the redirect names an IP
		// that is not allowed.
		{"localhost", strings.Replace(redirector.URL, "127.0.0.1", "localhost", 1), target.URL},
		// Only 127.0.0.1 is allowed; the redirect goes to another
		// loopback address (nothing listens there; the dial is refused
		// before it is attempted).
		{"127.0.0.1", redirector.URL, strings.Replace(target.URL, "127.0.0.1", "127.0.0.2", 1)},
		{"127.0.0.1", redirector.URL, strings.Replace(target.URL, "127.0.0.1", "[::1]", 1)},
	}
	for _, tc := range tests {
		u := tc.from + "/?to=" + url.QueryEscape(tc.to)
		resp, err := get(t, client(mustPolicy(t, tc.allow)), u)
		if resp != nil {
			resp.Body.Close()
			t.Fatalf("allow=%q %s: request succeeded", tc.allow, u)
		}
		var de *netguard.DeniedError
		if !errors.As(err, &de) {
			t.Fatalf("allow=%q %s: err = %v, want DeniedError", tc.allow, u, err)
		}
		if !strings.Contains(de.Reason, "loopback address") {
			t.Errorf("reason %q", de.Reason)
		}
	}
	if n := targetHits.Load(); n != 0 {
		t.Fatalf("redirect target reached %d times", n)
	}
}

func TestTransport(t *testing.T) {
	tr := mustPolicy(t, "").Transport()
	if tr.Proxy != nil {
		t.Error("Proxy is set")
	}
	if tr.DialContext == nil || tr.DialTLSContext != nil {
		t.Error("dialers not set up")
	}
	if tr.MaxIdleConnsPerHost != 32 {
		t.Errorf("MaxIdleConnsPerHost = %d", tr.MaxIdleConnsPerHost)
	}
	if tr.TLSHandshakeTimeout <= 0 || tr.IdleConnTimeout <= 0 {
		t.Error("timeouts not set")
	}
	if tr == http.DefaultTransport {
		t.Error("returned the default transport")
	}
}
