package ferry_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// TestEngineCutsATricklingBody: the engine's handler (the API and the
// webhook endpoint) answers a request whose body does not arrive within
// Config.BodyReadTimeout instead of waiting for it.
func TestEngineCutsATricklingBody(t *testing.T) {
	srv := ferrytest.Start(t, func(c *ferry.Config) { c.BodyReadTimeout = 200 * time.Millisecond })
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /wh/wh_nothing HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("the server still waits for the body after 10 s")
		}
		return // the connection was closed: not held
	}
	resp.Body.Close()
	if resp.StatusCode < 400 {
		t.Errorf("a body that never came: %d", resp.StatusCode)
	}
}
