package httpstep

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/internal/netguard"
	"golang.org/x/net/http/httpguts"
)

const (
	// MaxBody is the most response body bytes kept in a Result.
	MaxBody = 256 << 10
	// DefaultTimeout is the per-attempt timeout used when Request.Timeout is 0.
	DefaultTimeout = 30 * time.Second
	// DefaultUserAgent is sent when the request sets no User-Agent.
	DefaultUserAgent = "ferry/1"
	// MaxRedirects is how many redirects one attempt follows.
	MaxRedirects = 10

	backoffBase   = time.Second
	backoffMax    = 5 * time.Minute
	retryAfterMax = time.Hour
)

// ErrInvalidRequest is wrapped by the Err of a Result for a request that
// could not be sent as given (bad URL, scheme, method or header). Such
// results are not retryable.
var ErrInvalidRequest = errors.New("invalid HTTP step request")

// TimeoutError is the Err of a Result whose attempt ran out of its
// per-attempt timeout. It matches context.DeadlineExceeded with errors.Is.
type TimeoutError struct {
	After time.Duration
}

func (e *TimeoutError) Error() string { return "request timed out after " + e.After.String() }

// Unwrap returns context.DeadlineExceeded.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// Timeout reports true, as net.Error does for timeouts.
func (e *TimeoutError) Timeout() bool { return true }

// Request is one attempt of an HTTP step.
type Request struct {
	URL     string
	Method  string            // "" means POST
	Headers map[string]string // user headers; a "Host" entry sets the Host header
	Body    []byte            // nil = no body; non-nil without Content-Type is sent as application/json
	Timeout time.Duration     // per attempt; 0 = DefaultTimeout

	// Identity, sent as X-Ferry-Run-Id, X-Ferry-Step, X-Ferry-Attempt and
	// Idempotency-Key: <RunID>:<Step>. Empty/zero values are not sent.
	RunID, Step string
	Attempt     int
}

// Result is the outcome of one attempt.
type Result struct {
	StatusCode int               // 0 when no response
	Headers    map[string]string // response headers, first value each, canonical keys
	Body       []byte            // at most MaxBody bytes
	Truncated  bool              // the response had more than MaxBody bytes
	Duration   time.Duration
	// Err is set when no complete response arrived: network error,
	// timeout (*TimeoutError), denied egress (*netguard.DeniedError),
	// invalid request (wraps ErrInvalidRequest), cancellation of the
	// caller's context (wraps ctx.Err()), or failure while reading the
	// body (StatusCode, Headers and the part of Body that came are then
	// set too). A non-2xx response is not an Err.
	Err error
	// Retryable: network errors, timeouts, 408, 429, 5xx. Not denied
	// egress, invalid requests, caller cancellation, other 4xx, 1xx-3xx.
	// A body that broke off is retryable as its status is, and a 2xx's
	// as a network error.
	Retryable bool
	// RetryAfter is the parsed Retry-After header (seconds or HTTP date)
	// on 429 and 503 responses, else 0.
	RetryAfter time.Duration
}

// Executor sends HTTP step attempts. The zero value is usable and behaves
// like New(nil).
type Executor struct {
	Client    *http.Client
	UserAgent string // default User-Agent; "" means DefaultUserAgent
}

// New returns an Executor whose client uses t, has no overall timeout
// (each attempt is bounded by its own Timeout) and follows at most
// MaxRedirects redirects; after that the last redirect response is
// returned as the result (a 3xx, not retryable), as is a redirect to
// a URL that is not http or https with a host. A nil t means
// netguard's default policy (public addresses only) — never
// http.DefaultTransport, which has no egress control.
func New(t http.RoundTripper) *Executor {
	if t == nil {
		t = (*netguard.Policy)(nil).Transport()
	}
	return &Executor{Client: newClient(t), UserAgent: DefaultUserAgent}
}

func newClient(t http.RoundTripper) *http.Client {
	return &http.Client{
		Transport: t,
		CheckRedirect: func(next *http.Request, via []*http.Request) error {
			if len(via) >= MaxRedirects {
				return http.ErrUseLastResponse
			}
			// A Location that cannot be followed (ftp:, an app's own
			// scheme, no host) is the server's answer, the same on
			// every attempt: the 3xx is the result, final. Followed,
			// it failed as a network error and was retried.
			if s := next.URL.Scheme; s != "http" && s != "https" || next.URL.Host == "" {
				return http.ErrUseLastResponse
			}
			return nil
		},
	}
}

var defaultClient = sync.OnceValue(func() *http.Client {
	return New(nil).Client
})

// Do performs one attempt. It never panics on bad input and always returns
// a Result; see Result for how outcomes are reported. Cancelling ctx
// aborts the attempt promptly.
func (e *Executor) Do(ctx context.Context, r Request) Result {
	start := time.Now()
	res := e.do(ctx, r)
	res.Duration = time.Since(start)
	return res
}

func (e *Executor) do(ctx context.Context, r Request) Result {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	actx, cancel := context.WithTimeoutCause(ctx, timeout, &TimeoutError{After: timeout})
	defer cancel()

	req, err := e.build(actx, r)
	if err != nil {
		return Result{Err: err}
	}
	client := defaultClient()
	if e != nil && e.Client != nil {
		client = e.Client
	}
	resp, err := client.Do(req)
	if err != nil {
		var res Result
		res.Err, res.Retryable = failure(ctx, actx, err)
		return res
	}
	defer resp.Body.Close()

	res := Result{
		StatusCode: resp.StatusCode,
		Headers:    make(map[string]string, len(resp.Header)),
	}
	for k, vs := range resp.Header {
		if len(vs) > 0 {
			res.Headers[textproto.CanonicalMIMEHeaderKey(k)] = vs[0]
		}
	}
	// Before the body: a 429 or 503 whose body breaks off is retried as
	// its status is, and its Retry-After still says when.
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		res.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	}
	// Read one byte more than we keep, to tell "exactly MaxBody" from
	// "more". Closing the body early drops the connection rather than
	// draining it.
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody+1))
	if len(body) > MaxBody {
		body = body[:MaxBody:MaxBody]
		res.Truncated = true
	}
	res.Body = body
	if err != nil {
		// The status line came: a status that is final at once (a 3xx,
		// a 4xx but 408 and 429) stays final; a 2xx is not a success,
		// and is retried as a network error is.
		var retry bool
		res.Err, retry = failure(ctx, actx, fmt.Errorf("reading response body: %w", err))
		res.Retryable = retry && (ok2xx(resp.StatusCode) || retryableStatus(resp.StatusCode))
		return res
	}
	res.Retryable = retryableStatus(resp.StatusCode)
	return res
}

// failure turns a client error into Result.Err and Result.Retryable.
func failure(parent, attempt context.Context, err error) (error, bool) {
	// The client's errors name the request's URL, whose query may hold a
	// secret (an API key): the error becomes the step's error text, its
	// events and its spans, which must not show it.
	var ue *url.Error
	if errors.As(err, &ue) {
		if strings.HasPrefix(ue.Err.Error(), "failed to parse Location header") {
			// A redirect whose Location is not a URL (net/http has no
			// error type for it): the same answer comes every time, so it
			// is final, and the Location, which may be a signed URL, is
			// not quoted.
			return fmt.Errorf("%s %s: the server redirected to a Location that is not a URL", ue.Op, RedactURL(ue.URL)), false
		}
		err = &url.Error{Op: ue.Op, URL: RedactURL(ue.URL), Err: ue.Err}
	}
	var denied *netguard.DeniedError
	if errors.As(err, &denied) {
		return denied, false
	}
	if errors.Is(err, ErrInvalidRequest) {
		return err, false
	}
	if parent.Err() != nil {
		return fmt.Errorf("request aborted: %w", parent.Err()), false
	}
	var te *TimeoutError
	if attempt.Err() != nil && errors.As(context.Cause(attempt), &te) {
		return te, true
	}
	return err, true
}

// RedactURL is raw without what may be a secret: its user information,
// its query's values (OpenTelemetry's HTTP conventions) and its fragment.
// "" when raw is not a URL.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	if u.User != nil {
		u.User = url.UserPassword("REDACTED", "REDACTED")
	}
	u.Fragment, u.RawFragment = "", ""
	if u.RawQuery != "" {
		u.RawQuery = RedactQuery(u.RawQuery)
	}
	return u.String()
}

// RedactQuery is a URL's raw query with every value replaced by REDACTED,
// and a parameter without one ("?sk_live_abc", a token given as the key)
// replaced whole: keeping it, as a key, showed the secret.
func RedactQuery(query string) string {
	pairs := strings.Split(query, "&")
	for i, p := range pairs {
		if k, _, ok := strings.Cut(p, "="); ok {
			pairs[i] = k + "=REDACTED"
		} else if p != "" {
			pairs[i] = "REDACTED"
		}
	}
	return strings.Join(pairs, "&")
}

func ok2xx(code int) bool { return code >= 200 && code <= 299 }

func retryableStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || (code >= 500 && code <= 599)
}

// build makes the outbound request for r.
func (e *Executor) build(ctx context.Context, r Request) (*http.Request, error) {
	u, err := url.Parse(r.URL)
	if err != nil {
		return nil, fmt.Errorf("%w: bad URL: %v", ErrInvalidRequest, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: URL scheme must be http or https, got %q", ErrInvalidRequest, u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%w: URL has no host", ErrInvalidRequest)
	}
	method := r.Method
	if method == "" {
		method = http.MethodPost
	}
	if !httpguts.ValidHeaderFieldName(method) { // a method is a token too
		return nil, fmt.Errorf("%w: bad method %q", ErrInvalidRequest, method)
	}
	var body io.Reader
	if r.Body != nil {
		body = bytes.NewReader(r.Body)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.URL, body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	for k, v := range r.Headers {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, fmt.Errorf("%w: bad header name %q", ErrInvalidRequest, k)
		}
		if !httpguts.ValidHeaderFieldValue(v) {
			return nil, fmt.Errorf("%w: bad value for header %q", ErrInvalidRequest, k)
		}
		if http.CanonicalHeaderKey(k) == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	if r.Body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if req.Header.Get("User-Agent") == "" {
		ua := DefaultUserAgent
		if e != nil && e.UserAgent != "" {
			ua = e.UserAgent
		}
		req.Header.Set("User-Agent", ua)
	}
	if r.RunID != "" {
		if req.Header.Get("Idempotency-Key") == "" {
			req.Header.Set("Idempotency-Key", r.RunID+":"+r.Step)
		}
		req.Header.Set("X-Ferry-Run-Id", r.RunID)
	}
	if r.Step != "" {
		req.Header.Set("X-Ferry-Step", r.Step)
	}
	if r.Attempt > 0 {
		req.Header.Set("X-Ferry-Attempt", strconv.Itoa(r.Attempt))
	}
	return req, nil
}

// parseRetryAfter parses a Retry-After value: delay-seconds or an HTTP
// date (relative to now). Missing, malformed, negative or past values
// give 0.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		if n > int64(math.MaxInt64/time.Second) {
			n = int64(math.MaxInt64 / time.Second)
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// Backoff returns how long to wait before the attempt after attempt
// (1-based: the attempt that just failed).
//
// The delay is 1s * 2^(attempt-1), capped at 5 minutes, multiplied by a
// jitter factor 0.5 + 0.5*rnd() in [0.5, 1.0). If retryAfter > 0 (the
// server's Retry-After), the result is max(retryAfter, delay) capped at
// 1 hour. rnd must return values in [0, 1) (out-of-range values are
// clamped); nil means math/rand/v2.Float64. Attempts below 1 count as 1.
func Backoff(attempt int, retryAfter time.Duration, rnd func() float64) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := backoffMax
	if attempt-1 < 20 { // 2^19 s is far past the cap; avoids overflow
		if b := backoffBase << (attempt - 1); b < backoffMax {
			d = b
		}
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	f := rnd()
	if !(f >= 0) { // also catches NaN
		f = 0
	}
	factor := 0.5 + 0.5*f
	if factor >= 1 {
		factor = math.Nextafter(1, 0)
	}
	d = time.Duration(float64(d) * factor)
	if retryAfter > 0 {
		d = max(d, retryAfter)
		d = min(d, retryAfterMax)
	}
	return d
}
