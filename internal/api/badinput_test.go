package api_test

// Bad input through the API: each case once answered 500 (on Postgres),
// or was stored and answered back as it came, or took the server's
// memory; now each is a 4xx with a code and the JSON path, and valid
// requests batched with a bad one are not failed by it.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/clock"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

type fsrv struct {
	t   *testing.T
	url string
}

type fresp struct {
	status int
	raw    []byte
	body   map[string]any
}

func (r fresp) code() string {
	e, _ := r.body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func (r fresp) path() (string, bool) {
	e, _ := r.body["error"].(map[string]any)
	d, _ := e["details"].([]any)
	if len(d) == 0 {
		return "", false
	}
	p, ok := d[0].(map[string]any)["path"].(string)
	return p, ok
}

func (r fresp) data() map[string]any { d, _ := r.body["data"].(map[string]any); return d }

func startF(t *testing.T, pg bool, clk clock.Clock) *fsrv {
	t.Helper()
	db := "sqlite:" + filepath.Join(t.TempDir(), "f.db")
	if pg {
		db = pgtest.DSN(t)
	}
	eng, err := ferry.Open(context.Background(), ferry.Config{Database: db, Migrate: true, Logger: slog.New(slog.DiscardHandler), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.EnsureAPIKey(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(eng.Handler())
	t.Cleanup(func() { srv.Close(); _ = eng.Close() })
	return &fsrv{t: t, url: srv.URL}
}

// concurrently sends n requests at once, the ith by do(i), and returns
// their statuses; every tenth is the bad one.
func concurrently(n int, do func(i int, bad bool) int) []int {
	var wg sync.WaitGroup
	res := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = do(i, i%10 == 0)
		}()
	}
	wg.Wait()
	return res
}

// wantBadAlone fails unless every tenth request (the bad one) got bad and
// the others good.
func wantBadAlone(t *testing.T, what string, res []int, bad, good int) {
	t.Helper()
	for i, st := range res {
		if want := map[bool]int{true: bad, false: good}[i%10 == 0]; st != want {
			t.Errorf("%s %d: status %d, want %d (a valid one failed by another's bad input, or a bad one accepted)", what, i, st, want)
		}
	}
}

// bothDBs runs fn on a server on SQLite and one on Postgres.
func bothDBs(t *testing.T, fn func(t *testing.T, s *fsrv)) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			fn(t, startF(t, db == "postgres", nil))
		})
	}
}

func (s *fsrv) do(method, path, body string, hdr ...string) fresp {
	s.t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer k")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := fresp{status: resp.StatusCode, raw: raw}
	_ = json.Unmarshal(raw, &r.body)
	return r
}

// want4xx fails unless r is the given 4xx with the code and details[0].path.
func want4xx(t *testing.T, what string, r fresp, status int, code, path string) {
	t.Helper()
	got, _ := r.path()
	if r.status != status || r.code() != code || got != path {
		t.Errorf("%s: got %d code=%q path=%q, want %d %q at %q; body %.300s", what, r.status, r.code(), got, status, code, path, r.raw)
	}
}

// The YAML parser's work grows with the square of flow nesting (a 250 KB
// definition was killed at 24 GB): deep nesting is refused first.
func TestBadInputDeepYAMLRefused(t *testing.T) {
	s := startF(t, false, nil)
	body := "name: deep\ntasks:\n  a:\n    url: http://x.example/\n    body: " + strings.Repeat("[", 200_000) + "\n"
	want4xx(t, "a definition nested 200,000 levels deep", s.do("POST", "/api/v1/workflows", body), 400, "invalid_json", "")
}

// Bodies that are not UTF-8 are refused (not stored as they came).
func TestBadInputNonUTF8Refused(t *testing.T) {
	bothDBs(t, func(t *testing.T, s *fsrv) {
		s.do("POST", "/api/v1/workflows", `{"name":"w","tasks":{"a":{"sleep":"1h"}}}`)
		r := s.do("POST", "/api/v1/workflows/w/trigger", "{\"a\":\"\xff\xfe\"}")
		want4xx(t, "trigger with non-UTF-8 body", r, 400, "invalid_json", "")
		if id, ok := r.data()["run_id"].(string); ok {
			g := s.do("GET", "/api/v1/runs/"+id, "")
			if !utf8.Valid(g.raw) {
				t.Errorf("GET /runs/%s answers with bytes that are not UTF-8 (not JSON per RFC 8259)", id)
			}
		}
		r = s.do("POST", "/api/v1/tasks", "{\"type\":\"a.v1\",\"payload\":{\"x\":\"\xff\"}}")
		want4xx(t, "task with non-UTF-8 payload", r, 400, "invalid_json", "")
		r = s.do("POST", "/api/v1/workflows", "{\"name\":\"nu\",\"description\":\"\xff\",\"tasks\":{\"a\":{\"sleep\":\"1s\"}}}")
		want4xx(t, "definition with non-UTF-8 string", r, 400, "invalid_json", "")
	})
}

// Concurrent triggers, a few not UTF-8: only those are refused.
func TestBadInputNonUTF8TriggerFailsAlone(t *testing.T) {
	bothDBs(t, func(t *testing.T, s *fsrv) {
		s.do("POST", "/api/v1/workflows", `{"name":"w","tasks":{"a":{"sleep":"1h"}}}`)
		res := concurrently(40, func(i int, bad bool) int {
			body := fmt.Sprintf(`{"i":%d}`, i)
			if bad {
				body = "{\"a\":\"\xff\"}"
			}
			return s.do("POST", "/api/v1/workflows/w/trigger", body).status
		})
		wantBadAlone(t, "trigger", res, 400, 201)
	})
}

// Concurrent completions, a few not UTF-8: only those are refused.
func TestBadInputNonUTF8CompletionFailsAlone(t *testing.T) {
	bothDBs(t, func(t *testing.T, s *fsrv) {
		const n = 30
		for range n {
			s.do("POST", "/api/v1/tasks", `{"type":"c.v1"}`)
		}
		items, _ := s.do("POST", "/api/v1/tasks/claim", fmt.Sprintf(`{"types":["c.v1"],"max":%d}`, n)).body["data"].([]any)
		res := concurrently(len(items), func(i int, bad bool) int {
			m := items[i].(map[string]any)
			body := fmt.Sprintf(`{"lease_token":%q,"result":{"ok":%d}}`, m["lease_token"], i)
			if bad {
				body = fmt.Sprintf("{\"lease_token\":%q,\"result\":\"\xff\"}", m["lease_token"])
			}
			return s.do("POST", "/api/v1/tasks/"+m["id"].(string)+"/complete", body).status
		})
		wantBadAlone(t, "completion", res, 400, 200)
	})
}

// Strings with NUL, which no database stores as text, are refused where
// they are, and a fail carrying one does not fail the others batched
// with it.
func TestBadInputNULRefused(t *testing.T) {
	bothDBs(t, func(t *testing.T, s *fsrv) {
		want4xx(t, "task type description with NUL", s.do("PUT", "/api/v1/task-types/a.v1", `{"description":"a\u0000b"}`), 400, "invalid_request", "description")
		s.do("POST", "/api/v1/tasks", `{"type":"c.v1"}`)
		want4xx(t, "claim with NUL worker_id", s.do("POST", "/api/v1/tasks/claim", `{"types":["c.v1"],"worker_id":"w\u0000"}`), 400, "invalid_request", "worker_id")
		want4xx(t, "claim with NUL type", s.do("POST", "/api/v1/tasks/claim", `{"types":["c\u0000"]}`), 400, "invalid_request", "types[0]")
		s.do("POST", "/api/v1/workflows", `{"name":"w","tasks":{"a":{"sleep":"1h"}}}`)
		want4xx(t, "batch idempotency_key with NUL", s.do("POST", "/api/v1/workflows/w/trigger-batch", `{"runs":[{"idempotency_key":"a\u0000"}]}`), 400, "invalid_request", "runs[0].idempotency_key")

		// Fails, a few with NUL in their error: each is recorded, the NUL
		// replaced, and none fails the others batched with it.
		const n = 30
		for range n {
			s.do("POST", "/api/v1/tasks", `{"type":"f.v1"}`)
		}
		items, _ := s.do("POST", "/api/v1/tasks/claim", fmt.Sprintf(`{"types":["f.v1"],"max":%d}`, n)).body["data"].([]any)
		res := concurrently(len(items), func(i int, bad bool) int {
			m := items[i].(map[string]any)
			e := "boom"
			if bad {
				e = `bad\u0000byte`
			}
			return s.do("POST", "/api/v1/tasks/"+m["id"].(string)+"/fail", fmt.Sprintf(`{"lease_token":%q,"error":"%s","retryable":false}`, m["lease_token"], e)).status
		})
		wantBadAlone(t, "fail (a NUL in its error replaced, not refused)", res, 200, 200)
		want4xx(t, "a completion of many with NUL in a lease token", s.do("POST", "/api/v1/tasks/complete", `{"completions":[{"id":"a","lease_token":"t"},{"id":"b","lease_token":"t\u0000"}]}`), 400, "invalid_request", "completions[1].lease_token")
		want4xx(t, "next's types with NUL", s.do("POST", "/api/v1/tasks/complete", `{"completions":[{"id":"a","lease_token":"t"}],"next":{"types":["ok.v1","b\u0000"]}}`), 400, "invalid_request", "next.types[1]")
	})
}

// Ids and cursors that are not UTF-8 or hold NUL: not found, or a bad
// cursor.
func TestBadInputPathAndCursorBytes(t *testing.T) {
	bothDBs(t, func(t *testing.T, s *fsrv) {
		for _, p := range []string{
			"/api/v1/workflows/%ff", "/api/v1/runs/%ff%00", "/api/v1/tasks/%ff", "/api/v1/task-types/%ff",
		} {
			want4xx(t, "GET "+p, s.do("GET", p, ""), 404, "not_found", "")
		}
		// No API key needed for this one.
		r := s.do("POST", "/wh/%ff%00", "{}")
		if r.status != 404 || r.code() != "not_found" {
			t.Errorf("POST /wh/%%ff%%00: %d %s", r.status, r.raw)
		}
		want4xx(t, "list workflows with a non-UTF-8 cursor", s.do("GET", "/api/v1/workflows?cursor=%ff", ""), 400, "invalid_parameter", "cursor")
	})
}

// Idempotency keys are bounded (they are indexed).
func TestBadInputLongIdempotencyKey(t *testing.T) {
	bothDBs(t, func(t *testing.T, s *fsrv) {
		s.do("POST", "/api/v1/workflows", `{"name":"w","tasks":{"a":{"sleep":"1h"}}}`)
		b := make([]byte, 1500)
		rand.Read(b)
		key := hex.EncodeToString(b) // 3000 incompressible bytes
		r := s.do("POST", "/api/v1/workflows/w/trigger", `{}`, "Idempotency-Key", key)
		if r.status/100 != 4 || r.code() == "" {
			t.Errorf("trigger with a 3000-byte Idempotency-Key: %d %s", r.status, r.raw)
		}
		want4xx(t, "trigger-batch with a 3000-byte idempotency_key", s.do("POST", "/api/v1/workflows/w/trigger-batch", `{"runs":[{"idempotency_key":"`+key+`"}]}`), 400, "invalid_request", "runs[0].idempotency_key")
	})
}

func longTaskType(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)[:n] + ".v1"
}

// Task types are bounded (they are indexed): a definition naming a longer
// one is refused, rather than accepted and its runs stuck.
func TestBadInputLongTaskType(t *testing.T) {
	bothDBs(t, func(t *testing.T, s *fsrv) {
		typ := longTaskType(4000)
		want4xx(t, "POST /tasks with a 4 KB type", s.do("POST", "/api/v1/tasks", `{"type":"`+typ+`"}`), 400, "invalid_request", "type")
		want4xx(t, "PUT /task-types with a 4 KB type", s.do("PUT", "/api/v1/task-types/"+typ, `{}`), 400, "invalid_request", "type")
		r := s.do("POST", "/api/v1/workflows", `{"name":"lt","tasks":{"a":{"task":{"type":"a.v1"}},"b":{"needs":["a"],"task":{"type":"`+typ+`"}}}}`)
		want4xx(t, "definition with a 4 KB task type", r, 422, "invalid_workflow", "tasks.b.task.type")
		if r.status != 201 {
			return
		}
		// What happens once it is accepted: step a's valid completion can never be recorded.
		s.do("POST", "/api/v1/workflows/lt/trigger", `{}`)
		m := s.do("POST", "/api/v1/tasks/claim", `{"types":["a.v1"]}`).body["data"].([]any)[0].(map[string]any)
		c := s.do("POST", "/api/v1/tasks/"+m["id"].(string)+"/complete", fmt.Sprintf(`{"lease_token":%q,"result":{}}`, m["lease_token"]))
		if c.status != 200 {
			t.Errorf("valid completion of step a: %d %s", c.status, c.raw)
		}
	})
}

// A claim lists at most 100 types or prefixes.
func TestBadInputClaimManyTypes(t *testing.T) {
	s := startF(t, false, nil)
	body := `{"types":[` + strings.Repeat(`"zz.v1",`, 599) + `"zz.v1"]}`
	r := s.do("POST", "/api/v1/tasks/claim", body)
	want4xx(t, "claim with 600 types", r, 400, "invalid_request", "types")
}

// A bad run_at is named.
func TestBadInputRunAtPath(t *testing.T) {
	s := startF(t, false, nil)
	want4xx(t, "run_at not RFC 3339", s.do("POST", "/api/v1/tasks", `{"type":"a.v1","run_at":"tomorrow"}`), 400, "invalid_request", "run_at")
	want4xx(t, "run_at a number", s.do("POST", "/api/v1/tasks", `{"type":"a.v1","run_at":5}`), 400, "invalid_request", "run_at")
}

// lease_seconds under 1 is refused, not taken as the default.
func TestBadInputClaimTinyLease(t *testing.T) {
	s := startF(t, false, nil)
	s.do("POST", "/api/v1/tasks", `{"type":"a.v1"}`)
	r := s.do("POST", "/api/v1/tasks/claim", `{"types":["a.v1"],"lease_seconds":1e-12}`)
	want4xx(t, "claim lease_seconds 1e-12", r, 400, "invalid_request", "lease_seconds")
	// heartbeat rejects the same value:
	// POST /tasks/{id}/heartbeat {"lease_token":..,"lease_seconds":1e-12} -> 400 at lease_seconds
}

// "if": "" is refused: it is neither a condition nor none.
func TestBadInputEmptyIf(t *testing.T) {
	s := startF(t, false, nil)
	r := s.do("POST", "/api/v1/workflows", `{"name":"x","tasks":{"a":{"sleep":"1s"},"b":{"needs":["a"],"sleep":"1s","if":""}}}`)
	want4xx(t, `"if": ""`, r, 422, "invalid_workflow", "tasks.b.if")
}

// A retry_delay × attempt² past the int64 range is capped at 24h, not
// wrapped to a short delay.
func TestBadInputBackoffOverflow(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s := startF(t, false, clk)
	// 9 × 2049638230523283513ns = 2^64 + 1000000001ns: wraps to ~1s.
	r := s.do("POST", "/api/v1/tasks", `{"type":"b.v1","retry_delay":"2049638230523283513ns","max_attempts":5}`)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	id := r.data()["id"].(string)
	var runAt time.Time
	for attempt := 1; attempt <= 3; attempt++ {
		c := s.do("POST", "/api/v1/tasks/claim", `{"types":["b.v1"]}`)
		items, _ := c.body["data"].([]any)
		if len(items) != 1 {
			t.Fatalf("attempt %d: claim got %s", attempt, c.raw)
		}
		lt := items[0].(map[string]any)["lease_token"].(string)
		f := s.do("POST", "/api/v1/tasks/"+id+"/fail", fmt.Sprintf(`{"lease_token":%q,"error":"x"}`, lt))
		runAt, _ = time.Parse(time.RFC3339Nano, f.data()["run_at"].(string))
		clk.Advance(27 * time.Hour)
	}
	if d := runAt.Sub(clk.Now().Add(-27 * time.Hour)); d < time.Hour {
		t.Errorf("after attempt 3 the retry comes in %v, though retry_delay×9 is ~210 years and the cap is 24h", d)
	}
}

// YAML's .inf and .nan are refused where they are (422), not as a
// document that is not JSON.
func TestBadInputYAMLNonFinite(t *testing.T) {
	s := startF(t, false, nil)
	want4xx(t, "sleep: .inf", s.do("POST", "/api/v1/workflows", "name: y\ntasks:\n  a:\n    sleep: .inf\n"), 422, "invalid_workflow", "tasks.a.sleep")
	want4xx(t, "body: {x: .nan}", s.do("POST", "/api/v1/workflows", "name: y\ntasks:\n  a:\n    url: http://x.example/\n    body: {x: .nan}\n"), 422, "invalid_workflow", "tasks.a.body.x")
}

// A run_at past the year 9999 in UTC (an RFC 3339 time of 9999-12-31
// with a negative offset) is refused: the task could never be shown,
// for a JSON time has four digits of year (it was created, and it and
// every answer naming it came back with an empty body).
func TestBadInputRunAtPastYear9999(t *testing.T) {
	s := startF(t, false, nil)
	r := s.do("POST", "/api/v1/tasks", `{"type":"a.v1","run_at":"9999-12-31T23:59:59-23:59"}`)
	want4xx(t, "run_at in the year 10000 UTC", r, 400, "invalid_request", "run_at")
	r = s.do("POST", "/api/v1/tasks", `{"type":"a.v1","run_at":"9999-12-31T23:59:59.999999Z"}`)
	if r.status != 201 || r.data()["run_at"] != "9999-12-31T23:59:59.999999Z" {
		t.Fatalf("run_at at the end of 9999: %d %s", r.status, r.raw)
	}
}

// A lease of a fraction of a microsecond more than whole microseconds
// (lease_seconds 100.0000007) answers the lease_until that is stored: a
// heartbeat's answer and event, and an eager claim's, said
// ...44.7093077Z where the task read ...44.709307Z.
func TestBadInputLeaseUntilAsStored(t *testing.T) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) { testLeaseUntilAsStored(t, startF(t, pg, nil)) })
	}
}

func testLeaseUntilAsStored(t *testing.T, s *fsrv) {
	if r := s.do("POST", "/api/v1/workflows", `{"name":"two","tasks":{"a":{"task":{"type":"hb.v1"}},"b":{"needs":["a"],"task":{"type":"hb.v1"}}}}`); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	if r := s.do("POST", "/api/v1/workflows/two/trigger", `{}`); r.status != 201 {
		t.Fatalf("trigger: %d %s", r.status, r.raw)
	}
	c := s.do("POST", "/api/v1/tasks/claim", `{"types":["hb.v1"],"wait_seconds":5}`)
	items, _ := c.body["data"].([]any)
	if len(items) != 1 {
		t.Fatalf("claim: %s", c.raw)
	}
	id, lt := items[0].(map[string]any)["id"].(string), items[0].(map[string]any)["lease_token"].(string)
	stored := func(id string) any { return s.do("GET", "/api/v1/tasks/"+id, "").data()["lease_until"] }
	hb := s.do("POST", "/api/v1/tasks/"+id+"/heartbeat", fmt.Sprintf(`{"lease_token":%q,"lease_seconds":100.0000007}`, lt))
	if got, want := hb.data()["lease_until"], stored(id); got != want {
		t.Errorf("heartbeat answered lease_until %v; the task has %v", got, want)
	}
	ev := s.do("GET", "/api/v1/tasks/"+id+"/events", "")
	evs, _ := ev.body["data"].([]any)
	if last := evs[len(evs)-1].(map[string]any); last["type"] != "heartbeat" || last["data"].(map[string]any)["lease_until"] != stored(id) {
		t.Errorf("heartbeat event %v; the task has lease_until %v", last, stored(id))
	}
	done := s.do("POST", "/api/v1/tasks/"+id+"/complete", fmt.Sprintf(`{"lease_token":%q,"result":{},"next":{"types":["hb.v1"],"lease_seconds":1.0000005}}`, lt))
	next, _ := done.body["next"].([]any)
	if len(next) != 1 {
		t.Fatalf("complete with next: %s", done.raw)
	}
	n := next[0].(map[string]any)
	if got, want := n["lease_until"], stored(n["id"].(string)); got != want {
		t.Errorf("eager claim answered lease_until %v; the task has %v", got, want)
	}
}

// A YAML definition whose strings hold a control character (escaped, as
// "\e[1m" or "\0", or written as it is) is valid YAML and is accepted as
// the same definition in JSON is: it was refused as "invalid JSON:
// invalid character 'x' in string escape code" (the YAML was converted
// to JSON with Go's escapes, \x1b, which JSON does not have).
func TestBadInputYAMLControlCharacters(t *testing.T) {
	s := startF(t, false, nil)
	doc := "name: ctl\ntasks:\n  a:\n    url: http://x.example/\n    body: {tag: \"\\e[1m\\a\\v\\x7f\", \"k\\x01\": \"\\0 \\U000E0001 \x7f\"}\n"
	r := s.do("POST", "/api/v1/workflows", doc)
	if r.status != 201 {
		t.Fatalf("YAML definition with control characters: %d %s", r.status, r.raw)
	}
	g := s.do("GET", "/api/v1/workflows/ctl", "")
	a, _ := g.data()["tasks"].(map[string]any)["a"].(map[string]any)
	if h, _ := a["body"].(map[string]any)["tag"].(string); h != "\x1b[1m\a\v\x7f" {
		t.Errorf("body.tag read back %q", h)
	}
	// In a header value they are refused: no request could carry them.
	bad := "name: ctl2\ntasks:\n  a:\n    url: http://x.example/\n    headers: {X-Tag: \"\\e[1m\"}\n"
	want4xx(t, "a header value with ESC", s.do("POST", "/api/v1/workflows", bad), 422, "invalid_workflow", "tasks.a.headers.X-Tag")
	if b, _ := a["body"].(map[string]any)["k\x01"].(string); b != "\x00 \U000E0001 \x7f" {
		t.Errorf("body read back %s", g.raw)
	}
}

// A trigger body or a callback payload nested too deeply to be answered
// inside the run (encoding/json reads and writes 10,000 levels; a run
// holds its input 2 levels down and a step's body 4) was taken, and the
// run was answered 200 with an empty body ever after. A trigger body is
// refused past api.MaxJSONNesting (1,000) levels; a callback payload past it is
// answered as its text, as one that is not JSON is.
func TestBadInputDeeplyNestedRunInput(t *testing.T) {
	s := startF(t, false, nil)
	nest := func(n int) string { return strings.Repeat("[", n) + `"<"` + strings.Repeat("]", n) }
	if r := s.do("POST", "/api/v1/workflows", `{"name":"w","tasks":{"a":{"wait_for_webhook":true}}}`); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	want4xx(t, "trigger body nested 10,000 levels", s.do("POST", "/api/v1/workflows/w/trigger", nest(10_000)), 400, "invalid_json", "")
	want4xx(t, "batch input nested 1,001 levels", s.do("POST", "/api/v1/workflows/w/trigger-batch", `{"runs":[{},{"input":`+nest(1001)+`}]}`), 400, "invalid_request", "runs[1].input")

	r := s.do("POST", "/api/v1/workflows/w/trigger", `{"a":`+nest(999)+`}`)
	if r.status != 201 {
		t.Fatalf("trigger body nested 1,000 levels: %d %s", r.status, r.raw)
	}
	id := r.data()["run_id"].(string)
	run := s.do("GET", "/api/v1/runs/"+id, "")
	if run.status != 200 || run.data()["input"] == nil {
		t.Fatalf("GET the run of a trigger body nested 1,000 levels: %d %.200s", run.status, run.raw)
	}
	step := func(run fresp) map[string]any {
		tasks, _ := run.data()["tasks"].(map[string]any)
		a, _ := tasks["a"].(map[string]any)
		return a
	}
	cb, _ := step(run)["callback_url"].(string)
	if !strings.Contains(cb, "/wh/") {
		t.Fatalf("no callback_url: %.300s", run.raw)
	}
	u := s.url + cb[strings.Index(cb, "/wh/"):]
	resp, err := http.Post(u, "application/json", strings.NewReader(nest(9_999)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 202 {
		t.Fatalf("callback: %d", resp.StatusCode)
	}
	run = s.do("GET", "/api/v1/runs/"+id, "")
	body, _ := step(run)["body"].(string)
	if run.status != 200 || body != nest(9_999) {
		t.Errorf("GET a run whose callback payload nests 10,000 levels: %d, %d bytes: %.200s", run.status, len(run.raw), run.raw)
	}
}

// Outside /api/ a path no route takes is a JSON 404, and one a route
// takes with another method a JSON 405 naming the methods (Allow too):
// a callback sender asking GET /wh/{token}, or a probe POSTing /healthz,
// got the mux's text pages. The token stays out of the message.
func TestBadInputOutsideAPIIsJSON(t *testing.T) {
	s := startF(t, false, nil)
	for _, c := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/wh/wh_SECRETTOKEN", 405, "method_not_allowed", "POST"},
		{"POST", "/healthz", 405, "method_not_allowed", "GET"},
		{"PUT", "/openapi.yaml", 405, "method_not_allowed", "GET"},
		{"POST", "/wh/", 404, "not_found", ""},
		{"GET", "/nope", 404, "not_found", ""},
		{"GET", "/", 404, "not_found", ""},
	} {
		req, err := http.NewRequest(c.method, s.url+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(raw, &body); err != nil || resp.StatusCode != c.status || body.Error.Code != c.code || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d Allow=%q %s; want %d %q with Allow %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), raw, c.status, c.code, c.allow)
		}
		if strings.Contains(string(raw), "SECRETTOKEN") {
			t.Errorf("%s %s: the answer names the token: %s", c.method, c.path, raw)
		}
	}
	// The routes themselves are unchanged.
	if r := s.do("GET", "/healthz", ""); r.status != 200 {
		t.Errorf("GET /healthz: %d %s", r.status, r.raw)
	}
}

// A task type read back with GET (an unset retry_delay is null) can be
// sent back with PUT as it is, and null means the default on POST
// /tasks as it does for run_at: null was refused as "must be a
// duration".
func TestBadInputNullRetryDelayIsUnset(t *testing.T) {
	s := startF(t, false, nil)
	r := s.do("PUT", "/api/v1/task-types/a.v1", `{"description":"d"}`)
	if r.status != 200 || r.data()["retry_delay"] != nil {
		t.Fatalf("put: %d %s", r.status, r.raw)
	}
	got := s.do("GET", "/api/v1/task-types/a.v1", "")
	body, _ := json.Marshal(map[string]any{"description": "e", "enabled": got.data()["enabled"], "max_attempts": got.data()["max_attempts"], "retry_delay": got.data()["retry_delay"]})
	if r = s.do("PUT", "/api/v1/task-types/a.v1", string(body)); r.status != 200 || r.data()["retry_delay"] != nil || r.data()["description"] != "e" {
		t.Fatalf("put back %s: %d %s", body, r.status, r.raw)
	}
	if r = s.do("POST", "/api/v1/tasks", `{"type":"a.v1","retry_delay":null,"run_at":null}`); r.status != 201 {
		t.Fatalf("post task with null retry_delay: %d %s", r.status, r.raw)
	}
	want4xx(t, "retry_delay false", s.do("POST", "/api/v1/tasks", `{"type":"a.v1","retry_delay":false}`), 400, "invalid_request", "retry_delay")
}

// A path with an empty segment, . or .. is a JSON 404: the mux answered
// it with an HTML redirect to the cleaned path, another resource
// (/api/v1/workflows//runs, an empty id, to /api/v1/workflows/runs).
func TestBadInputUncleanPathIsJSON404(t *testing.T) {
	s := startF(t, false, nil)
	for _, p := range []string{"/api/v1/workflows//runs", "/api/v1/runs/./x", "/api/v1/x/../workflows", "//healthz", "/wh//x"} {
		r := s.do("GET", p, "")
		if r.status != 404 || r.code() != "not_found" {
			t.Errorf("GET %s: %d %.200s, want a JSON 404 not_found", p, r.status, r.raw)
		}
	}
	if r := s.do("GET", "/api/v1/workflows/", ""); r.status == 404 && strings.Contains(string(r.raw), "empty segment") {
		t.Errorf("a trailing slash is not an empty segment: %s", r.raw)
	}
}

// An id in upper case names the same run or task: UUIDs are
// case-insensitive, and some tools print them in upper case (it was a 404).
func TestBadInputUpperCaseIDs(t *testing.T) {
	s := startF(t, false, nil)
	if r := s.do("POST", "/api/v1/workflows", `{"name":"up","tasks":{"a":{"sleep":"1h"}}}`); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	tr := s.do("POST", "/api/v1/workflows/up/trigger", `{}`)
	id, _ := tr.data()["run_id"].(string)
	if tr.status != 201 || id == "" {
		t.Fatalf("trigger: %d %s", tr.status, tr.raw)
	}
	for _, p := range []string{"/api/v1/runs/" + strings.ToUpper(id), "/api/v1/workflows/up/runs/" + strings.ToUpper(id), "/api/v1/runs/" + strings.ToUpper(id) + "/events"} {
		if r := s.do("GET", p, ""); r.status != 200 {
			t.Errorf("GET %s: %d %.200s", p, r.status, r.raw)
		}
	}
	k := s.do("POST", "/api/v1/tasks", `{"type":"up.x.v1"}`)
	kid, _ := k.data()["id"].(string)
	if r := s.do("GET", "/api/v1/tasks/"+strings.ToUpper(kid), ""); r.status != 200 || r.data()["id"] != kid {
		t.Errorf("GET task in upper case: %d %.200s", r.status, r.raw)
	}
	// A workflow name is not an id: its case is its own.
	if r := s.do("GET", "/api/v1/workflows/UP", ""); r.status != 404 {
		t.Errorf("GET /workflows/UP: %d, want 404 (names are case-sensitive)", r.status)
	}
}
