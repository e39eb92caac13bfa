package postgres

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/status"
	"github.com/ferryhq/ferry/internal/store"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// TestPeerReadyRoundTrip: what a node's commits made ready survives the
// notification's encoding: types of any characters (task types are
// checked before they are stored, but the encoding does not rely on it),
// none new, as many as fit and too many to carry (then nil: the other
// nodes read them), and the earliest HTTP attempt and timer. The encoding
// has no ':' (the payload's separator) and fits a notification.
func TestPeerReadyRoundTrip(t *testing.T) {
	at := time.Unix(1_700_000_000, 123_456_789)
	var many peerReady
	for i := range 200 {
		many.add(store.Committed{Tasks: true, Types: []string{strings.Repeat("x", 30) + string(rune('a'+i%26)) + strings.Repeat("y", i)}})
	}
	fullest, full := readyAtLimit()
	var ahead, mixed peerReady
	ahead.add(store.Committed{Tasks: true, Types: []string{"a.v1"}, TasksAt: at.Add(time.Hour)})
	ahead.add(store.Committed{Tasks: true, Types: []string{"a.v1"}, TasksAt: at.Add(time.Minute)})
	mixed.add(store.Committed{Tasks: true, Types: []string{"a.v1"}, TasksAt: at.Add(time.Hour)})
	mixed.add(store.Committed{Tasks: true, Types: []string{"a.v1"}})
	var merged peerReady
	merged.add(store.Committed{Tasks: true, Types: []string{"a.v1"}, TimerDue: at.Add(time.Second)})
	merged.add(store.Committed{Tasks: true, Types: []string{"a.v1", "b.v1"}, HTTPDue: at, TimerDue: at})
	merged.add(store.Committed{HTTPDue: at.Add(time.Hour)})
	for name, c := range map[string]struct {
		in   peerReady
		want peerReady
	}{
		"odd types":               {peerReady{tasks: true, types: []string{"a:b", "c,d", "e&f=g", "h?i", "ü.v1", "%zz"}}, peerReady{tasks: true, types: []string{"a:b", "c,d", "e&f=g", "h?i", "ü.v1", "%zz"}}},
		"none new":                {peerReady{tasks: true, types: []string{}}, peerReady{tasks: true, types: []string{}}},
		"too many":                {many, peerReady{tasks: true}},
		"escaped, too many":       {full, peerReady{tasks: true}},
		"escaped, as many as fit": {fullest, peerReady{tasks: true, types: fullest.types}},
		"merged":                  {merged, peerReady{tasks: true, types: []string{"a.v1", "b.v1"}, http: at, timer: at}},
		"timer only":              {peerReady{timer: at}, peerReady{timer: at}},
		"tasks ahead":             {ahead, peerReady{tasks: true, types: []string{"a.v1"}, tasksAt: at.Add(time.Minute)}},
		"one at once":             {mixed, peerReady{tasks: true, types: []string{"a.v1"}, tasksNow: true}},
		"tasks, types":            {peerReady{tasks: true, types: []string{"a.v1"}, http: at}, peerReady{tasks: true, types: []string{"a.v1"}, http: at}},
	} {
		enc := c.in.encode()
		if strings.Contains(enc, ":") {
			t.Errorf("%s: %q has a ':'", name, enc)
		}
		if len("NODEID0123456789ABCDEFGHIJ?:")+len(enc)+63 >= 8000 {
			t.Errorf("%s: %d bytes, more than a notification carries", name, len(enc))
		}
		got, err := decodeReady(enc)
		if err != nil {
			t.Errorf("%s: decode %q: %v", name, enc, err)
			continue
		}
		if got.tasks != c.want.tasks || (got.types == nil) != (c.want.types == nil) || !slices.Equal(got.types, c.want.types) || !got.http.Equal(c.want.http) || !got.timer.Equal(c.want.timer) || !got.tasksAt.Equal(c.want.tasksAt) || got.tasksNow != (c.want.tasks && c.want.tasksAt.IsZero()) {
			t.Errorf("%s: %q decoded to %+v, want %+v", name, enc, got, c.want)
		}
	}
	for _, bad := range []string{"", "x=1", "%zz", "w=soon", "h=1e3", "t=1&a=later"} {
		if r, err := decodeReady(bad); err == nil {
			t.Errorf("decode %q = %+v, want an error", bad, r)
		}
	}
}

// readyAtLimit is the most types that escape to three times their length
// a notification carries, and the same with one more (which carries none).
func readyAtLimit() (fits, over peerReady) {
	for i := 0; ; i++ {
		typ := strings.Repeat("ü", 20) + strconv.Itoa(i)
		next := fits
		next.types = slices.Clone(fits.types)
		next.add(store.Committed{Tasks: true, Types: []string{typ}})
		if next.types == nil {
			return fits, next
		}
		fits = next
	}
}

// TestPeerNotificationForms: a notification that says what another node's
// commits made ready is told to the commit hook, types and all (that they
// are noted is TestPeerTasksOfNewTypes's), and one
// that does not (a node of an earlier version, or a payload this node
// cannot read) wakes everything through Wakeups.
func TestPeerNotificationForms(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := openNode(t, dsn)
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	told := make(chan store.Committed, 10)
	s.OnCommit(func(c store.Committed) { told <- c })
	wake, _ := listen(t, s)
	poll(t, "the node's own hello back", func() bool { return s.self.Load() >= 0 })
	for len(wake) > 0 {
		<-wake
	}
	send := func(payload string) {
		t.Helper()
		s.notify(payload + ":" + s.scope)
	}
	send("PEER?t=1&y=peer.a.v1&y=peer.b.v1")
	select {
	case c := <-told:
		if !c.Tasks || !slices.Equal(c.Types, []string{"peer.a.v1", "peer.b.v1"}) || !c.HTTPDue.IsZero() || !c.TimerDue.IsZero() || !c.TasksAt.IsZero() {
			t.Fatalf("told %+v, want tasks of peer.a.v1 and peer.b.v1, claimable at once", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a peer's commit was not told to the hook within 10s")
	}
	send("PEER?t=1&y=peer.a.v1&a=1700000000000000000")
	select {
	case c := <-told:
		if !c.Tasks || !c.TasksAt.Equal(time.Unix(1_700_000_000, 0)) {
			t.Fatalf("told %+v, want tasks claimable from %v", c, time.Unix(1_700_000_000, 0))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a peer's commit of tasks ahead was not told to the hook within 10s")
	}
	fits, _ := readyAtLimit()
	send("PEER?" + fits.encode()) // through a real NOTIFY
	select {
	case c := <-told:
		if !slices.Equal(c.Types, fits.types) {
			t.Fatalf("told %d types, want the %d sent", len(c.Types), len(fits.types))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a notification of as many types as fit was not told to the hook within 10s")
	}
	for _, p := range []string{"PEER", "PEER?%zz", "PEER?"} {
		send(p)
		select {
		case <-wake:
		case c := <-told:
			t.Fatalf("%q: told %+v, want a wake-up for everything", p, c)
		case <-time.After(10 * time.Second):
			t.Fatalf("%q: no wake-up within 10s", p)
		}
	}
	if got, err := s.ClaimTasks(context.Background(), store.ClaimTasks{Patterns: []string{"peer.%"}, WorkerID: "w", Lease: time.Minute, Max: 1, Now: time.Now()}); err != nil || len(got) != 0 {
		t.Fatalf("claim of types noted from a peer, none pending: %d tasks, %v", len(got), err)
	}
}

// TestFailedNotificationWakesEverythingNext: when a NOTIFY fails (here, a
// payload over Postgres's limit), what it carried is not lost: the node's
// next notification wakes the others for everything.
func TestFailedNotificationWakesEverythingNext(t *testing.T) {
	a, heard := failOneNotification(t)
	poll(t, "the failed notification to be remembered", a.everything.Load)
	now := time.Now()
	if _, _, err := a.CreateTask(t.Context(), &store.Task{Type: "fail.next.v1", Payload: json.RawMessage(`{}`), Status: status.TaskPending, Priority: 100, RunAt: now}, now); err != nil {
		t.Fatal(err)
	}
	waitFor(t, heard, a.node) // the id alone: a wake-up for everything
}

// TestFailedNotificationIsSentAgainUnasked: after a NOTIFY fails, the
// wake-up for everything goes out within about a second even when the
// node commits nothing more (a hello would not do: it wakes nothing).
// (Found by an audit: it waited for the node's next commit.)
func TestFailedNotificationIsSentAgainUnasked(t *testing.T) {
	a, heard := failOneNotification(t)
	waitFor(t, heard, a.node) // the id alone: a wake-up for everything, unasked
}

// failOneNotification has a node (not listening: it is not alone, and
// notifies) send a notification Postgres refuses (a payload over its
// limit), and returns it with a listener of its schema's channel.
func failOneNotification(t *testing.T) (*Store, <-chan string) {
	t.Helper()
	dsn := pgtest.DSN(t)
	a := openNode(t, dsn)
	if err := a.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	heard := rawListener(t, dsn, a.scope)
	a.readyMu.Lock()
	a.ready = peerReady{tasks: true, types: []string{strings.Repeat("x", 9000)}}
	a.readyMu.Unlock()
	a.pub <- struct{}{}
	return a, heard
}
