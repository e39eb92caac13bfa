package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestInternalErrorLogKeepsTheTokenOut: a 500 on the webhook route is
// logged with the path's callback token replaced, the credential of the
// webhook's caller. (Found by an audit.)
func TestInternalErrorLogKeepsTheTokenOut(t *testing.T) {
	var logged bytes.Buffer
	s := &Server{log: slog.New(slog.NewTextHandler(&logged, nil))}
	rec := httptest.NewRecorder()
	s.writeErr(rec, httptest.NewRequest(http.MethodPost, "/wh/wh_SECRETTOKEN", nil), errors.New("database is closed"))
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("answer %d", rec.Code)
	}
	if strings.Contains(logged.String(), "SECRETTOKEN") || !strings.Contains(logged.String(), "path=/wh/REDACTED") {
		t.Errorf("log %q: want the path without the token", logged.String())
	}
}

// TestClientGoneIsNoServerError: a request whose client hung up (its
// context cancelled, and the query it waited on failed for it) is
// answered StatusClientClosed and logged at debug, not as a 500 "request
// failed" error: clients' timeouts made 5xx counts and error logs of a
// server that had nothing wrong. A request still wanted that fails is
// an error as before. (Found by an audit.)
func TestClientGoneIsNoServerError(t *testing.T) {
	var logged bytes.Buffer
	s := &Server{log: slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	s.writeErr(rec, httptest.NewRequestWithContext(ctx, http.MethodPost, "/api/v1/runs/r1/cancel", nil), fmt.Errorf("lock: statement 1 of 3: %w", context.Canceled))
	if rec.Code != StatusClientClosed {
		t.Errorf("a request whose client hung up: answered %d, want %d", rec.Code, StatusClientClosed)
	}
	if l := logged.String(); strings.Contains(l, "level=ERROR") || !strings.Contains(l, "level=DEBUG") {
		t.Errorf("log %q: want it at debug, not as an error", l)
	}
	logged.Reset()
	rec = httptest.NewRecorder()
	s.writeErr(rec, httptest.NewRequest(http.MethodPost, "/api/v1/runs/r1/cancel", nil), errors.New("database is closed"))
	if rec.Code != http.StatusInternalServerError || !strings.Contains(logged.String(), "level=ERROR") {
		t.Errorf("a failure with the client waiting: %d, log %q; want 500 and an error", rec.Code, logged.String())
	}
}
