package httpwrap

import (
	"net/http"
	"strings"
)

// StatusWriter remembers the status code written (200 until one is).
type StatusWriter struct {
	http.ResponseWriter
	Code    int
	Written bool // a header or body was written
}

// NewStatusWriter wraps w.
func NewStatusWriter(w http.ResponseWriter) *StatusWriter {
	if sw, ok := w.(*StatusWriter); ok {
		return sw
	}
	return &StatusWriter{ResponseWriter: w, Code: http.StatusOK}
}

func (w *StatusWriter) WriteHeader(code int) {
	if !w.Written {
		w.Code, w.Written = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(b []byte) (int, error) {
	w.Written = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer
// (flushes, deadlines).
func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// RedactPath is a request's path as logs and spans may show it: a
// webhook's (/wh/<token>) without its callback token, which is its
// caller's credential.
func RedactPath(p string) string {
	if strings.HasPrefix(p, "/wh/") {
		return "/wh/REDACTED"
	}
	return p
}
