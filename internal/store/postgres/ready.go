package postgres

import (
	"errors"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/ferryhq/ferry/internal/store"
)

// peerReady is what a node's commits made ready, as its NOTIFY tells the
// other nodes: tasks (their types, and when they become claimable if all
// are scheduled ahead), the earliest HTTP attempt and the earliest timer.
type peerReady struct {
	tasks bool
	// tasksAt is when the first of the tasks becomes claimable, unless
	// some may be at once (tasksNow; see store.Committed.TasksAt).
	tasksAt  time.Time
	tasksNow bool
	// types are the tasks' types; nil with tasks when there were more
	// than a notification carries (the other nodes then read them).
	types       []string
	typesBytes  int
	http, timer time.Time // zero when none
}

// maxReadyTypes bounds the bytes the type names take in a NOTIFY's
// payload, escaped, with their "y=" and "&": the payload (with the node's
// id, the times and the schema's name, under 200 bytes) must stay under
// Postgres's 8,000.
const maxReadyTypes = 4000

// add merges a commit into r.
func (r *peerReady) add(c store.Committed) {
	if c.Tasks {
		if !r.tasks {
			r.tasks, r.types = true, []string{}
		}
		if c.TasksAt.IsZero() {
			r.tasksNow = true
		} else {
			r.tasksAt = earliest(r.tasksAt, c.TasksAt)
		}
		for _, t := range c.Types {
			if r.types == nil || slices.Contains(r.types, t) {
				continue
			}
			if r.typesBytes += len(url.QueryEscape(t)) + len("&y="); r.typesBytes > maxReadyTypes {
				r.types = nil // too many: the others read them
				continue
			}
			r.types = append(r.types, t)
		}
	}
	r.http = earliest(r.http, c.HTTPDue)
	r.timer = earliest(r.timer, c.TimerDue)
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

func (r peerReady) empty() bool { return !r.tasks && r.http.IsZero() && r.timer.IsZero() }

// encode writes r as URL query parameters: t (tasks), y (each type; none
// with t when they did not fit), a (when the tasks become claimable, if
// none is at once), h and w (the HTTP attempt's and the timer's due time);
// times in Unix nanoseconds. Escaped, the payload has no ':'.
func (r peerReady) encode() string {
	v := url.Values{}
	if r.tasks {
		v.Set("t", "1")
		switch {
		case r.types == nil:
		case len(r.types) == 0:
			v.Set("y", "") // none new (a claim's locked tasks left pending)
		default:
			v["y"] = r.types
		}
		if !r.tasksNow && !r.tasksAt.IsZero() {
			v.Set("a", strconv.FormatInt(r.tasksAt.UnixNano(), 10))
		}
	}
	if !r.http.IsZero() {
		v.Set("h", strconv.FormatInt(r.http.UnixNano(), 10))
	}
	if !r.timer.IsZero() {
		v.Set("w", strconv.FormatInt(r.timer.UnixNano(), 10))
	}
	return v.Encode()
}

// decodeReady reads what encode wrote.
func decodeReady(s string) (peerReady, error) {
	v, err := url.ParseQuery(s)
	if err != nil {
		return peerReady{}, err
	}
	var r peerReady
	if v.Has("t") {
		r.tasks = true
		if ys, ok := v["y"]; ok {
			r.types = []string{}
			for _, y := range ys {
				if y != "" {
					r.types = append(r.types, y)
				}
			}
		}
	}
	at := func(k string) (time.Time, error) {
		if !v.Has(k) {
			return time.Time{}, nil
		}
		n, err := strconv.ParseInt(v.Get(k), 10, 64)
		if err != nil {
			return time.Time{}, err
		}
		return time.Unix(0, n), nil
	}
	if r.http, err = at("h"); err != nil {
		return peerReady{}, err
	}
	if r.timer, err = at("w"); err != nil {
		return peerReady{}, err
	}
	if r.tasksAt, err = at("a"); err != nil {
		return peerReady{}, err
	}
	r.tasksNow = r.tasks && r.tasksAt.IsZero()
	if r.empty() {
		return peerReady{}, errors.New("a notification of nothing")
	}
	return r, nil
}
