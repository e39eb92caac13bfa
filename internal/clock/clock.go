package clock

import "time"

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the runtime uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// Real is the system clock.
type Real struct{}

// Now returns the current wall time at microsecond precision: what the
// stores keep, so a value read back equals the value written.
func (Real) Now() time.Time { return time.Now().Round(0).Truncate(time.Microsecond) }

// NewTimer starts a system timer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }
