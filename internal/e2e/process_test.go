package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// built is one binary compiled for the tests, once per test process.
type built struct {
	once sync.Once
	path string
	err  error
}

var builds sync.Map // package path -> *built

// buildBinary compiles the main package pkg once per test process.
func buildBinary(t *testing.T, pkg, name string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(pkg, &built{})
	b := v.(*built)
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "ferry-"+name+"-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, name)
		if out, err := exec.Command("go", "build", "-o", b.path, pkg).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// ferryBinary builds cmd/ferry.
func ferryBinary(t *testing.T) string {
	return buildBinary(t, "github.com/ferryhq/ferry/cmd/ferry", "ferry")
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// proc is a ferry server process.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string
	logs *bytes.Buffer
	mu   sync.Mutex
	done chan struct{}
}

func startServer(t *testing.T, addr, database string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"server", "--listen", addr, "--database", database, "--egress-allow", "127.0.0.0/8", "--lease", "2s", "--log-level", "warn"}, extra...)
	p := spawn(t, exec.Command(ferryBinary(t), args...))
	p.addr = addr
	t.Cleanup(func() { p.kill() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		select {
		case <-p.done:
			t.Fatalf("server exited early:\n%s", p.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not become healthy:\n%s", p.output())
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

// spawn starts cmd with the test API key, collecting its output.
func spawn(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	cmd.Env = append(os.Environ(), "FERRY_API_KEY="+apiKey)
	p := &proc{t: t, cmd: cmd, logs: &bytes.Buffer{}, done: make(chan struct{})}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			p.mu.Lock()
			p.logs.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
	}()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); pw.Close(); close(p.done) }()
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// kill sends SIGKILL: no shutdown code runs.
func (p *proc) kill() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// client is a minimal API client for process tests.
type client struct {
	t    *testing.T
	base string
}

func (c client) do(method, path, body string, headers ...string) (int, map[string]any) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

func (c client) must(want int, method, path, body string) map[string]any {
	c.t.Helper()
	code, out := c.do(method, path, body)
	if code != want {
		c.t.Fatalf("%s %s: %d, want %d: %v", method, path, code, want, out)
	}
	return out
}

func (c client) trigger(wf, input string) string {
	c.t.Helper()
	return c.must(201, "POST", "/api/v1/workflows/"+wf+"/trigger", input)["data"].(map[string]any)["run_id"].(string)
}

func (c client) run(id string) map[string]any {
	c.t.Helper()
	return c.must(200, "GET", "/api/v1/runs/"+id, "")["data"].(map[string]any)
}

// waitAll polls until cond holds for every run.
func (c client) waitAll(ids []string, what string, timeout time.Duration, cond func(map[string]any) bool) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for _, id := range ids {
		for {
			r := c.run(id)
			if cond(r) {
				break
			}
			if time.Now().After(deadline) {
				b, _ := json.MarshalIndent(r, "", "  ")
				c.t.Fatalf("timed out waiting for %s; run:\n%s", what, b)
			}
			time.Sleep(20 * time.Millisecond) // polling interval
		}
	}
}
