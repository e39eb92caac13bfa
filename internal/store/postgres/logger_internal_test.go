package postgres

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// lockedBuffer is a log sink safe for the store's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStoreLogsToItsLogger: the store's own messages (here a node joining
// the timer share) go to the logger it was given, at its level and in its
// format, not to slog's default, which a server does not set. (Found by an
// audit: they ignored --log-level and came out in log's format.)
func TestStoreLogsToItsLogger(t *testing.T) {
	dsn := pgtest.DSN(t)
	a := openNode(t, dsn)
	var info, errorsOnly lockedBuffer
	a.SetLogger(slog.New(slog.NewTextHandler(&info, &slog.HandlerOptions{Level: slog.LevelInfo})))
	listen(t, a)
	b := openNode(t, dsn)
	b.SetLogger(slog.New(slog.NewTextHandler(&errorsOnly, &slog.HandlerOptions{Level: slog.LevelError})))
	listen(t, b)
	poll(t, "a logs that b joined", func() bool { return strings.Contains(info.String(), "msg=\"postgres node joined the timer share\"") })
	poll(t, "b counts a", func() bool { _, of := b.timerShare(); return of == 2 })
	if s := errorsOnly.String(); s != "" {
		t.Errorf("b's logger at error level got %q", s)
	}
}
