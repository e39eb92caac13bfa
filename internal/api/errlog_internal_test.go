package api

import (
	"bytes"
	"errors"
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
