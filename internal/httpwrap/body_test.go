package httpwrap_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/httpwrap"
)

// TestBodyDeadlineCutsATricklingBody: a request whose body does not
// arrive within the deadline ends (its read fails) instead of holding
// the handler; a request whose body came in time is not cut short
// afterwards, however long its handler then waits (a long poll; Go's
// server lifts a read deadline at the body's end too, and the middleware
// does so itself rather than count on it).
func TestBodyDeadlineCutsATricklingBody(t *testing.T) {
	readErr := make(chan error, 1)
	h := httpwrap.BodyDeadline(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		if r.URL.Path == "/slow" {
			readErr <- err
			http.Error(w, "body", http.StatusBadRequest)
			return
		}
		select { // a long poll after the body was read whole
		case <-r.Context().Done():
			http.Error(w, "cut short", http.StatusServiceUnavailable)
		case <-time.After(600 * time.Millisecond):
			io.WriteString(w, "waited")
		}
	}), 200*time.Millisecond)
	srv := httptest.NewServer(h)
	defer srv.Close()

	// A body of 100 bytes announced, one sent.
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("the trickling body was read whole")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler still waits for the body")
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
		resp.Body.Close() // answered, or the connection closed: either way, not held
	}

	resp, err := http.Post(srv.URL+"/poll", "application/json", strings.NewReader(`{"types": ["a.%"]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "waited" {
		t.Errorf("a long poll past the deadline, its body read in time: %d %q, want 200 waited", resp.StatusCode, b)
	}
}
