package netguard

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestControlRules(t *testing.T) {
	const msgPrivate = "egress to 10.0.0.5:80 denied: private address not in --egress-allow"
	tests := []struct {
		allow       string
		network     string
		addr        string
		hostAllowed bool
		wantReason  string // "" = allowed
	}{
		// Public unicast is always allowed.
		{"", "tcp4", "8.8.8.8:443", false, ""},
		{"", "tcp6", "[2606:4700::1111]:443", false, ""},
		// Private, loopback, CGNAT and reserved ranges need an allowance.
		{"", "tcp4", "10.0.0.5:80", false, "private address not in --egress-allow"},
		{"", "tcp4", "172.16.3.4:80", false, "private address"},
		{"", "tcp4", "192.168.1.1:80", false, "private address"},
		{"", "tcp6", "[fd12::1]:80", false, "private address"},
		{"", "tcp4", "127.0.0.1:8080", false, "loopback address"},
		{"", "tcp6", "[::1]:8080", false, "loopback address"},
		{"", "tcp4", "100.64.1.1:80", false, "shared (CGNAT) address"},
		{"", "tcp4", "0.0.0.0:80", false, "unspecified address"},
		{"", "tcp4", "192.0.2.1:80", false, "reserved address"},
		{"", "tcp6", "[::ffff:10.0.0.1]:80", false, "private address"},
		// Allowed by CIDR, by bare IP, or because the URL's host name is allowed.
		{"127.0.0.0/8", "tcp4", "127.0.0.1:8080", false, ""},
		{"10.1.2.3", "tcp4", "10.1.2.3:80", false, ""},
		{"10.1.2.3", "tcp4", "10.1.2.4:80", false, "private address"},
		{"10.0.0.0/8", "tcp6", "[::ffff:10.9.9.9]:80", false, ""},
		{"::1", "tcp6", "[::1]:80", false, ""},
		{"fc00::/7", "tcp6", "[fd12::1]:80", false, ""},
		{"", "tcp4", "10.0.0.5:80", true, ""},
		{"", "tcp6", "[::1]:80", true, ""},
		// Link-local and metadata: never, whatever the allowance.
		{"169.254.0.0/16", "tcp4", "169.254.169.254:80", false, "cloud metadata address is never allowed"},
		{"169.254.169.254", "tcp4", "169.254.169.254:80", false, "cloud metadata"},
		{"0.0.0.0/0", "tcp4", "169.254.169.254:80", true, "cloud metadata"},
		{"fd00::/8", "tcp6", "[fd00:ec2::254]:80", false, "cloud metadata"},
		{"100.64.0.0/10", "tcp4", "100.100.100.200:80", false, "cloud metadata"},
		// Azure's WireServer is a public address: refused all the same.
		{"", "tcp4", "168.63.129.16:80", false, "cloud metadata"},
		{"168.63.129.16", "tcp4", "168.63.129.16:32526", false, "cloud metadata"},
		{"", "tcp4", "168.63.129.17:80", false, ""},
		{"100.64.0.0/10", "tcp4", "100.100.100.201:80", false, ""},
		{"169.254.0.0/16", "tcp4", "169.254.10.1:80", true, "link-local address is never allowed"},
		{"fe80::/10", "tcp6", "[fe80::1%eth0]:80", true, "link-local"},
		{"::ffff:169.254.0.0/112", "tcp6", "[::ffff:169.254.169.254]:80", true, "cloud metadata"},
		{"64:ff9b::/96", "tcp6", "[64:ff9b::a9fe:a9fe]:80", true, "cloud metadata address is never allowed (via NAT64)"},
		{"64:ff9b::/96", "tcp6", "[64:ff9b::808:808]:80", false, ""},
		// Only TCP.
		{"0.0.0.0/0", "udp4", "8.8.8.8:53", true, "not permitted"},
	}
	for _, tc := range tests {
		p, err := ParsePolicy(tc.allow)
		if err != nil {
			t.Fatalf("ParsePolicy(%q): %v", tc.allow, err)
		}
		err = p.control(tc.network, tc.addr, tc.hostAllowed)
		if tc.wantReason == "" {
			if err != nil {
				t.Errorf("allow=%q %s %s hostAllowed=%v: got %v, want allowed", tc.allow, tc.network, tc.addr, tc.hostAllowed, err)
			}
			continue
		}
		var d *DeniedError
		if !errors.As(err, &d) {
			t.Errorf("allow=%q %s %s hostAllowed=%v: got %v, want DeniedError", tc.allow, tc.network, tc.addr, tc.hostAllowed, err)
			continue
		}
		if d.Addr != tc.addr || !strings.Contains(d.Reason, tc.wantReason) {
			t.Errorf("allow=%q %s: got Addr=%q Reason=%q, want Addr=%q Reason~%q", tc.allow, tc.addr, d.Addr, d.Reason, tc.addr, tc.wantReason)
		}
	}

	p, _ := ParsePolicy("")
	if got := p.control("tcp4", "10.0.0.5:80", false).Error(); got != msgPrivate {
		t.Errorf("message = %q, want %q", got, msgPrivate)
	}
}

// TestMetadataDeniedByControlHook drives a real net.Dialer whose Control is
// the policy hook, with the host-name allowance switched on and a covering
// CIDR in the allow list: the hook must refuse before connect(2), so no
// packet is sent. The short deadline guards against a hang should it not.
func TestMetadataDeniedByControlHook(t *testing.T) {
	p, err := ParsePolicy("169.254.0.0/16,fd00::/8,100.64.0.0/10")
	if err != nil {
		t.Fatal(err)
	}
	var called int
	d := net.Dialer{Control: func(network, address string, _ syscall.RawConn) error {
		called++
		return p.control(network, address, true)
	}}
	for _, addr := range []string{"169.254.169.254:80", "100.100.100.200:80"} {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		start := time.Now()
		conn, err := d.DialContext(ctx, "tcp", addr)
		cancel()
		if conn != nil {
			conn.Close()
			t.Fatalf("dial %s: connected", addr)
		}
		var de *DeniedError
		if !errors.As(err, &de) {
			t.Fatalf("dial %s: err = %v, want DeniedError", addr, err)
		}
		if !strings.Contains(de.Reason, "cloud metadata") {
			t.Errorf("dial %s: reason %q", addr, de.Reason)
		}
		if el := time.Since(start); el > 250*time.Millisecond {
			t.Errorf("dial %s took %v; the hook should refuse immediately", addr, el)
		}
	}
	if called != 2 {
		t.Errorf("control hook called %d times, want 2", called)
	}
}
