package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/goccy/go-yaml"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/api"
	"github.com/ferryhq/ferry/internal/spec"
)

// ---- the document ----

type obj = map[string]any

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// loadDoc parses the embedded document (once) with goccy/go-yaml and
// normalises it through JSON, so that it holds the same Go types as a decoded
// response. Tests only read it.
func loadDoc(t *testing.T) obj {
	t.Helper()
	docOnce.Do(func() { docCache, docErr = parseDoc(api.OpenAPI()) })
	if docErr != nil {
		t.Fatal(docErr)
	}
	return docCache
}

var (
	docOnce  sync.Once
	docCache obj
	docErr   error
)

func parseDoc(src []byte) (obj, error) {
	if len(bytes.TrimSpace(src)) == 0 {
		return nil, fmt.Errorf("the embedded OpenAPI document is empty")
	}
	var raw any
	if err := yaml.UnmarshalWithOptions(src, &raw, yaml.Strict()); err != nil {
		return nil, fmt.Errorf("parse openapi.yaml: %w", err)
	}
	js, err := yaml.YAMLToJSON(src)
	if err != nil {
		return nil, fmt.Errorf("openapi.yaml to JSON: %w", err)
	}
	var d obj
	if err := json.Unmarshal(js, &d); err != nil {
		return nil, fmt.Errorf("decode openapi.yaml: %w", err)
	}
	return d, nil
}

func m(v any) obj {
	o, _ := v.(obj)
	return o
}

// resolve follows local $refs (#/components/...).
func resolve(t *testing.T, d obj, v any) obj {
	t.Helper()
	o := m(v)
	for i := 0; o != nil && o["$ref"] != nil; i++ {
		if i > 20 {
			t.Fatalf("$ref loop at %v", o["$ref"])
		}
		target, err := lookupRef(d, o["$ref"].(string))
		if err != nil {
			t.Fatal(err)
		}
		o = target
	}
	return o
}

func lookupRef(d obj, ref string) (obj, error) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("$ref %q is not local", ref)
	}
	var cur any = d
	for _, seg := range strings.Split(rest, "/") {
		seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		next, ok := m(cur)[seg]
		if !ok {
			return nil, fmt.Errorf("$ref %q does not resolve (no %q)", ref, seg)
		}
		cur = next
	}
	if m(cur) == nil {
		return nil, fmt.Errorf("$ref %q resolves to a non-object", ref)
	}
	return m(cur), nil
}

type operation struct {
	method, path string
	op           obj
	pathItem     obj
}

func operations(d obj) []operation {
	var out []operation
	for p, item := range m(d["paths"]) {
		for _, meth := range httpMethods {
			if op := m(m(item)[meth]); op != nil {
				out = append(out, operation{strings.ToUpper(meth), p, op, m(item)})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].path+" "+out[i].method < out[j].path+" "+out[j].method
	})
	return out
}

func TestOpenAPIDocument(t *testing.T) {
	d := loadDoc(t)
	if v, _ := d["openapi"].(string); !strings.HasPrefix(v, "3.1.") {
		t.Errorf("openapi = %q, want 3.1.x", v)
	}
	if m(d["info"])["title"] == nil || m(d["info"])["version"] == nil {
		t.Error("info needs title and version")
	}
	if m(m(m(d["components"])["securitySchemes"])["bearerAuth"])["scheme"] != "bearer" {
		t.Error("components.securitySchemes.bearerAuth must be an http bearer scheme")
	}
	// Every $ref anywhere resolves.
	var walk func(v any, at string)
	walk = func(v any, at string) {
		switch x := v.(type) {
		case obj:
			if r, ok := x["$ref"].(string); ok {
				if _, err := lookupRef(d, r); err != nil {
					t.Errorf("%s: %v", at, err)
				}
			}
			for k, c := range x {
				walk(c, at+"/"+k)
			}
		case []any:
			for i, c := range x {
				walk(c, at+"/"+strconv.Itoa(i))
			}
		}
	}
	walk(d, "#")
}

func TestOpenAPIMatchesRoutes(t *testing.T) {
	d := loadDoc(t)
	documented := map[string]bool{}
	for _, op := range operations(d) {
		documented[op.method+" "+op.path] = true
	}
	served := map[string]bool{}
	for _, r := range api.Routes {
		served[r] = true
	}
	for r := range served {
		if !documented[r] {
			t.Errorf("route %q is served but not documented", r)
		}
	}
	for r := range documented {
		if !served[r] {
			t.Errorf("operation %q is documented but not in api.Routes", r)
		}
	}
}

var pathParamRE = regexp.MustCompile(`\{([^}]+)\}`)

func TestOpenAPIOperations(t *testing.T) {
	d := loadDoc(t)
	schemes := m(m(d["components"])["securitySchemes"])
	ids := map[string]string{}
	for _, o := range operations(d) {
		name := o.method + " " + o.path
		id, _ := o.op["operationId"].(string)
		switch {
		case id == "":
			t.Errorf("%s: no operationId", name)
		case ids[id] != "":
			t.Errorf("%s: operationId %q already used by %s", name, id, ids[id])
		default:
			ids[id] = name
		}
		if s, _ := o.op["summary"].(string); s == "" {
			t.Errorf("%s: no summary", name)
		}

		responses := m(o.op["responses"])
		if len(responses) == 0 {
			t.Errorf("%s: no responses", name)
		}
		for code := range responses {
			n, err := strconv.Atoi(code)
			if err != nil || n < 100 || n > 599 || http.StatusText(n) == "" {
				t.Errorf("%s: response %q is not an HTTP status code", name, code)
			}
		}

		sec, hasSec := o.op["security"].([]any)
		// The API and the metrics need a key; health, this document and
		// webhook callbacks do not.
		if strings.HasPrefix(o.path, "/api/v1/") || o.path == "/metrics" {
			if !hasSec || len(sec) == 0 {
				t.Errorf("%s: an operation behind the API key must declare security", name)
			}
			for _, req := range sec {
				for scheme := range m(req) {
					if schemes[scheme] == nil {
						t.Errorf("%s: unknown security scheme %q", name, scheme)
					}
				}
			}
			if responses["401"] == nil {
				t.Errorf("%s: an operation behind the API key must document 401", name)
			}
		} else if len(sec) > 0 {
			t.Errorf("%s: %s needs no API key but declares security", name, o.path)
		}

		// Path template parameters and declared path parameters agree.
		declared := map[string]bool{}
		for _, list := range []any{o.pathItem["parameters"], o.op["parameters"]} {
			for _, p := range listOf(list) {
				p := resolve(t, d, p)
				if p["in"] == "path" {
					declared[p["name"].(string)] = true
					if p["required"] != true {
						t.Errorf("%s: path parameter %v must be required", name, p["name"])
					}
				}
			}
		}
		inPath := map[string]bool{}
		for _, mm := range pathParamRE.FindAllStringSubmatch(o.path, -1) {
			inPath[mm[1]] = true
			if !declared[mm[1]] {
				t.Errorf("%s: path parameter %q is not declared", name, mm[1])
			}
		}
		for p := range declared {
			if !inPath[p] {
				t.Errorf("%s: declared path parameter %q is not in the path", name, p)
			}
		}
	}
}

// ---- a small structural validator: types, enums, consts, patterns,
// required properties, and no keys the schema does not document ----

func conform(t *testing.T, d obj, schema any, v any, at string) []string {
	t.Helper()
	s := resolve(t, d, schema)
	if s == nil {
		return []string{at + ": no schema"}
	}
	var probs []string
	for _, sub := range listOf(s["allOf"]) {
		probs = append(probs, conform(t, d, sub, v, at)...)
	}
	for _, kw := range []string{"oneOf", "anyOf"} {
		branches := listOf(s[kw])
		if len(branches) == 0 {
			continue
		}
		matched := 0
		for _, b := range branches {
			if len(conform(t, d, b, v, at)) == 0 {
				matched++
			}
		}
		if matched == 0 || (kw == "oneOf" && matched > 1) {
			probs = append(probs, fmt.Sprintf("%s: %d of the %s branches match %s", at, matched, kw, short(v)))
		}
	}
	if ty, ok := s["type"]; ok && !typeMatches(ty, v) {
		return append(probs, fmt.Sprintf("%s: %s is not of type %v", at, short(v), ty))
	}
	if c, ok := s["const"]; ok && !reflect.DeepEqual(c, v) {
		probs = append(probs, fmt.Sprintf("%s: %s is not %v", at, short(v), c))
	}
	if e := listOf(s["enum"]); e != nil && !slices.ContainsFunc(e, func(x any) bool { return reflect.DeepEqual(x, v) }) {
		probs = append(probs, fmt.Sprintf("%s: %s is not one of %v", at, short(v), e))
	}
	switch x := v.(type) {
	case string:
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(x) {
			probs = append(probs, fmt.Sprintf("%s: %q does not match %s", at, x, p))
		}
	case float64:
		if n, ok := s["minimum"].(float64); ok && x < n {
			probs = append(probs, fmt.Sprintf("%s: %v is below %v", at, x, n))
		}
		if n, ok := s["exclusiveMinimum"].(float64); ok && x <= n {
			probs = append(probs, fmt.Sprintf("%s: %v is not above %v", at, x, n))
		}
		if n, ok := s["maximum"].(float64); ok && x > n {
			probs = append(probs, fmt.Sprintf("%s: %v is above %v", at, x, n))
		}
	case []any:
		if items, ok := s["items"]; ok {
			for i, it := range x {
				probs = append(probs, conform(t, d, items, it, fmt.Sprintf("%s[%d]", at, i))...)
			}
		}
	case obj:
		props := m(s["properties"])
		for _, r := range listOf(s["required"]) {
			if _, ok := x[r.(string)]; !ok {
				probs = append(probs, fmt.Sprintf("%s: required %q is missing", at, r))
			}
		}
		if props == nil && s["additionalProperties"] == nil {
			break // a free-form object
		}
		if n, ok := s["minProperties"].(float64); ok && float64(len(x)) < n {
			probs = append(probs, fmt.Sprintf("%s: fewer than %v properties", at, n))
		}
		names := m(s["propertyNames"])
		for k, val := range x {
			if p, ok := names["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(k) {
				probs = append(probs, fmt.Sprintf("%s: property name %q does not match %s", at, k, p))
			}
			if ps, ok := props[k]; ok {
				probs = append(probs, conform(t, d, ps, val, at+"."+k)...)
				continue
			}
			switch ap := s["additionalProperties"].(type) {
			case obj:
				probs = append(probs, conform(t, d, ap, val, at+"."+k)...)
			case bool:
				if !ap {
					probs = append(probs, fmt.Sprintf("%s: %q is not a documented property", at, k))
				}
			default:
				probs = append(probs, fmt.Sprintf("%s: %q is not a documented property", at, k))
			}
		}
	}
	return probs
}

func listOf(v any) []any {
	l, _ := v.([]any)
	return l
}

func typeMatches(ty any, v any) bool {
	var types []string
	switch x := ty.(type) {
	case string:
		types = []string{x}
	case []any:
		for _, e := range x {
			types = append(types, e.(string))
		}
	}
	for _, want := range types {
		switch x := v.(type) {
		case nil:
			if want == "null" {
				return true
			}
		case bool:
			if want == "boolean" {
				return true
			}
		case string:
			if want == "string" {
				return true
			}
		case float64:
			if want == "number" || (want == "integer" && x == math.Trunc(x)) {
				return true
			}
		case []any:
			if want == "array" {
				return true
			}
		case obj:
			if want == "object" {
				return true
			}
		}
	}
	return false
}

func short(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 80 {
		return string(b[:77]) + "..."
	}
	return string(b)
}

func schemaNamed(t *testing.T, d obj, name string) obj {
	t.Helper()
	s, err := lookupRef(d, "#/components/schemas/"+name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Every example in the document matches the schema it illustrates.
func TestOpenAPIExamples(t *testing.T) {
	d := loadDoc(t)
	checked := 0
	check := func(where string, media obj) {
		if media == nil || media["schema"] == nil {
			return
		}
		var values []any
		if ex, ok := media["example"]; ok {
			values = append(values, ex)
		}
		for _, ex := range m(media["examples"]) {
			values = append(values, resolve(t, d, ex)["value"])
		}
		for _, v := range values {
			checked++
			if probs := conform(t, d, media["schema"], v, "$"); len(probs) > 0 {
				t.Errorf("%s: the example does not match its schema:\n  %s", where, strings.Join(probs, "\n  "))
			}
		}
	}
	checkContent := func(where string, content any) {
		for ct, media := range m(content) {
			if ct == "application/json" {
				check(where+" "+ct, m(media))
			}
		}
	}
	for _, o := range operations(d) {
		name := o.method + " " + o.path
		if rb := resolve(t, d, o.op["requestBody"]); rb != nil {
			checkContent(name+" request", rb["content"])
		}
		for code, resp := range m(o.op["responses"]) {
			checkContent(name+" "+code, resolve(t, d, resp)["content"])
		}
	}
	if checked < 10 {
		t.Errorf("only %d examples checked", checked)
	}
}

// The definition schema accepts what the parser accepts and rejects shapes
// the parser rejects.
func TestOpenAPIDefinitionSchema(t *testing.T) {
	d := loadDoc(t)
	def := schemaNamed(t, d, "WorkflowDefinition")
	valid := []string{
		`{"name":"order-processing","trigger":"api","tasks":{
			"charge":{"url":"https://myapp.com/api/charge","method":"POST","headers":{"Authorization":"Bearer {{trigger.body.token}}"},"body":{"order_id":"{{trigger.body.order_id}}"},"retries":3,"timeout":30000},
			"send-receipt":{"needs":["charge"],"if":"tasks.charge.status_code == 200","url":"https://myapp.com/api/send-receipt","method":"POST","body":{"email":"{{trigger.body.email}}"}}}}`,
		`{"name":"trial-expiry","description":"d","max_duration":"30d","enabled":false,"tasks":{
			"start-trial":{"url":"https://myapp.com/api/activate-trial"},
			"wait-13-days":{"needs":["start-trial"],"sleep":"13d"},
			"nap":{"needs":["wait-13-days"],"sleep":30},
			"send-reminder":{"needs":["nap"],"url":"https://myapp.com/api/send-email","timeout":"10s"}}}`,
		`{"name":"checkout-flow","max_duration":86400,"tasks":{
			"create-checkout":{"url":"https://myapp.com/api/create-checkout","body":{"callback_url":"{{wait.payment-result.url}}"}},
			"payment-result":{"needs":["create-checkout"],"wait_for_webhook":{"timeout":"1h"}},
			"other":{"wait_for_webhook":true},
			"third":{"wait_for_webhook":{}},
			"handle-timeout":{"needs":["payment-result"],"if":"tasks.payment-result.status == 'timeout'","url":"https://myapp.com/api/checkout-expired"}}}`,
		`{"name":"thumbs","tasks":{
			"upload":{"url":"https://myapp.com/api/upload"},
			"resize":{"needs":["upload"],"task":{"type":"content.thumbnail.v1","payload":{"id":"{{tasks.upload.body.id}}"},"priority":5},"retries":4,"retry_delay":"30s"},
			"bare":{"task":{"type":"content.noop.v2"}},
			"numeric-delay":{"task":{"type":"content.noop.v2","payload":[1,2]},"retry_delay":30}}}`,
	}
	for i, doc := range valid {
		if _, err := spec.Parse([]byte(doc), spec.DefaultLimits); err != nil {
			t.Fatalf("valid[%d]: the parser rejects it: %v", i, err)
		}
		var v any
		if err := json.Unmarshal([]byte(doc), &v); err != nil {
			t.Fatal(err)
		}
		if probs := conform(t, d, def, v, "$"); len(probs) > 0 {
			t.Errorf("valid[%d]: the schema rejects it:\n%s", i, strings.Join(probs, "\n"))
		}
	}
	invalid := map[string]string{
		"unknown top-level field":  `{"name":"a","tasks":{"s":{"sleep":"1s"}},"colour":"red"}`,
		"missing name":             `{"tasks":{"s":{"sleep":"1s"}}}`,
		"missing tasks":            `{"name":"a"}`,
		"no tasks":                 `{"name":"a","tasks":{}}`,
		"unsupported trigger":      `{"name":"a","trigger":"cron","tasks":{"s":{"sleep":"1s"}}}`,
		"two step types":           `{"name":"a","tasks":{"s":{"url":"https://x.example","sleep":"1s"}}}`,
		"no step type":             `{"name":"a","tasks":{"s":{"needs":[]}}}`,
		"unknown step field":       `{"name":"a","tasks":{"s":{"url":"https://x.example","colour":1}}}`,
		"http field on sleep":      `{"name":"a","tasks":{"s":{"sleep":"1s","retries":2}}}`,
		"unknown wait field":       `{"name":"a","tasks":{"s":{"wait_for_webhook":{"timeout":"1h","x":1}}}}`,
		"wait_for_webhook false":   `{"name":"a","tasks":{"s":{"wait_for_webhook":false}}}`,
		"retries out of range":     `{"name":"a","tasks":{"s":{"url":"https://x.example","retries":26}}}`,
		"task without type":        `{"name":"a","tasks":{"s":{"task":{"payload":{}}}}}`,
		"unversioned task type":    `{"name":"a","tasks":{"s":{"task":{"type":"billing.invoice"}}}}`,
		"unknown task field":       `{"name":"a","tasks":{"s":{"task":{"type":"a.b.v1","queue":"x"}}}}`,
		"task priority too high":   `{"name":"a","tasks":{"s":{"task":{"type":"a.b.v1","priority":1001}}}}`,
		"task and url":             `{"name":"a","tasks":{"s":{"task":{"type":"a.b.v1"},"url":"https://x.example"}}}`,
		"retry_delay on http step": `{"name":"a","tasks":{"s":{"url":"https://x.example","retry_delay":"1s"}}}`,
		"timeout on task step":     `{"name":"a","tasks":{"s":{"task":{"type":"a.b.v1"},"timeout":"1s"}}}`,
		"bad step name":            `{"name":"a","tasks":{"s.t":{"sleep":"1s"}}}`,
		"bad workflow name":        `{"name":"-a","tasks":{"s":{"sleep":"1s"}}}`,
		"enabled is not a boolean": `{"name":"a","enabled":"yes","tasks":{"s":{"sleep":"1s"}}}`,
	}
	for name, doc := range invalid {
		if _, err := spec.Parse([]byte(doc), spec.DefaultLimits); err == nil {
			t.Errorf("%s: the parser accepts it; pick another case", name)
		}
		var v any
		if err := json.Unmarshal([]byte(doc), &v); err != nil {
			t.Fatal(err)
		}
		if probs := conform(t, d, def, v, "$"); len(probs) == 0 {
			t.Errorf("%s: the schema accepts a definition the server rejects", name)
		}
	}
}

// ---- behaviour: the real server returns what the document says ----

type client struct {
	t   *testing.T
	d   obj
	url string
	key string
}

type reply struct {
	status int
	raw    []byte
	body   any
}

func (r reply) data() obj         { return m(m(r.body)["data"]) }
func (r reply) errorDetail() obj  { return m(m(r.body)["error"]) }
func (r reply) errorCode() string { s, _ := r.errorDetail()["code"].(string); return s }

// call sends a request for the route (e.g. "POST /api/v1/workflows") with
// the path filled in, and checks that the status is documented for that
// operation and that the body matches the documented schema.
func (c *client) call(route, path string, body string, header map[string]string) reply {
	c.t.Helper()
	method, pattern, _ := strings.Cut(route, " ")
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.url+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	r := reply{status: resp.StatusCode, raw: raw}
	ct, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
	if ct == "application/json" {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			c.t.Fatalf("%s %s: body is not JSON: %v: %s", method, path, err, raw)
		}
	}

	op := m(m(m(c.d["paths"])[pattern])[strings.ToLower(method)])
	if op == nil {
		c.t.Fatalf("%s is not documented", route)
	}
	doc := resolve(c.t, c.d, m(op["responses"])[strconv.Itoa(resp.StatusCode)])
	if doc == nil {
		c.t.Errorf("%s %s: the server returned %d, which is not documented (body %s)", method, path, resp.StatusCode, raw)
		return r
	}
	content := m(doc["content"])
	if len(content) == 0 {
		if len(bytes.TrimSpace(raw)) != 0 {
			c.t.Errorf("%s %s %d: documented without a body, got %s", method, path, resp.StatusCode, raw)
		}
		return r
	}
	media := m(content[ct])
	if media == nil {
		c.t.Errorf("%s %s %d: content type %q is not documented", method, path, resp.StatusCode, ct)
		return r
	}
	if ct != "application/json" {
		return r
	}
	if probs := conform(c.t, c.d, media["schema"], r.body, "$"); len(probs) > 0 {
		c.t.Errorf("%s %s %d: the body does not match the documented schema:\n  %s\nbody: %s",
			method, path, resp.StatusCode, strings.Join(probs, "\n  "), raw)
	}
	return r
}

func (c *client) expect(r reply, status int, code string) {
	c.t.Helper()
	if r.status != status {
		c.t.Fatalf("status %d, want %d; body %s", r.status, status, r.raw)
	}
	if code != "" && r.errorCode() != code {
		c.t.Fatalf("error code %q, want %q; body %s", r.errorCode(), code, r.raw)
	}
}

func newServer(t *testing.T, opts ...func(*ferry.Config)) (*client, *client) {
	t.Helper()
	ctx := context.Background()
	cfg := ferry.Config{
		Database: "sqlite:" + filepath.Join(t.TempDir(), "f.db"),
		Migrate:  true,
		Logger:   slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(&cfg)
	}
	eng, err := ferry.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.EnsureAPIKey(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(eng.Handler())
	t.Cleanup(func() {
		srv.Close()
		if err := eng.Close(); err != nil {
			t.Error(err)
		}
	})
	d := loadDoc(t)
	return &client{t: t, d: d, url: srv.URL, key: "k"}, &client{t: t, d: d, url: srv.URL}
}

const checkoutDef = `{
  "name": "checkout",
  "description": "wait for the payment provider, then ship",
  "max_duration": "2d",
  "tasks": {
    "payment": {"wait_for_webhook": {"timeout": "1h"}},
    "cool-off": {"needs": ["payment"], "sleep": "1h"},
    "ship": {
      "needs": ["cool-off"],
      "if": "tasks.payment.body.status == 'paid'",
      "url": "https://shop.example/ship",
      "body": {"payment_id": "{{tasks.payment.body.payment_id}}"}
    }
  }
}`

func TestOpenAPIMatchesServer(t *testing.T) {
	c, anon := newServer(t)

	// System routes.
	c.expect(anon.call("GET /healthz", "/healthz", "", nil), 200, "")
	r := anon.call("GET /openapi.yaml", "/openapi.yaml", "", nil)
	c.expect(r, 200, "")
	if !bytes.Equal(r.raw, api.OpenAPI()) {
		t.Error("GET /openapi.yaml does not serve the embedded document")
	}

	c.expect(anon.call("GET /metrics", "/metrics", "", nil), 401, "unauthorized")
	r = c.call("GET /metrics", "/metrics", "", nil)
	c.expect(r, 200, "")
	if !bytes.Contains(r.raw, []byte("# TYPE ferry_api_requests_total counter")) {
		t.Errorf("GET /metrics does not serve the metrics:\n%s", r.raw)
	}

	// Auth.
	c.expect(anon.call("GET /api/v1/workflows", "/api/v1/workflows", "", nil), 401, "unauthorized")
	bad := &client{t: t, d: c.d, url: c.url, key: "wrong"}
	c.expect(bad.call("POST /api/v1/workflows", "/api/v1/workflows", checkoutDef, nil), 401, "unauthorized")

	// Workflows.
	r = c.call("POST /api/v1/workflows", "/api/v1/workflows", checkoutDef, nil)
	c.expect(r, 201, "")
	wf := r.data()
	if wf["name"] != "checkout" || wf["task_count"] != 3.0 || wf["trigger"] != "api" || wf["enabled"] != true || wf["max_duration"] != "2d" {
		t.Errorf("create: unexpected workflow %s", r.raw)
	}
	if _, ok := wf["tasks"]; ok {
		t.Error("create: the response should not carry tasks")
	}
	wfID := wf["id"].(string)

	c.expect(c.call("POST /api/v1/workflows", "/api/v1/workflows", checkoutDef, nil), 409, "already_exists")

	invalid := `{"name":"order-processing","tasks":{
		"charge":{"url":"https://myapp.com/api/charge"},
		"send-receipt":{"needs":["chrage"],"url":"https://myapp.com/api/send-receipt"}}}`
	r = c.call("POST /api/v1/workflows", "/api/v1/workflows", invalid, nil)
	c.expect(r, 422, "invalid_workflow")
	details := listOf(r.errorDetail()["details"])
	if len(details) == 0 || m(details[0])["path"] != "tasks.send-receipt.needs[0]" || m(details[0])["code"] != "unknown_need" ||
		!strings.Contains(m(details[0])["message"].(string), `did you mean "charge"?`) {
		t.Errorf("422: unexpected details %s", r.raw)
	}
	c.expect(c.call("POST /api/v1/workflows", "/api/v1/workflows", `{"name":`, nil), 400, "invalid_json")
	huge := `{"name":"huge","description":"` + strings.Repeat("x", spec.DefaultLimits.MaxBytes) + `","tasks":{"s":{"sleep":1}}}`
	r = c.call("POST /api/v1/workflows", "/api/v1/workflows", huge, nil)
	c.expect(r, 422, "invalid_workflow")
	if details := listOf(r.errorDetail()["details"]); len(details) != 1 || m(details[0])["code"] != "too_large" {
		t.Errorf("oversized definition: %s", r.raw)
	}

	c.expect(c.call("GET /api/v1/workflows/{id}", "/api/v1/workflows/nope", "", nil), 404, "not_found")
	for _, ref := range []string{"checkout", wfID} {
		r = c.call("GET /api/v1/workflows/{id}", "/api/v1/workflows/"+ref, "", nil)
		c.expect(r, 200, "")
		if r.data()["id"] != wfID || m(r.data()["tasks"])["payment"] == nil {
			t.Errorf("get %s: %s", ref, r.raw)
		}
	}
	r = c.call("GET /api/v1/workflows", "/api/v1/workflows?limit=10", "", nil)
	c.expect(r, 200, "")
	if l := listOf(m(r.body)["data"]); len(l) != 1 || m(r.body)["next_cursor"] != nil {
		t.Errorf("list: %s", r.raw)
	}
	c.expect(c.call("GET /api/v1/workflows", "/api/v1/workflows?limit=0", "", nil), 400, "invalid_parameter")
	r = c.call("PUT /api/v1/workflows/{id}", "/api/v1/workflows/checkout", checkoutDef, nil)
	c.expect(r, 200, "")
	if r.data()["version"] != 1.0 {
		t.Errorf("an unchanged definition should keep version 1: %s", r.raw)
	}

	// Trigger, idempotently.
	idem := map[string]string{"Idempotency-Key": "order-123", "Content-Type": "application/json"}
	r = c.call("POST /api/v1/workflows/{id}/trigger", "/api/v1/workflows/checkout/trigger", `{"order_id": 123}`, idem)
	c.expect(r, 201, "")
	runID, _ := r.data()["run_id"].(string)
	if runID == "" || r.data()["workflow_id"] != wfID || r.data()["status"] != "running" {
		t.Fatalf("trigger: %s", r.raw)
	}
	r = c.call("POST /api/v1/workflows/{id}/trigger", "/api/v1/workflows/checkout/trigger", `{"order_id": 123}`, idem)
	c.expect(r, 200, "")
	if r.data()["run_id"] != runID {
		t.Errorf("a repeated Idempotency-Key started run %v, want %s", r.data()["run_id"], runID)
	}
	c.expect(c.call("POST /api/v1/workflows/{id}/trigger", "/api/v1/workflows/checkout/trigger", `{bad`, nil), 400, "invalid_json")
	c.expect(c.call("POST /api/v1/workflows/{id}/trigger", "/api/v1/workflows/nope/trigger", `{}`, nil), 404, "not_found")
	tooBig := `"` + strings.Repeat("x", api.MaxTriggerBody) + `"`
	c.expect(c.call("POST /api/v1/workflows/{id}/trigger", "/api/v1/workflows/checkout/trigger", tooBig, nil), 413, "too_large")

	// Runs.
	r = c.call("GET /api/v1/runs/{run_id}", "/api/v1/runs/"+runID, "", nil)
	c.expect(r, 200, "")
	tasks := m(r.data()["tasks"])
	if names := mapKeysInOrder(t, r.raw); !slices.Equal(names, []string{"payment", "cool-off", "ship"}) {
		t.Errorf("tasks are not in definition order: %v", names)
	}
	payment := m(tasks["payment"])
	if payment["status"] != "waiting" || payment["callback_url"] == nil {
		t.Fatalf("payment step: %s", r.raw)
	}
	callback := payment["callback_url"].(string)
	whPath := callback[strings.Index(callback, "/wh/"):]

	c.expect(c.call("GET /api/v1/workflows/{id}/runs/{run_id}", "/api/v1/workflows/checkout/runs/"+runID, "", nil), 200, "")
	c.expect(c.call("GET /api/v1/workflows/{id}/runs/{run_id}", "/api/v1/workflows/other/runs/"+runID, "", nil), 404, "not_found")
	c.expect(c.call("GET /api/v1/runs/{run_id}", "/api/v1/runs/nope", "", nil), 404, "not_found")
	r = c.call("GET /api/v1/workflows/{id}/runs", "/api/v1/workflows/checkout/runs", "", nil)
	c.expect(r, 200, "")
	if l := listOf(m(r.body)["data"]); len(l) != 1 || m(l[0])["id"] != runID || m(l[0])["tasks"] != nil {
		t.Errorf("list runs: %s", r.raw)
	}

	// Trigger a batch: in request order, keys as for a single trigger
	// (also repeated within the batch), all in one transaction.
	const batchRoute = "POST /api/v1/workflows/{id}/trigger-batch"
	batch := `{"runs": [{"input": {"order_id": 123}, "idempotency_key": "order-123"}, {"input": {"order_id": 7}, "idempotency_key": "b-7"}, {}, {"idempotency_key": "b-7"}]}`
	r = c.call(batchRoute, "/api/v1/workflows/checkout/trigger-batch", batch, nil)
	c.expect(r, 201, "")
	got := listOf(r.data()["runs"])
	if len(got) != 4 {
		t.Fatalf("batch: %s", r.raw)
	}
	if m(got[0])["run_id"] != runID || m(got[0])["created"] != false {
		t.Errorf("batch item 0 reused key order-123: got %v, want run %s, created false", got[0], runID)
	}
	if m(got[1])["created"] != true || m(got[2])["created"] != true || m(got[1])["run_id"] == m(got[2])["run_id"] {
		t.Errorf("batch items 1 and 2 should be two new runs: %s", r.raw)
	}
	if m(got[3])["run_id"] != m(got[1])["run_id"] || m(got[3])["created"] != false {
		t.Errorf("batch item 3 repeats key b-7 of item 1: %s", r.raw)
	}
	r = c.call("GET /api/v1/runs/{run_id}", "/api/v1/runs/"+m(got[2])["run_id"].(string), "", nil)
	c.expect(r, 200, "")
	if in := m(r.data()["input"]); len(in) != 0 {
		t.Errorf("an item without input should start a run with input {}: %s", r.raw)
	}
	r = c.call(batchRoute, "/api/v1/workflows/checkout/trigger-batch", `{"runs": [{"idempotency_key": "b-7"}]}`, nil)
	c.expect(r, 200, "")
	for body, path := range map[string]string{
		`{"runs": []}`:                           "runs",
		`{}`:                                     "runs",
		`{"runs": [{}, {"idempotency_key": 5}]}`: "runs[1].idempotency_key",
		`{"runs": [{"input": 1, "nope": true}]}`: "runs[0].nope",
		`{"runs": [{}, 3]}`:                      "runs[1]",
		`{"runs": [], "extra": 1}`:               "extra",
		`{"runs": [{}, null]}`:                   "runs[1]",
	} {
		r = c.call(batchRoute, "/api/v1/workflows/checkout/trigger-batch", body, nil)
		c.expect(r, 400, "invalid_request")
		if d := listOf(r.errorDetail()["details"]); len(d) != 1 || m(d[0])["path"] != path {
			t.Errorf("batch %s: details %v, want path %q", body, r.errorDetail()["details"], path)
		}
	}
	c.expect(c.call(batchRoute, "/api/v1/workflows/nope/trigger-batch", `{"runs": [{}]}`, nil), 404, "not_found")
	c.expect(c.call(batchRoute, "/api/v1/workflows/checkout/trigger-batch", `{"runs": [{}]}`, map[string]string{"Idempotency-Key": "k"}), 400, "invalid_request")
	// Headers are stored with every run: 1,000 runs of a 20 KiB header
	// would write 20 MiB.
	many := `{"runs": [` + strings.TrimSuffix(strings.Repeat(`{},`, 1000), ",") + `]}`
	c.expect(c.call(batchRoute, "/api/v1/workflows/checkout/trigger-batch", many, map[string]string{"X-Big": strings.Repeat("h", 20<<10)}), 413, "too_large")
	bigItem := `{"runs": [{"input": "` + strings.Repeat("x", api.MaxTriggerBody) + `"}]}`
	c.expect(c.call(batchRoute, "/api/v1/workflows/checkout/trigger-batch", bigItem, nil), 413, "too_large")

	// Webhook callbacks.
	c.expect(anon.call("POST /wh/{token}", "/wh/wh_unknown", `{}`, nil), 404, "not_found")
	r = anon.call("POST /wh/{token}", whPath, `{"status":"paid","payment_id":"pay_789"}`, map[string]string{"Content-Type": "application/json"})
	c.expect(r, 202, "")
	c.expect(anon.call("POST /wh/{token}", whPath, `{}`, nil), 409, "already_delivered")
	r = c.call("GET /api/v1/runs/{run_id}", "/api/v1/runs/"+runID, "", nil)
	c.expect(r, 200, "")
	payment = m(m(r.data()["tasks"])["payment"])
	if payment["status"] != "success" || m(payment["body"])["payment_id"] != "pay_789" || payment["is_truncated"] != false {
		t.Errorf("after the callback: %s", r.raw)
	}
	if m(m(r.data()["tasks"])["cool-off"])["status"] != "sleeping" {
		t.Errorf("cool-off should be sleeping: %s", r.raw)
	}

	// Events.
	r = c.call("GET /api/v1/runs/{run_id}/events", "/api/v1/runs/"+runID+"/events", "", nil)
	c.expect(r, 200, "")
	events := listOf(m(r.body)["data"])
	if len(events) < 3 || m(events[0])["type"] != "run_started" || m(events[0])["seq"] != 1.0 {
		t.Errorf("events: %s", r.raw)
	}
	r = c.call("GET /api/v1/runs/{run_id}/events", "/api/v1/runs/"+runID+"/events?after="+strconv.Itoa(len(events)), "", nil)
	c.expect(r, 200, "")
	if l := listOf(m(r.body)["data"]); l == nil || len(l) != 0 {
		t.Errorf("events after the last: %s", r.raw)
	}
	c.expect(c.call("GET /api/v1/runs/{run_id}/events", "/api/v1/runs/"+runID+"/events?after=-1", "", nil), 400, "invalid_parameter")

	// Cancel.
	r = c.call("POST /api/v1/workflows/{id}/runs/{run_id}/cancel", "/api/v1/workflows/checkout/runs/"+runID+"/cancel", "", nil)
	c.expect(r, 200, "")
	if r.data()["status"] != "cancelled" || m(m(r.data()["tasks"])["ship"])["status"] != "cancelled" {
		t.Errorf("cancel: %s", r.raw)
	}
	c.expect(c.call("POST /api/v1/runs/{run_id}/cancel", "/api/v1/runs/"+runID+"/cancel", "", nil), 409, "run_finished")

	// Disabled workflows cannot be triggered.
	disabled := strings.Replace(checkoutDef, `"max_duration"`, `"enabled": false, "max_duration"`, 1)
	r = c.call("PUT /api/v1/workflows/{id}", "/api/v1/workflows/"+wfID, disabled, nil)
	c.expect(r, 200, "")
	if r.data()["enabled"] != false {
		t.Errorf("update: %s", r.raw)
	}
	c.expect(c.call("POST /api/v1/workflows/{id}/trigger", "/api/v1/workflows/checkout/trigger", "", nil), 409, "workflow_disabled")

	// Delete.
	c.expect(c.call("DELETE /api/v1/workflows/{id}", "/api/v1/workflows/checkout", "", nil), 204, "")
	c.expect(c.call("DELETE /api/v1/workflows/{id}", "/api/v1/workflows/checkout", "", nil), 404, "not_found")
	c.expect(c.call("GET /api/v1/workflows/{id}", "/api/v1/workflows/"+wfID, "", nil), 404, "not_found")
	// The run outlives its workflow.
	c.expect(c.call("GET /api/v1/runs/{run_id}", "/api/v1/runs/"+runID, "", nil), 200, "")
}

// An early callback, before its step starts, is kept and satisfies it; a
// token takes one callback, and none once its step has ended.
func TestOpenAPIEarlyCallback(t *testing.T) {
	c, anon := newServer(t)
	def := `{"name":"early","tasks":{"first":{"wait_for_webhook":true},"second":{"needs":["first"],"wait_for_webhook":{}}}}`
	c.expect(c.call("POST /api/v1/workflows", "/api/v1/workflows", def, nil), 201, "")
	r := c.call("POST /api/v1/workflows/{id}/trigger", "/api/v1/workflows/early/trigger", "", nil)
	c.expect(r, 201, "")
	runID := r.data()["run_id"].(string)
	path := func(step string) string {
		r := c.call("GET /api/v1/runs/{run_id}", "/api/v1/runs/"+runID, "", nil)
		u := m(m(r.data()["tasks"])[step])["callback_url"].(string)
		return u[strings.Index(u, "/wh/"):]
	}
	second, first := path("second"), path("first")
	c.expect(anon.call("POST /wh/{token}", second, "not json", nil), 202, "")
	c.expect(anon.call("POST /wh/{token}", first, "", nil), 202, "")
	r = c.call("GET /api/v1/runs/{run_id}", "/api/v1/runs/"+runID, "", nil)
	c.expect(r, 200, "")
	tasks := m(r.data()["tasks"])
	if r.data()["status"] != "completed" || m(tasks["second"])["status"] != "success" || m(tasks["second"])["body"] != "not json" {
		t.Errorf("early callback: %s", r.raw)
	}
	if _, ok := m(tasks["first"])["body"]; !ok || m(tasks["first"])["body"] != nil {
		t.Errorf("an empty callback body should be stored as null: %s", r.raw)
	}
	c.expect(anon.call("POST /wh/{token}", second, "{}", nil), 409, "already_delivered")

	// A callback for a step that ended without one is refused.
	r = c.call("POST /api/v1/workflows/{id}/trigger", "/api/v1/workflows/early/trigger", "", nil)
	c.expect(r, 201, "")
	runID = r.data()["run_id"].(string)
	first = path("first")
	c.expect(c.call("POST /api/v1/runs/{run_id}/cancel", "/api/v1/runs/"+runID+"/cancel", "", nil), 200, "")
	c.expect(anon.call("POST /wh/{token}", first, "{}", nil), 409, "step_finished")
}

// mapKeysInOrder returns the keys of data.tasks as they appear in raw.
func mapKeysInOrder(t *testing.T, raw []byte) []string {
	t.Helper()
	var env struct {
		Data struct {
			Tasks json.RawMessage `json:"tasks"`
		} `json:"data"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(env.Data.Tasks))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// The task routes: the worker protocol end to end, every status the server
// returns checked against the document.
func TestOpenAPITasks(t *testing.T) {
	c, anon := newServer(t)
	c.expect(anon.call("POST /api/v1/tasks/claim", "/api/v1/tasks/claim", `{"types":["billing.%"]}`, nil), 401, "unauthorized")

	badPath := func(r reply, path string) {
		t.Helper()
		c.expect(r, 400, "invalid_request")
		if d := listOf(r.errorDetail()["details"]); len(d) != 1 || m(d[0])["path"] != path {
			t.Errorf("want one detail at %q: %s", path, r.raw)
		}
	}

	// Create, idempotently.
	create := `{"type":"billing.invoice.v1","payload":{"order_id":42},"priority":10,"idempotency_key":"order-42","max_attempts":3,"retry_delay":"10ms"}`
	r := c.call("POST /api/v1/tasks", "/api/v1/tasks", create, nil)
	c.expect(r, 201, "")
	tk := r.data()
	id, _ := tk["id"].(string)
	if id == "" || tk["status"] != "pending" || tk["attempt"] != 0.0 || tk["max_attempts"] != 3.0 || tk["retry_delay"] != "10ms" || tk["idempotency_key"] != "order-42" {
		t.Fatalf("create: %s", r.raw)
	}
	r = c.call("POST /api/v1/tasks", "/api/v1/tasks", create, nil)
	c.expect(r, 200, "")
	if r.data()["id"] != id {
		t.Errorf("a repeated idempotency_key created task %v, want %s", r.data()["id"], id)
	}
	badPath(c.call("POST /api/v1/tasks", "/api/v1/tasks", `{"type":"billing"}`, nil), "type")
	badPath(c.call("POST /api/v1/tasks", "/api/v1/tasks", `{"type":"a.b.v1","prio":1}`, nil), "prio")
	badPath(c.call("POST /api/v1/tasks", "/api/v1/tasks", `{"type":"a.b.v1","priority":"high"}`, nil), "priority")
	badPath(c.call("POST /api/v1/tasks", "/api/v1/tasks", `{"type":"a.b.v1","retry_delay":"soon"}`, nil), "retry_delay")
	c.expect(c.call("POST /api/v1/tasks", "/api/v1/tasks", `{"type":"a.b.v1","payload":"`+strings.Repeat("x", api.MaxTaskBody)+`"}`, nil), 413, "too_large")

	c.expect(c.call("GET /api/v1/tasks/{id}", "/api/v1/tasks/"+id, "", nil), 200, "")
	c.expect(c.call("GET /api/v1/tasks/{id}", "/api/v1/tasks/nope", "", nil), 404, "not_found")

	// Claim.
	badPath(c.call("POST /api/v1/tasks/claim", "/api/v1/tasks/claim", `{"types":[]}`, nil), "types")
	badPath(c.call("POST /api/v1/tasks/claim", "/api/v1/tasks/claim", `{"types":["billing.%","a%b"]}`, nil), "types[1]")
	badPath(c.call("POST /api/v1/tasks/claim", "/api/v1/tasks/claim", `{"types":["a.%"],"wait_seconds":61}`, nil), "wait_seconds")
	r = c.call("POST /api/v1/tasks/claim", "/api/v1/tasks/claim", `{"types":["nothing.%"]}`, nil)
	c.expect(r, 200, "")
	if l, ok := m(r.body)["data"].([]any); !ok || len(l) != 0 {
		t.Errorf("an empty claim should be an empty list: %s", r.raw)
	}
	claim := func(body string) obj {
		t.Helper()
		r := c.call("POST /api/v1/tasks/claim", "/api/v1/tasks/claim", body, nil)
		c.expect(r, 200, "")
		l := listOf(m(r.body)["data"])
		if len(l) != 1 || m(l[0])["id"] != id {
			t.Fatalf("claim: %s", r.raw)
		}
		return m(l[0])
	}
	ct := claim(`{"types":["billing.%"],"worker_id":"w1","lease_seconds":30,"max":5}`)
	tok1, _ := ct["lease_token"].(string)
	if tok1 == "" || ct["attempt"] != 1.0 || ct["run_id"] != nil {
		t.Fatalf("claimed task: %v", ct)
	}

	// Heartbeat, fail (retryable), stale reports.
	hb := func(tok string) reply {
		return c.call("POST /api/v1/tasks/{id}/heartbeat", "/api/v1/tasks/"+id+"/heartbeat", `{"lease_token":"`+tok+`","lease_seconds":60}`, nil)
	}
	r = hb(tok1)
	c.expect(r, 200, "")
	if r.data()["cancel_requested"] != false {
		t.Errorf("heartbeat: %s", r.raw)
	}
	c.expect(hb("stale"), 409, "stale_lease")
	badPath(c.call("POST /api/v1/tasks/{id}/heartbeat", "/api/v1/tasks/"+id+"/heartbeat", `{}`, nil), "lease_token")
	c.expect(c.call("POST /api/v1/tasks/{id}/heartbeat", "/api/v1/tasks/nope/heartbeat", `{"lease_token":"x"}`, nil), 404, "not_found")
	r = c.call("POST /api/v1/tasks/{id}/fail", "/api/v1/tasks/"+id+"/fail", `{"lease_token":"`+tok1+`","error":"smtp down","retryable":true}`, nil)
	c.expect(r, 200, "")
	if r.data()["status"] != "pending" || r.data()["last_error"] != "smtp down" {
		t.Errorf("retryable fail: %s", r.raw)
	}
	c.expect(c.call("POST /api/v1/tasks/{id}/complete", "/api/v1/tasks/"+id+"/complete", `{"lease_token":"`+tok1+`","result":{}}`, nil), 409, "stale_lease")
	c.expect(c.call("POST /api/v1/tasks/{id}/fail", "/api/v1/tasks/"+id+"/fail", `{"lease_token":"`+tok1+`"}`, nil), 409, "stale_lease")

	// The retry comes due after 10ms × 1²; the claim waits for it.
	ct = claim(`{"types":["billing.invoice.v1"],"worker_id":"w2","wait_seconds":10}`)
	if ct["attempt"] != 2.0 {
		t.Errorf("second claim: %v", ct)
	}
	r = c.call("POST /api/v1/tasks/{id}/complete", "/api/v1/tasks/"+id+"/complete", `{"lease_token":"`+ct["lease_token"].(string)+`","result":{"invoice_id":"inv_1"}}`, nil)
	c.expect(r, 200, "")
	if r.data()["status"] != "succeeded" || m(r.data()["result"])["invoice_id"] != "inv_1" || r.data()["finished_at"] == nil {
		t.Errorf("complete: %s", r.raw)
	}
	c.expect(c.call("POST /api/v1/tasks/{id}/cancel", "/api/v1/tasks/"+id+"/cancel", "", nil), 409, "task_finished")

	// Complete many: one answer per completion (the one above, with a
	// token that is not its own, stale; an unknown one not found), a
	// malformed request refused whole, naming the item's field.
	r = c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[{"id":"`+id+`","lease_token":"x"},{"id":"nope","lease_token":"x","result":{"a":1}}],"next":{"types":["billing.%"]}}`, nil)
	c.expect(r, 200, "")
	if l := listOf(m(r.body)["data"]); len(l) != 2 || m(l[0])["id"] != id || m(l[0])["status"] != 409.0 || m(m(l[0])["error"])["code"] != "stale_lease" ||
		m(l[1])["status"] != 404.0 || m(m(l[1])["error"])["code"] != "not_found" {
		t.Errorf("complete many: %s", r.raw)
	}
	badPath(c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[]}`, nil), "completions")
	badPath(c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[{"id":"a"}]}`, nil), "completions[0].lease_token")
	badPath(c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[{"id":"a","lease_token":"x"},{"id":"b","lease_token":"x","extra":1}]}`, nil), "completions[1].extra")
	r = c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[{"id":"a","lease_token":7}]}`, nil)
	badPath(r, "completions[0].lease_token")
	if msg := r.errorDetail()["message"]; msg != "completions[0].lease_token must be a string" {
		t.Errorf("message %q", msg)
	}
	for field, want := range map[string]string{"extra": `unknown field "extra" in completions[0]`, "unknown": `unknown field "unknown" in completions[0]`} {
		r = c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[{"id":"a","lease_token":"x","`+field+`":1}]}`, nil)
		if msg := r.errorDetail()["message"]; msg != want {
			t.Errorf("message %q, want %q", msg, want)
		}
	}
	badPath(c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":["a"]}`, nil), "completions[0]")
	badPath(c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[{"id":"a","lease_token":"x"}],"next":{"typez":["a.%"]}}`, nil), "next.typez")
	badPath(c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[{"id":"a","lease_token":"x"}],"next":{"types":[]}}`, nil), "next.types")
	badPath(c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[null]}`, nil), "completions[0].id")
	badPath(c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[{"id":"a","lease_token":"x"}],"bogus":1}`, nil), "bogus")
	badPath(c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[{"id":"a","lease_token":"x","extra":1}],"bogus":1}`, nil), "completions[0].extra")
	r = c.call("POST /api/v1/tasks/complete", "/api/v1/tasks/complete", `{"completions":[{"id":"nope","lease_token":"x"}],"next":null}`, nil)
	c.expect(r, 200, "")
	if l := listOf(m(r.body)["data"]); len(l) != 1 || m(l[0])["status"] != 404.0 || m(l[0])["next"] != nil {
		t.Errorf(`"next": null: %s`, r.raw)
	}

	// Events.
	r = c.call("GET /api/v1/tasks/{id}/events", "/api/v1/tasks/"+id+"/events", "", nil)
	c.expect(r, 200, "")
	var types []string
	for _, e := range listOf(m(r.body)["data"]) {
		types = append(types, m(e)["type"].(string))
	}
	if want := []string{"created", "claimed", "heartbeat", "retried", "claimed", "succeeded"}; !slices.Equal(types, want) {
		t.Errorf("events %v, want %v", types, want)
	}
	c.expect(c.call("GET /api/v1/tasks/{id}/events", "/api/v1/tasks/"+id+"/events?after=-1", "", nil), 400, "invalid_parameter")
	c.expect(c.call("GET /api/v1/tasks/{id}/events", "/api/v1/tasks/nope/events", "", nil), 404, "not_found")

	// Cancelling a leased task: the holder learns it at its heartbeat and
	// its report is refused.
	r = c.call("POST /api/v1/tasks", "/api/v1/tasks", `{"type":"video.encode.v2"}`, nil)
	c.expect(r, 201, "")
	id = r.data()["id"].(string)
	ct = claim(`{"types":["video.%"]}`)
	tok := ct["lease_token"].(string)
	r = c.call("POST /api/v1/tasks/{id}/cancel", "/api/v1/tasks/"+id+"/cancel", "", nil)
	c.expect(r, 200, "")
	if r.data()["status"] != "cancelled" || r.data()["cancel_requested"] != true {
		t.Errorf("cancel: %s", r.raw)
	}
	r = hb(tok)
	c.expect(r, 200, "")
	if r.data()["cancel_requested"] != true {
		t.Errorf("heartbeat after cancel: %s", r.raw)
	}
	c.expect(c.call("POST /api/v1/tasks/{id}/fail", "/api/v1/tasks/"+id+"/fail", `{"lease_token":"`+tok+`","retryable":false}`, nil), 409, "task_finished")
	c.expect(c.call("POST /api/v1/tasks/{id}/cancel", "/api/v1/tasks/nope/cancel", "", nil), 404, "not_found")

	// Task types.
	r = c.call("PUT /api/v1/task-types/{type}", "/api/v1/task-types/report.build.v1", `{"description":"Nightly report","enabled":false,"max_attempts":2,"retry_delay":"30s"}`, nil)
	c.expect(r, 200, "")
	if r.data()["enabled"] != false || r.data()["max_attempts"] != 2.0 || r.data()["retry_delay"] != "30s" {
		t.Errorf("put task type: %s", r.raw)
	}
	badPath(c.call("PUT /api/v1/task-types/{type}", "/api/v1/task-types/report", `{}`, nil), "type")
	badPath(c.call("PUT /api/v1/task-types/{type}", "/api/v1/task-types/report.build.v1", `{"enabled":"no"}`, nil), "enabled")
	c.expect(c.call("GET /api/v1/task-types/{type}", "/api/v1/task-types/report.build.v1", "", nil), 200, "")
	c.expect(c.call("GET /api/v1/task-types/{type}", "/api/v1/task-types/none.v1", "", nil), 404, "not_found")
	r = c.call("GET /api/v1/task-types", "/api/v1/task-types", "", nil)
	c.expect(r, 200, "")
	if l := listOf(m(r.body)["data"]); len(l) != 1 {
		t.Errorf("list task types: %s", r.raw)
	}
	// A disabled type's tasks wait.
	r = c.call("POST /api/v1/tasks", "/api/v1/tasks", `{"type":"report.build.v1"}`, nil)
	c.expect(r, 201, "")
	id = r.data()["id"].(string)
	if r.data()["max_attempts"] != 2.0 || r.data()["retry_delay"] != "30s" {
		t.Errorf("the type's defaults do not apply: %s", r.raw)
	}
	r = c.call("POST /api/v1/tasks/claim", "/api/v1/tasks/claim", `{"types":["report.%"]}`, nil)
	c.expect(r, 200, "")
	if len(listOf(m(r.body)["data"])) != 0 {
		t.Errorf("a disabled type's task was handed out: %s", r.raw)
	}
	c.expect(c.call("PUT /api/v1/task-types/{type}", "/api/v1/task-types/report.build.v1", `{}`, nil), 200, "")
	claim(`{"types":["report.%"]}`)

	// A workflow's task step: its task carries run_id and step, and the
	// result becomes the step's body.
	c.expect(c.call("POST /api/v1/workflows", "/api/v1/workflows", `{"name":"thumbs","tasks":{"resize":{"task":{"type":"content.thumbnail.v1","payload":{"id":"{{trigger.body.id}}"}}}}}`, nil), 201, "")
	r = c.call("POST /api/v1/workflows/{id}/trigger", "/api/v1/workflows/thumbs/trigger", `{"id":"img_1"}`, nil)
	c.expect(r, 201, "")
	runID := r.data()["run_id"].(string)
	r = c.call("GET /api/v1/runs/{run_id}", "/api/v1/runs/"+runID, "", nil)
	c.expect(r, 200, "")
	if s := m(m(r.data()["tasks"])["resize"]); s["type"] != "task" || s["status"] != "running" {
		t.Errorf("task step before the worker: %s", r.raw)
	}
	r = c.call("POST /api/v1/tasks/claim", "/api/v1/tasks/claim", `{"types":["content.%"]}`, nil)
	c.expect(r, 200, "")
	l := listOf(m(r.body)["data"])
	if len(l) != 1 || m(l[0])["run_id"] != runID || m(l[0])["step"] != "resize" || m(m(l[0])["payload"])["id"] != "img_1" {
		t.Fatalf("claim of a step's task: %s", r.raw)
	}
	id, tok = m(l[0])["id"].(string), m(l[0])["lease_token"].(string)
	c.expect(c.call("POST /api/v1/tasks/{id}/complete", "/api/v1/tasks/"+id+"/complete", `{"lease_token":"`+tok+`","result":{"thumbnail":"img_1-thumb.png"}}`, nil), 200, "")
	r = c.call("GET /api/v1/runs/{run_id}", "/api/v1/runs/"+runID, "", nil)
	c.expect(r, 200, "")
	if s := m(m(r.data()["tasks"])["resize"]); r.data()["status"] != "completed" || s["status"] != "success" || m(s["body"])["thumbnail"] != "img_1-thumb.png" {
		t.Errorf("task step after the worker: %s", r.raw)
	}

	// Eager dispatch: completing with "next" hands over the run's next step.
	c.expect(c.call("POST /api/v1/workflows", "/api/v1/workflows", `{"name":"pair","tasks":{"one":{"task":{"type":"pair.one.v1"}},"two":{"needs":["one"],"task":{"type":"pair.two.v1","payload":{"got":"{{tasks.one.body.n}}"}}}}}`, nil), 201, "")
	r = c.call("POST /api/v1/workflows/{id}/trigger", "/api/v1/workflows/pair/trigger", `{}`, nil)
	c.expect(r, 201, "")
	runID = r.data()["run_id"].(string)
	r = c.call("POST /api/v1/tasks/claim", "/api/v1/tasks/claim", `{"types":["pair.%"]}`, nil)
	c.expect(r, 200, "")
	l = listOf(m(r.body)["data"])
	if len(l) != 1 {
		t.Fatalf("claim pair.one: %s", r.raw)
	}
	id, tok = m(l[0])["id"].(string), m(l[0])["lease_token"].(string)
	completeURL := "/api/v1/tasks/" + id + "/complete"
	badPath(c.call("POST /api/v1/tasks/{id}/complete", completeURL, `{"lease_token":"`+tok+`","next":{"types":[]}}`, nil), "next.types")
	badPath(c.call("POST /api/v1/tasks/{id}/complete", completeURL, `{"lease_token":"`+tok+`","next":{"types":["pair.%"],"wait_seconds":5}}`, nil), "next.wait_seconds")
	r = c.call("POST /api/v1/tasks/{id}/complete", completeURL, `{"lease_token":"`+tok+`","result":{"n":7},"next":{"types":["pair.%"],"worker_id":"w-pair"}}`, nil)
	c.expect(r, 200, "")
	next := listOf(m(r.body)["next"])
	if r.data()["status"] != "succeeded" || len(next) != 1 || m(next[0])["step"] != "two" || m(next[0])["run_id"] != runID || m(m(next[0])["payload"])["got"] != 7.0 {
		t.Fatalf("complete with next: %s", r.raw)
	}
	r = c.call("GET /api/v1/tasks/{id}", "/api/v1/tasks/"+m(next[0])["id"].(string), "", nil)
	c.expect(r, 200, "")
	if r.data()["status"] != "leased" || r.data()["leased_by"] != "w-pair" {
		t.Errorf("the handed task: %s", r.raw)
	}
	c.expect(c.call("POST /api/v1/tasks/{id}/complete", "/api/v1/tasks/"+m(next[0])["id"].(string)+"/complete", `{"lease_token":"`+m(next[0])["lease_token"].(string)+`","next":{"types":["pair.%"]}}`, nil), 200, "")
	r = c.call("GET /api/v1/runs/{run_id}", "/api/v1/runs/"+runID, "", nil)
	c.expect(r, 200, "")
	if r.data()["status"] != "completed" {
		t.Errorf("run after eager steps: %s", r.raw)
	}
}

// TestOpenAPITracedTasks: with tracing on, the tasks of a run handed out
// by a claim and by a completion's next carry the run's traceparent, as
// the document describes it.
func TestOpenAPITracedTasks(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c, _ := newServer(t, func(cfg *ferry.Config) { cfg.TracerProvider = tp })
	c.expect(c.call("POST /api/v1/workflows", "/api/v1/workflows", `{"name": "two", "tasks": {
		"a": {"task": {"type": "traced.a.v1"}},
		"b": {"needs": ["a"], "task": {"type": "traced.b.v1"}}}}`, nil), 201, "")
	r := c.call("POST /api/v1/workflows/{id}/trigger", "/api/v1/workflows/two/trigger", `{}`,
		map[string]string{"Traceparent": "00-0102030405060708090a0b0c0d0e0f10-0807060504030201-01"})
	c.expect(r, 201, "")
	want := "00-0102030405060708090a0b0c0d0e0f10-0807060504030201-01"
	r = c.call("POST /api/v1/tasks/claim", "/api/v1/tasks/claim", `{"types":["traced.%"],"worker_id":"w"}`, nil)
	c.expect(r, 200, "")
	l := listOf(m(r.body)["data"])
	if len(l) != 1 || m(l[0])["traceparent"] != want {
		t.Fatalf("claimed %s, want one task with traceparent %s", r.raw, want)
	}
	a := m(l[0])
	r = c.call("POST /api/v1/tasks/{id}/complete", "/api/v1/tasks/"+a["id"].(string)+"/complete",
		`{"lease_token":"`+a["lease_token"].(string)+`","result":{},"next":{"types":["traced.%"],"worker_id":"w"}}`, nil)
	c.expect(r, 200, "")
	if next := listOf(m(r.body)["next"]); len(next) != 1 || m(next[0])["traceparent"] != want {
		t.Fatalf("completed with next: %s, want b with traceparent %s", r.raw, want)
	}
}
