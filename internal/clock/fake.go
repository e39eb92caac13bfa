package clock

import (
	"sync"
	"time"
)

// Fake is a manually advanced clock for tests: time stands still until
// Advance, which fires every timer that has come due.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

// NewFake starts a fake clock at t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves time forward and fires due timers.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	now := f.now
	keep := f.timers[:0]
	var fire []*fakeTimer
	for _, t := range f.timers {
		if !t.at.After(now) {
			fire = append(fire, t)
		} else {
			keep = append(keep, t)
		}
	}
	f.timers = keep
	f.mu.Unlock()
	for _, t := range fire {
		select {
		case t.c <- now:
		default:
		}
	}
}

// NewTimer makes a timer that fires when the fake time reaches now+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{f: f, at: f.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- f.now
		return t
	}
	f.timers = append(f.timers, t)
	return t
}

// HasTimer says whether a timer is set to fire at exactly at: a test
// that must not move the clock before code under test has set its timer
// (or it would set it after the move, from the new now) waits for this.
func (f *Fake) HasTimer(at time.Time) bool {
	return f.anyTimer(func(t time.Time) bool { return t.Equal(at) })
}

// HasTimerBy says whether a timer is set to fire at or before at (see
// HasTimer), for a test that knows by when the code under test must wake
// but not the exact time it plans for.
func (f *Fake) HasTimerBy(at time.Time) bool {
	return f.anyTimer(func(t time.Time) bool { return !t.After(at) })
}

// anyTimer says whether a timer set to fire at a time match accepts is
// waiting.
func (f *Fake) anyTimer(match func(time.Time) bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range f.timers {
		if match(t.at) {
			return true
		}
	}
	return false
}

type fakeTimer struct {
	f  *Fake
	at time.Time
	c  chan time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	for i, x := range t.f.timers {
		if x == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			return true
		}
	}
	return false
}
