package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"code.dny.dev/ssrf"
)

// Dial and transport tuning. The per-request deadline is owned by the
// caller (for HTTP steps: the per-attempt timeout), so none of these is an
// overall request timeout.
const (
	dialTimeout           = 10 * time.Second
	keepAlive             = 30 * time.Second
	tlsHandshakeTimeout   = 10 * time.Second
	expectContinueTimeout = 1 * time.Second
	idleConnTimeout       = 90 * time.Second
	maxIdleConns          = 256
	maxIdleConnsPerHost   = 32
	maxResponseHeaderSize = 1 << 20
)

// allowFlag is how the allow list is named in refusal messages.
const allowFlag = "--egress-allow"

var (
	// metadataAddrs are cloud instance metadata endpoints. They are refused
	// even when the allow list covers them.
	metadataAddrs = []netip.Addr{
		netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, ...
		netip.MustParseAddr("fd00:ec2::254"),   // AWS IMDS over IPv6
		netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
		// Azure's WireServer: a public address every Azure VM reaches
		// (instance provisioning, health reports), so public-address
		// rules alone let a workflow's URL at it.
		netip.MustParseAddr("168.63.129.16"),
	}
	// linkLocal prefixes are refused even when the allow list covers them.
	linkLocal = []netip.Prefix{
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("fe80::/10"),
	}
	cgnat  = netip.MustParsePrefix("100.64.0.0/10")
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	defPol = mustDefault()
)

func mustDefault() *Policy {
	p, err := ParsePolicy("")
	if err != nil {
		panic(err)
	}
	return p
}

// DeniedError reports a connection refused by the egress policy. It is
// returned (wrapped in *net.OpError, and by net/http in *url.Error) from
// dials made through a Policy; use errors.As or IsDenied to detect it.
type DeniedError struct {
	// Addr is the address whose dial was refused: the resolved ip:port
	// when known, otherwise the address as passed to DialContext.
	Addr string
	// Reason says why, e.g. "private address not in --egress-allow".
	Reason string
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("egress to %s denied: %s", e.Addr, e.Reason)
}

// IsDenied reports whether err is, or wraps, a *DeniedError.
func IsDenied(err error) bool {
	var d *DeniedError
	return errors.As(err, &d)
}

// Policy is an egress policy. The zero value and a nil *Policy are not
// useful to construct directly; use ParsePolicy. A nil *Policy behaves
// like ParsePolicy(""): only public unicast addresses are reachable.
// A Policy is immutable and safe for concurrent use.
type Policy struct {
	prefixes []netip.Prefix  // allowed CIDRs and IPs (IPs as /32 or /128)
	hosts    map[string]bool // allowed host names, lower case, no trailing dot
	order    []string        // allow list entries in canonical form, for String
	guard    *ssrf.Guardian  // built-in deny list plus prefixes as allowed
}

// ParsePolicy builds a Policy from a comma-separated allow list of CIDRs
// ("127.0.0.0/8"), bare IPs ("10.1.2.3", "::1") and host names
// ("internal.example.com", "localhost"). Whitespace around entries and
// empty entries are ignored; the empty string allows nothing beyond public
// unicast addresses. Host names match exactly (case-insensitive, trailing
// dot ignored); there are no wildcards. An entry that is none of these is
// an error naming it.
func ParsePolicy(allow string) (*Policy, error) {
	p := &Policy{hosts: map[string]bool{}}
	for _, raw := range strings.Split(allow, ",") {
		entry := strings.TrimSpace(raw)
		if entry == "" {
			continue
		}
		switch {
		case strings.Contains(entry, "://"):
			return nil, fmt.Errorf("netguard: invalid %s entry %q: want a CIDR, IP or host name, not a URL", allowFlag, entry)
		case strings.Contains(entry, "/"):
			pfx, err := netip.ParsePrefix(entry)
			if err != nil {
				return nil, fmt.Errorf("netguard: invalid %s entry %q: bad CIDR: %v", allowFlag, entry, err)
			}
			pfx = unmapPrefix(pfx.Masked())
			p.prefixes = append(p.prefixes, pfx)
			p.order = append(p.order, pfx.String())
		default:
			if ip, err := netip.ParseAddr(entry); err == nil {
				if ip.Zone() != "" {
					return nil, fmt.Errorf("netguard: invalid %s entry %q: IP zones are not supported", allowFlag, entry)
				}
				ip = ip.Unmap()
				p.prefixes = append(p.prefixes, netip.PrefixFrom(ip, ip.BitLen()))
				p.order = append(p.order, ip.String())
				continue
			}
			host, err := normalizeHost(entry)
			if err != nil {
				return nil, fmt.Errorf("netguard: invalid %s entry %q: %v", allowFlag, entry, err)
			}
			if !p.hosts[host] {
				p.hosts[host] = true
				p.order = append(p.order, host)
			}
		}
	}
	var v4, v6 []netip.Prefix
	for _, pfx := range p.prefixes {
		if pfx.Addr().Is4() {
			v4 = append(v4, pfx)
		} else {
			v6 = append(v6, pfx)
		}
	}
	p.guard = ssrf.New(
		ssrf.WithAnyPort(),
		ssrf.WithNetworks("tcp4", "tcp6"),
		ssrf.WithAllowedV4Prefixes(v4...),
		ssrf.WithAllowedV6Prefixes(v6...),
	)
	return p, nil
}

// String returns the allow list in canonical form ("" when empty).
func (p *Policy) String() string {
	if p == nil {
		return ""
	}
	return strings.Join(p.order, ",")
}

// DialContext dials addr ("host:port") over TCP, refusing any connection
// the policy does not allow. If host is an allowed host name, every address
// it resolves to is allowed except link-local and metadata addresses;
// otherwise each resolved address is checked on its own just before the
// connect system call. IP literals are checked before any socket is made.
//
// Refusals are *net.OpError values wrapping a *DeniedError.
func (p *Policy) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	p = p.orDefault()
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, &net.OpError{Op: "dial", Net: network, Err: &DeniedError{
			Addr: addr, Reason: fmt.Sprintf("network %q is not permitted", network),
		}}
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	hostAllowed := false
	if ip, err := netip.ParseAddr(host); err == nil {
		// IP literal: decide now, without creating a socket. The Control
		// hook below checks again; this is just the cheap, early path.
		var opAddr net.Addr
		if n, err := strconv.ParseUint(port, 10, 16); err == nil {
			opAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, uint16(n)))
		}
		if d := p.check(ip, false, addr); d != nil {
			return nil, &net.OpError{Op: "dial", Net: network, Addr: opAddr, Err: d}
		}
	} else if h, err := normalizeHost(host); err == nil {
		hostAllowed = p.hosts[h]
	}
	d := net.Dialer{
		Timeout:   dialTimeout,
		KeepAlive: keepAlive,
		Control: func(network, address string, _ syscall.RawConn) error {
			return p.control(network, address, hostAllowed)
		},
	}
	return d.DialContext(ctx, network, addr)
}

// Transport returns a new *http.Transport, cloned from
// http.DefaultTransport, whose connections all go through p.DialContext.
// It never uses a proxy (a proxy would bypass the check) and has no
// overall request timeout: callers bound each request with a context.
func (p *Policy) Transport() *http.Transport {
	var t *http.Transport
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		t = dt.Clone()
	} else {
		t = &http.Transport{}
	}
	t.Proxy = nil
	t.OnProxyConnectResponse = nil
	t.GetProxyConnectHeader = nil
	t.ProxyConnectHeader = nil
	t.Dial = nil    //nolint:staticcheck // must not be left set: it would bypass DialContext
	t.DialTLS = nil //nolint:staticcheck // as above
	t.DialTLSContext = nil
	t.DialContext = p.orDefault().DialContext
	t.ForceAttemptHTTP2 = true
	t.TLSHandshakeTimeout = tlsHandshakeTimeout
	t.ExpectContinueTimeout = expectContinueTimeout
	t.IdleConnTimeout = idleConnTimeout
	t.ResponseHeaderTimeout = 0
	t.MaxIdleConns = maxIdleConns
	t.MaxIdleConnsPerHost = maxIdleConnsPerHost
	t.MaxResponseHeaderBytes = maxResponseHeaderSize
	return t
}

func (p *Policy) orDefault() *Policy {
	if p == nil {
		return defPol
	}
	return p
}

// control is the net.Dialer Control hook: network is "tcp4" or "tcp6" and
// address the resolved "ip:port" about to be connected to.
func (p *Policy) control(network, address string, hostAllowed bool) error {
	if network != "tcp4" && network != "tcp6" {
		return &DeniedError{Addr: address, Reason: fmt.Sprintf("network %q is not permitted", network)}
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &DeniedError{Addr: address, Reason: "unparseable address"}
	}
	if d := p.check(ap.Addr(), hostAllowed, address); d != nil {
		return d
	}
	return nil
}

// check applies the policy to ip. display is used as DeniedError.Addr.
func (p *Policy) check(ip netip.Addr, hostAllowed bool, display string) *DeniedError {
	ip = ip.WithZone("").Unmap()
	if reason := alwaysDenied(ip); reason != "" {
		return &DeniedError{Addr: display, Reason: reason}
	}
	if hostAllowed {
		return nil
	}
	// The guardian checks the allowed prefixes first, then the ssrf deny
	// lists (IANA special purpose registries, IPv6 outside 2000::/3).
	if err := p.guard.SafeAddr(ip); err != nil {
		return &DeniedError{Addr: display, Reason: classify(ip) + " not in " + allowFlag}
	}
	return nil
}

// alwaysDenied returns a reason if ip may never be dialled, else "".
// IPv4 addresses embedded in the NAT64 well-known prefix are checked too.
func alwaysDenied(ip netip.Addr) string {
	if nat64.Contains(ip) {
		b := ip.As16()
		if r := alwaysDenied(netip.AddrFrom4([4]byte(b[12:]))); r != "" {
			return r + " (via NAT64)"
		}
	}
	for _, m := range metadataAddrs {
		if ip == m {
			return "cloud metadata address is never allowed"
		}
	}
	for _, pfx := range linkLocal {
		if pfx.Contains(ip) {
			return "link-local address is never allowed"
		}
	}
	return ""
}

// classify names the kind of non-public address ip is, for messages.
func classify(ip netip.Addr) string {
	switch {
	case ip.IsLoopback():
		return "loopback address"
	case ip.IsPrivate():
		return "private address"
	case cgnat.Contains(ip):
		return "shared (CGNAT) address"
	case ip.IsUnspecified():
		return "unspecified address"
	case ip.IsMulticast():
		return "multicast address"
	default:
		return "reserved address"
	}
}

// unmapPrefix turns an IPv4-mapped IPv6 prefix (::ffff:a.b.c.d/n, n>=96)
// into the equivalent IPv4 prefix; dialled addresses are unmapped too.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

// normalizeHost lower-cases a DNS host name, drops one trailing dot and
// validates its syntax.
func normalizeHost(s string) (string, error) {
	h := strings.ToLower(strings.TrimSuffix(s, "."))
	if h == "" {
		return "", errors.New("empty host name")
	}
	if len(h) > 253 {
		return "", errors.New("host name longer than 253 characters")
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return "", errors.New("not a CIDR, IP or valid host name")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", errors.New("not a CIDR, IP or valid host name")
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", errors.New("not a CIDR, IP or valid host name")
			}
		}
	}
	if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" {
		// "10.1.2" or "300.1.1.1": a mistyped IP, not a host name.
		return "", errors.New("not a valid IP address")
	}
	return h, nil
}
