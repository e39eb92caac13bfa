// Package netguard owns Ferry's egress control: it decides which network
// addresses outbound HTTP steps may connect to, defending against
// server-side request forgery (SSRF).
//
// The check runs in the [net.Dialer] Control hook (built on
// code.dny.dev/ssrf), so it sees the IP address that is actually being
// dialled, after DNS resolution, for every connection including those made
// while following redirects. DNS rebinding therefore cannot smuggle a
// request to a private address past the policy.
//
// Rules, in order:
//
//   - Link-local addresses (169.254.0.0/16, fe80::/10) and cloud metadata
//     endpoints (169.254.169.254, fd00:ec2::254, 100.100.100.200, Azure's
//     WireServer 168.63.129.16) are always
//     refused, whatever the allow list says.
//   - A connection is allowed if the dialled IP is inside an allowed CIDR or
//     IP, or if the host name written in the URL (before resolution) is an
//     allowed host name.
//   - Otherwise the address must be public unicast: private (RFC 1918,
//     fc00::/7), CGNAT (100.64.0.0/10), loopback and the other special
//     purpose ranges denied by code.dny.dev/ssrf are refused.
//
// Only TCP is dialled; any port is permitted. A Policy's Transport never
// uses an HTTP proxy, since a proxy would make the dialled address
// meaningless.
//
// Import rules: netguard is a leaf package. It must not import any other
// github.com/ferryhq/ferry/internal/... package; it depends only on the
// standard library and code.dny.dev/ssrf.
package netguard
