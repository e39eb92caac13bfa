package httpstep_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/netguard"
	"github.com/ferryhq/ferry/internal/step/httpstep"
)

// testDeadline bounds every wait in these tests so that a bug fails a test
// instead of hanging it.
const testDeadline = 5 * time.Second

func loopbackExecutor(t *testing.T) *httpstep.Executor {
	t.Helper()
	p, err := netguard.ParsePolicy("127.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	tr := p.Transport()
	t.Cleanup(tr.CloseIdleConnections)
	return httpstep.New(tr)
}

func server(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	t.Cleanup(cancel)
	return ctx
}

type seen struct {
	method string
	header http.Header
	host   string
	body   string
}

// recorder returns a server that reports each request on the channel.
func recorder(t *testing.T) (*httptest.Server, <-chan seen) {
	ch := make(chan seen, 10)
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ch <- seen{r.Method, r.Header.Clone(), r.Host, string(b)}
		w.Header().Add("X-Multi", "first")
		w.Header().Add("X-Multi", "second")
		w.Header().Set("content-type", "text/plain")
		io.WriteString(w, "hello")
	})
	return srv, ch
}

func recv(t *testing.T, ch <-chan seen) seen {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(testDeadline):
		t.Fatal("server saw no request")
		return seen{}
	}
}

func TestIdentityHeaders(t *testing.T) {
	srv, ch := recorder(t)
	ex := loopbackExecutor(t)
	for attempt := 1; attempt <= 2; attempt++ {
		res := ex.Do(ctxT(t), httpstep.Request{URL: srv.URL, RunID: "run-42", Step: "charge", Attempt: attempt})
		if res.Err != nil || res.StatusCode != 200 {
			t.Fatalf("attempt %d: %+v", attempt, res)
		}
		h := recv(t, ch).header
		want := map[string]string{
			"Idempotency-Key": "run-42:charge",
			"X-Ferry-Run-Id":  "run-42",
			"X-Ferry-Step":    "charge",
			"X-Ferry-Attempt": strconv.Itoa(attempt),
			"User-Agent":      "ferry/1",
		}
		for k, v := range want {
			if got := h.Get(k); got != v {
				t.Errorf("attempt %d: %s = %q, want %q", attempt, k, got, v)
			}
		}
	}

	// User-provided Idempotency-Key and User-Agent win; identity headers
	// cannot be spoofed.
	res := ex.Do(ctxT(t), httpstep.Request{
		URL: srv.URL, RunID: "run-42", Step: "charge", Attempt: 3,
		Headers: map[string]string{
			"idempotency-key": "user-key",
			"User-Agent":      "my-agent/2",
			"X-Ferry-Attempt": "99",
		},
	})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	h := recv(t, ch).header
	if h.Get("Idempotency-Key") != "user-key" || h.Get("User-Agent") != "my-agent/2" || h.Get("X-Ferry-Attempt") != "3" {
		t.Errorf("headers: %v", h)
	}

	// Executor.UserAgent is the default when the request sets none.
	ex.UserAgent = "ferry/1 (test)"
	ex.Do(ctxT(t), httpstep.Request{URL: srv.URL, RunID: "r", Step: "s", Attempt: 1})
	if ua := recv(t, ch).header.Get("User-Agent"); ua != "ferry/1 (test)" {
		t.Errorf("User-Agent = %q", ua)
	}
}

func TestRequestAndResponse(t *testing.T) {
	srv, ch := recorder(t)
	ex := loopbackExecutor(t)

	// Method, headers and body are sent; JSON is the default content type.
	res := ex.Do(ctxT(t), httpstep.Request{
		URL: srv.URL + "/path?q=1", Method: "PUT",
		Headers: map[string]string{"X-Custom": "v1", "Host": "api.example.com"},
		Body:    []byte(`{"a":1}`),
	})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	s := recv(t, ch)
	if s.method != "PUT" || s.body != `{"a":1}` || s.header.Get("X-Custom") != "v1" ||
		s.header.Get("Content-Type") != "application/json" || s.host != "api.example.com" {
		t.Errorf("server saw %+v", s)
	}
	if res.StatusCode != 200 || string(res.Body) != "hello" || res.Truncated || res.Retryable || res.Duration <= 0 {
		t.Errorf("result %+v", res)
	}
	if res.Headers["X-Multi"] != "first" || res.Headers["Content-Type"] != "text/plain" {
		t.Errorf("result headers %v", res.Headers)
	}

	// A user Content-Type wins.
	ex.Do(ctxT(t), httpstep.Request{URL: srv.URL, Body: []byte("a=b"), Headers: map[string]string{"content-type": "application/x-www-form-urlencoded"}})
	if ct := recv(t, ch).header.Get("Content-Type"); ct != "application/x-www-form-urlencoded" {
		t.Errorf("Content-Type = %q", ct)
	}

	// No body: POST by default, no Content-Type.
	ex.Do(ctxT(t), httpstep.Request{URL: srv.URL})
	s = recv(t, ch)
	if s.method != "POST" || s.body != "" || s.header.Get("Content-Type") != "" {
		t.Errorf("server saw %+v", s)
	}

	// An empty non-nil body is a (JSON) body.
	ex.Do(ctxT(t), httpstep.Request{URL: srv.URL, Method: "PATCH", Body: []byte{}})
	s = recv(t, ch)
	if s.method != "PATCH" || s.header.Get("Content-Type") != "application/json" {
		t.Errorf("server saw %+v", s)
	}
}

func TestTruncation(t *testing.T) {
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/endless" {
			chunk := []byte(strings.Repeat("x", 32<<10))
			for {
				if _, err := w.Write(chunk); err != nil {
					return // client went away
				}
			}
		}
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Write([]byte(strings.Repeat("y", n)))
	})
	ex := loopbackExecutor(t)
	for _, tc := range []struct {
		n         int
		wantLen   int
		truncated bool
	}{
		{0, 0, false},
		{httpstep.MaxBody - 1, httpstep.MaxBody - 1, false},
		{httpstep.MaxBody, httpstep.MaxBody, false},
		{httpstep.MaxBody + 1, httpstep.MaxBody, true},
		{4 * httpstep.MaxBody, httpstep.MaxBody, true},
	} {
		res := ex.Do(ctxT(t), httpstep.Request{URL: fmt.Sprintf("%s/?n=%d", srv.URL, tc.n), Method: "GET"})
		if res.Err != nil || len(res.Body) != tc.wantLen || res.Truncated != tc.truncated {
			t.Errorf("n=%d: err=%v len=%d truncated=%v; want len=%d truncated=%v", tc.n, res.Err, len(res.Body), res.Truncated, tc.wantLen, tc.truncated)
		}
	}
	res := ex.Do(ctxT(t), httpstep.Request{URL: srv.URL + "/endless", Method: "GET"})
	if res.Err != nil || len(res.Body) != httpstep.MaxBody || !res.Truncated {
		t.Errorf("endless: err=%v len=%d truncated=%v", res.Err, len(res.Body), res.Truncated)
	}
}

func TestClassification(t *testing.T) {
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/redirect":
			http.Redirect(w, r, "/status/200", http.StatusFound)
			return
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
			return
		case "/to-app":
			w.Header().Set("Location", "myapp://callback?code=1")
			w.WriteHeader(http.StatusFound)
			return
		case "/to-ftp":
			w.Header().Set("Location", "ftp://example.com/file")
			w.WriteHeader(http.StatusMovedPermanently)
			return
		case "/no-host":
			w.Header().Set("Location", "http:///x")
			w.WriteHeader(http.StatusTemporaryRedirect)
			return
		case "/bad-location":
			w.Header().Set("Location", "http://[::1?sig=SECRETSIG")
			w.WriteHeader(http.StatusFound)
			return
		}
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
		if ra := r.URL.Query().Get("retry_after"); ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		w.WriteHeader(code)
	})
	ex := loopbackExecutor(t)

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + closed.Addr().String() + "/"
	closed.Close()

	tests := []struct {
		name       string
		path       string
		url        string
		ex         *httpstep.Executor
		timeout    time.Duration
		wantStatus int
		wantErr    bool
		retryable  bool
		retryAfter time.Duration
	}{
		{name: "200", path: "/status/200", wantStatus: 200},
		{name: "201", path: "/status/201", wantStatus: 201},
		{name: "302 followed", path: "/redirect", wantStatus: 200},
		{name: "redirect loop stops with last 302", path: "/loop", wantStatus: 302},
		{name: "redirect to another scheme is the 302", path: "/to-app", wantStatus: 302},
		{name: "redirect to ftp is the 301", path: "/to-ftp", wantStatus: 301},
		{name: "redirect without a host is the 307", path: "/no-host", wantStatus: 307},
		{name: "redirect to a Location that is not a URL is final", path: "/bad-location", wantErr: true},
		{name: "304", path: "/status/304", wantStatus: 304},
		{name: "400", path: "/status/400", wantStatus: 400},
		{name: "404", path: "/status/404", wantStatus: 404},
		{name: "408", path: "/status/408", wantStatus: 408, retryable: true},
		{name: "429 Retry-After", path: "/status/429?retry_after=3", wantStatus: 429, retryable: true, retryAfter: 3 * time.Second},
		{name: "429 bad Retry-After", path: "/status/429?retry_after=soon", wantStatus: 429, retryable: true},
		{name: "500", path: "/status/500", wantStatus: 500, retryable: true},
		{name: "500 ignores Retry-After", path: "/status/500?retry_after=3", wantStatus: 500, retryable: true},
		{name: "503 Retry-After", path: "/status/503?retry_after=7", wantStatus: 503, retryable: true, retryAfter: 7 * time.Second},
		{name: "connection refused", url: closedURL, wantErr: true, retryable: true},
		{name: "denied egress", path: "/status/200", ex: httpstep.New(nil), wantErr: true},
		{name: "zero Executor is default-denied", path: "/status/200", ex: &httpstep.Executor{}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := ex
			if tc.ex != nil {
				e = tc.ex
			}
			u := tc.url
			if u == "" {
				u = srv.URL + tc.path
			}
			res := e.Do(ctxT(t), httpstep.Request{URL: u, Method: "GET", Timeout: tc.timeout})
			if res.Err != nil && strings.Contains(res.Err.Error(), "SECRETSIG") {
				t.Errorf("the error quotes the Location: %v", res.Err)
			}
			if res.StatusCode != tc.wantStatus || (res.Err != nil) != tc.wantErr ||
				res.Retryable != tc.retryable || res.RetryAfter != tc.retryAfter {
				t.Errorf("got status=%d err=%v retryable=%v retryAfter=%v; want status=%d err=%v retryable=%v retryAfter=%v",
					res.StatusCode, res.Err, res.Retryable, res.RetryAfter, tc.wantStatus, tc.wantErr, tc.retryable, tc.retryAfter)
			}
		})
	}
}

func TestDeniedEgressError(t *testing.T) {
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		t.Error("server reached")
	})
	res := httpstep.New(nil).Do(ctxT(t), httpstep.Request{URL: srv.URL})
	var de *netguard.DeniedError
	if !errors.As(res.Err, &de) || res.Retryable || res.StatusCode != 0 {
		t.Fatalf("got %+v", res)
	}
	want := "egress to " + strings.TrimPrefix(srv.URL, "http://") + " denied: loopback address not in --egress-allow"
	if res.Err.Error() != want {
		t.Errorf("Err = %q, want %q", res.Err, want)
	}
}

// blockingServer's handler reports each request on arrived, then blocks
// until the client goes away and reports that on gone.
func blockingServer(t *testing.T) (srv *httptest.Server, arrived, gone <-chan struct{}) {
	a := make(chan struct{}, 1)
	g := make(chan struct{}, 1)
	srv = server(t, func(w http.ResponseWriter, r *http.Request) {
		a <- struct{}{}
		<-r.Context().Done()
		g <- struct{}{}
	})
	return srv, a, g
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(testDeadline):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestTimeout(t *testing.T) {
	srv, arrived, gone := blockingServer(t)
	res := loopbackExecutor(t).Do(ctxT(t), httpstep.Request{URL: srv.URL, Timeout: 100 * time.Millisecond})
	wait(t, arrived, "request")
	wait(t, gone, "server to see the client go away")

	var te *httpstep.TimeoutError
	if !errors.As(res.Err, &te) || !res.Retryable || res.StatusCode != 0 {
		t.Fatalf("got %+v", res)
	}
	if res.Err.Error() != "request timed out after 100ms" || !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Errorf("Err = %q", res.Err)
	}
	if got := (&httpstep.TimeoutError{After: httpstep.DefaultTimeout}).Error(); got != "request timed out after 30s" {
		t.Errorf("default timeout message %q", got)
	}
}

func TestTimeoutWhileReadingBody(t *testing.T) {
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	res := loopbackExecutor(t).Do(ctxT(t), httpstep.Request{URL: srv.URL, Timeout: 200 * time.Millisecond})
	var te *httpstep.TimeoutError
	if !errors.As(res.Err, &te) || !res.Retryable || res.StatusCode != 200 || string(res.Body) != "partial" {
		t.Fatalf("got %+v", res)
	}
}

// TestRetryAfterWhenBodyBreaksOff: a 503 or 429 whose body breaks off is
// retried as its status is, and so when its Retry-After says.
func TestRetryAfterWhenBodyBreaksOff(t *testing.T) {
	srv := server(t, func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		w.Header().Set("Retry-After", "90")
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(code)
		w.Write([]byte("short")) // 95 bytes short: the body breaks off
	})
	for _, code := range []int{429, 503} {
		res := loopbackExecutor(t).Do(ctxT(t), httpstep.Request{URL: fmt.Sprintf("%s/%d", srv.URL, code), Method: "GET"})
		if res.Err == nil || !res.Retryable || res.StatusCode != code || string(res.Body) != "short" || res.RetryAfter != 90*time.Second {
			t.Errorf("%d: got %+v, want a retryable error with RetryAfter 1m30s", code, res)
		}
	}
}

func TestCancelAbortsPromptly(t *testing.T) {
	srv, arrived, gone := blockingServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	ex := loopbackExecutor(t)
	done := make(chan httpstep.Result, 1)
	go func() {
		done <- ex.Do(ctx, httpstep.Request{URL: srv.URL, Timeout: time.Hour})
	}()
	wait(t, arrived, "request")
	cancel()
	var res httpstep.Result
	select {
	case res = <-done:
	case <-time.After(testDeadline):
		t.Fatal("Do did not return after cancel")
	}
	wait(t, gone, "server to see the client go away")
	if !errors.Is(res.Err, context.Canceled) || res.Retryable || res.StatusCode != 0 {
		t.Fatalf("got %+v", res)
	}
}

func TestInvalidRequest(t *testing.T) {
	ex := loopbackExecutor(t)
	for _, r := range []httpstep.Request{
		{URL: "ftp://127.0.0.1/x"},
		{URL: "http:///nohost"},
		{URL: "://bad"},
		{URL: "http://127.0.0.1/", Method: "GE T"},
		{URL: "http://127.0.0.1/", Headers: map[string]string{"Bad Name": "v"}},
		{URL: "http://127.0.0.1/", Headers: map[string]string{"X-Ok": "a\r\nInjected: 1"}},
	} {
		res := ex.Do(ctxT(t), r)
		if !errors.Is(res.Err, httpstep.ErrInvalidRequest) || res.Retryable {
			t.Errorf("%+v: got %+v", r, res)
		}
	}
}

func TestBackoff(t *testing.T) {
	fixed := func(f float64) func() float64 { return func() float64 { return f } }
	tests := []struct {
		attempt    int
		retryAfter time.Duration
		rnd        float64
		want       time.Duration
	}{
		{1, 0, 0, 500 * time.Millisecond},
		{1, 0, 0.5, 750 * time.Millisecond},
		{2, 0, 0, time.Second},
		{3, 0, 0, 2 * time.Second},
		{3, 0, 0.5, 3 * time.Second},
		{9, 0, 0, 128 * time.Second},      // 256s * 0.5
		{10, 0, 0, 150 * time.Second},     // 512s capped to 300s, * 0.5
		{10, 0, 0.5, 225 * time.Second},   // 300s * 0.75
		{1000, 0, 0, 150 * time.Second},   // no overflow
		{0, 0, 0, 500 * time.Millisecond}, // attempts below 1 count as 1
		{-3, 0, 0.5, 750 * time.Millisecond},
		// Retry-After: max(retryAfter, computed), capped at 1h.
		{1, 3 * time.Second, 0.5, 3 * time.Second},
		{5, 3 * time.Second, 0.5, 12 * time.Second},
		{1, 2 * time.Hour, 0, time.Hour},
		{20, 10 * time.Minute, 0.99, 10 * time.Minute},
		// Out-of-range rnd is clamped.
		{2, 0, -1, time.Second},
		{2, 0, 7, 2*time.Second - 1},
	}
	for _, tc := range tests {
		if got := httpstep.Backoff(tc.attempt, tc.retryAfter, fixed(tc.rnd)); got != tc.want {
			t.Errorf("Backoff(%d, %v, %v) = %v, want %v", tc.attempt, tc.retryAfter, tc.rnd, got, tc.want)
		}
	}
	// The jitter factor stays below 1 even for rnd just below 1.
	if got := httpstep.Backoff(3, 0, fixed(0.9999999999999999)); got >= 4*time.Second {
		t.Errorf("Backoff with rnd≈1 = %v, want < 4s", got)
	}
	// nil rnd uses the global source and stays in range.
	for range 100 {
		if got := httpstep.Backoff(4, 0, nil); got < 4*time.Second || got >= 8*time.Second {
			t.Fatalf("Backoff(4, 0, nil) = %v", got)
		}
	}
}
