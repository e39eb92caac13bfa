package httpwrap

import (
	"io"
	"net/http"
	"sync"
	"time"
)

// BodyDeadline bounds how long a request's body may take to arrive: d
// from the request's start until the body's end, after which reading it
// fails and the request ends. A client that sends its headers and then a
// body a byte at a time (or never) otherwise held a handler and its
// connection for as long as it liked, and the webhook port is often
// public. The deadline is lifted once the body has been read, so a claim
// that long-polls after reading its request is not cut short. d <= 0: no
// bound.
func BodyDeadline(h http.Handler, d time.Duration) http.Handler {
	if d <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err != nil {
			h.ServeHTTP(w, r) // a writer that cannot: as before
			return
		}
		r.Body = &deadlineBody{ReadCloser: r.Body, lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
		h.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the read deadline when the body has been read whole.
type deadlineBody struct {
	io.ReadCloser
	once sync.Once
	lift func()
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.lift)
	}
	return n, err
}
