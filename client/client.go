package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// maxResponse bounds how much of a response body is read.
const maxResponse = 256 << 20

// Client calls one Ferry server with one API key. It is safe for concurrent
// use.
type Client struct {
	base   string
	apiKey string
	hc     *http.Client
	ua     string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client send requests through hc instead of
// the default one, whose transport (NewTransport) keeps up to
// MaxIdleConnsPerHost idle connections to the server. A transport of
// your own should keep as many as the client has requests in flight, or
// its connections are closed and opened again. The default is not
// http.DefaultClient: settings made on that (a proxy, tracing, TLS) reach
// a Client only through this option.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.ua = ua }
}

// MaxIdleConnsPerHost is how many idle connections to the server the
// default HTTP client keeps: at least as many as a worker has requests in
// flight (one per handler reporting, and its claim).
const MaxIdleConnsPerHost = 4096

// defaultHTTP is the HTTP client every Client uses unless given its own.
// http.DefaultClient keeps two idle connections per host and 100 in all,
// so a worker with more requests in flight than that closed a connection
// after nearly every report and opened a new one for the next: 13,455
// sockets were left in TIME_WAIT by a 2.5-second chain10 benchmark of 16
// handlers over loopback, and each request paid a TCP handshake (and a
// TLS one, over TLS). Idle connections still close after the transport's
// IdleConnTimeout.
var defaultHTTP = &http.Client{Transport: NewTransport()}

// NewTransport is the default client's transport: http.DefaultTransport's
// settings (a copy, taken when called), keeping up to MaxIdleConnsPerHost
// idle connections to the server. A client given with WithHTTPClient may
// start from it. If http.DefaultTransport was replaced by something other
// than an *http.Transport, it starts from Go's documented defaults.
func NewTransport() *http.Transport {
	t, ok := http.DefaultTransport.(*http.Transport)
	if ok {
		t = t.Clone()
	} else {
		t = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
	}
	// No limit on idle connections in all: a client talks to one server,
	// whose limit is the one below, and idle ones still close after
	// IdleConnTimeout.
	t.MaxIdleConns = 0
	t.MaxIdleConnsPerHost = MaxIdleConnsPerHost
	return t
}

// New returns a client for the server at baseURL (e.g.
// "http://127.0.0.1:8080"; a path prefix is kept) that authenticates with
// apiKey.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), apiKey: apiKey, hc: defaultHTTP, ua: "ferry-go-client"}
	for _, o := range opts {
		o(c)
	}
	return c
}

// ---- workflows ----

// CreateWorkflow stores a new workflow from a JSON or YAML definition. A
// workflow of that name already existing is an *APIError with code
// already_exists.
func (c *Client) CreateWorkflow(ctx context.Context, def []byte) (*Workflow, error) {
	var wf Workflow
	if _, err := c.do(ctx, http.MethodPost, "/api/v1/workflows", definitionHeader(def), bytes.NewReader(def), &wf); err != nil {
		return nil, err
	}
	return &wf, nil
}

// UpdateWorkflow replaces the definition of the workflow with the given id
// or name. The version only increases when the definition's content changed.
func (c *Client) UpdateWorkflow(ctx context.Context, ref string, def []byte) (*Workflow, error) {
	var wf Workflow
	if _, err := c.do(ctx, http.MethodPut, "/api/v1/workflows/"+url.PathEscape(ref), definitionHeader(def), bytes.NewReader(def), &wf); err != nil {
		return nil, err
	}
	return &wf, nil
}

// ApplyWorkflow creates the workflow named name, or updates it when it
// already exists; created reports which. name must be the name inside def
// (callers holding YAML parse it out themselves; for a JSON def an empty name
// is read from the document).
func (c *Client) ApplyWorkflow(ctx context.Context, name string, def []byte) (wf *Workflow, created bool, err error) {
	if name == "" {
		var doc struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(bytes.TrimPrefix(def, []byte("\ufeff")), &doc) == nil { // a byte-order mark, as the server drops it
			name = doc.Name
		}
	}
	wf, err = c.CreateWorkflow(ctx, def)
	if err == nil {
		return wf, true, nil
	}
	if !HasCode(err, CodeAlreadyExists) || name == "" {
		return nil, false, err
	}
	wf, err = c.UpdateWorkflow(ctx, name, def)
	if err != nil {
		return nil, false, err
	}
	return wf, false, nil
}

// GetWorkflow returns the workflow with the given id or name, including its
// tasks.
func (c *Client) GetWorkflow(ctx context.Context, ref string) (*Workflow, error) {
	var wf Workflow
	if _, err := c.do(ctx, http.MethodGet, "/api/v1/workflows/"+url.PathEscape(ref), nil, nil, &wf); err != nil {
		return nil, err
	}
	return &wf, nil
}

// ListWorkflows returns one page of workflows ordered by name. Pass the
// returned next cursor to get the following page; it is "" after the last.
// A limit of 0 uses the server's default page size.
func (c *Client) ListWorkflows(ctx context.Context, cursor string, limit int) ([]Workflow, string, error) {
	var out []Workflow
	next, err := c.list(ctx, "/api/v1/workflows", cursor, limit, &out)
	return out, next, err
}

// DeleteWorkflow deletes the workflow with the given id or name. Its runs
// keep going on their pinned version.
func (c *Client) DeleteWorkflow(ctx context.Context, ref string) error {
	_, err := c.do(ctx, http.MethodDelete, "/api/v1/workflows/"+url.PathEscape(ref), nil, nil, nil)
	return err
}

// ---- runs ----

// Trigger starts a run of the workflow with the given id or name. input is
// the JSON trigger payload (nil means {}). With a non-empty idempotencyKey a
// repeated trigger returns the first run and created=false.
func (c *Client) Trigger(ctx context.Context, ref string, input json.RawMessage, idempotencyKey string) (*TriggerResult, bool, error) {
	h := http.Header{"Content-Type": {"application/json"}}
	if idempotencyKey != "" {
		// A header drops the spaces at a value's ends and cannot carry a
		// line break: such a key is refused here as the server refuses it
		// in a batch, not sent as another key.
		if strings.Trim(idempotencyKey, " \t") != idempotencyKey || strings.ContainsFunc(idempotencyKey, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }) {
			msg := "an idempotency key must be UTF-8 text without control characters (but the tab) or spaces or tabs at its ends"
			return nil, false, &APIError{StatusCode: http.StatusBadRequest, Code: CodeInvalidRequest, Message: msg,
				Details: []FieldDetail{{Path: "Idempotency-Key", Code: CodeInvalidRequest, Message: msg}}} // as the server names the header
		}
		h.Set("Idempotency-Key", idempotencyKey)
	}
	var body io.Reader
	if len(input) > 0 {
		body = bytes.NewReader(input)
	}
	// One pass: producers trigger runs one request each, often many.
	res, code, err := doData[TriggerResult](ctx, c, http.MethodPost, "/api/v1/workflows/"+url.PathEscape(ref)+"/trigger", h, body)
	if err != nil {
		return nil, false, err
	}
	return &res, code == http.StatusCreated, nil
}

// MaxTriggerBatch is the most runs one TriggerBatch call may start.
const MaxTriggerBatch = 1000

// TriggerBatch starts runs of a workflow, one per item, in one transaction
// on the server (1 to MaxTriggerBatch items): all of them, or on an error
// none. Results are in item order; an idempotency key already used, also
// earlier in the same batch, returns the first run with Created false.
func (c *Client) TriggerBatch(ctx context.Context, ref string, runs []BatchRun) ([]BatchResult, error) {
	res, err := postData[struct {
		Runs []BatchResult `json:"runs"`
	}](ctx, c, "/api/v1/workflows/"+url.PathEscape(ref)+"/trigger-batch", map[string]any{"runs": runs})
	if err != nil {
		return nil, err
	}
	if len(res.Runs) != len(runs) {
		return nil, fmt.Errorf("ferry: trigger batch: %d results for %d runs", len(res.Runs), len(runs))
	}
	return res.Runs, nil
}

// ListRuns returns one page of a workflow's runs, newest first, without
// their tasks. A limit of 0 uses the server's default page size.
func (c *Client) ListRuns(ctx context.Context, ref, cursor string, limit int) ([]Run, string, error) {
	var out []Run
	next, err := c.list(ctx, "/api/v1/workflows/"+url.PathEscape(ref)+"/runs", cursor, limit, &out)
	return out, next, err
}

// GetRun returns a run with its input and the result of every step.
func (c *Client) GetRun(ctx context.Context, runID string) (*Run, error) {
	var run Run
	if _, err := c.do(ctx, http.MethodGet, "/api/v1/runs/"+url.PathEscape(runID), nil, nil, &run); err != nil {
		return nil, err
	}
	return &run, nil
}

// CancelRun cancels a run that has not finished and returns it. Cancelling a
// finished run is an *APIError with code run_finished.
func (c *Client) CancelRun(ctx context.Context, runID string) (*Run, error) {
	var run Run
	if _, err := c.do(ctx, http.MethodPost, "/api/v1/runs/"+url.PathEscape(runID)+"/cancel", nil, nil, &run); err != nil {
		return nil, err
	}
	return &run, nil
}

// eventsPage is the most events the server returns at once.
const eventsPage = 1000

// Events returns a run's events with a sequence number above after, oldest
// first, fetching as many batches as needed.
func (c *Client) Events(ctx context.Context, runID string, after int64) ([]Event, error) {
	out := []Event{}
	for {
		q := url.Values{}
		if after > 0 {
			q.Set("after", strconv.FormatInt(after, 10))
		}
		var batch []Event
		if _, err := c.do(ctx, http.MethodGet, "/api/v1/runs/"+url.PathEscape(runID)+"/events"+encode(q), nil, nil, &batch); err != nil {
			return nil, err
		}
		out = append(out, batch...)
		if len(batch) < eventsPage || batch[len(batch)-1].Seq <= after {
			return out, nil
		}
		after = batch[len(batch)-1].Seq
	}
}

// ---- transport ----

// definitionHeader labels a definition: the server reads JSON and YAML alike,
// sent as is, so this only informs proxies and logs.
func definitionHeader(def []byte) http.Header {
	t := bytes.TrimSpace(def)
	if len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		return http.Header{"Content-Type": {"application/json"}}
	}
	return http.Header{"Content-Type": {"application/yaml"}}
}

func encode(q url.Values) string {
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

func (c *Client) list(ctx context.Context, path, cursor string, limit int, out any) (string, error) {
	q := url.Values{}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var env struct {
		Data       json.RawMessage `json:"data"`
		NextCursor *string         `json:"next_cursor"`
	}
	if _, err := c.doRaw(ctx, http.MethodGet, path+encode(q), nil, nil, &env); err != nil {
		return "", err
	}
	if err := json.Unmarshal(env.Data, out); err != nil {
		return "", fmt.Errorf("ferry: decode %s response: %w", path, err)
	}
	if env.NextCursor == nil {
		return "", nil
	}
	return *env.NextCursor, nil
}

// do sends a request and decodes the "data" member of the response into out
// (when out is not nil). It returns the HTTP status code.
func (c *Client) do(ctx context.Context, method, path string, h http.Header, body io.Reader, out any) (int, error) {
	if out == nil {
		return c.doRaw(ctx, method, path, h, body, nil)
	}
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	code, err := c.doRaw(ctx, method, path, h, body, &env)
	if err != nil {
		return code, err
	}
	if len(env.Data) == 0 {
		return code, fmt.Errorf("ferry: %s %s: response has no data", method, path)
	}
	if err := json.Unmarshal(env.Data, out); err != nil {
		return code, fmt.Errorf("ferry: decode %s %s response: %w", method, path, err)
	}
	return code, nil
}

// doRaw sends a request and decodes a successful response body into out
// (when out is not nil and there is a body). Error responses become
// *APIError.
func (c *Client) doRaw(ctx context.Context, method, path string, h http.Header, body io.Reader, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return 0, fmt.Errorf("ferry: %w", err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.ua)
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("ferry: %s %s: read response: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, decodeError(resp.StatusCode, b)
	}
	if out == nil || len(bytes.TrimSpace(b)) == 0 {
		return resp.StatusCode, nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return resp.StatusCode, fmt.Errorf("ferry: decode %s %s response: %w", method, path, err)
	}
	return resp.StatusCode, nil
}

func decodeError(status int, b []byte) error {
	var env struct {
		Error *struct {
			Code    string        `json:"code"`
			Message string        `json:"message"`
			Details []FieldDetail `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err == nil && env.Error != nil && env.Error.Code != "" {
		return &APIError{StatusCode: status, Code: env.Error.Code, Message: env.Error.Message, Details: env.Error.Details}
	}
	msg := strings.TrimSpace(string(b))
	if r := []rune(msg); len(r) > 200 {
		msg = string(r[:200]) + "…"
	}
	return &APIError{StatusCode: status, Message: msg}
}
