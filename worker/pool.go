package worker

import (
	"sync"
	"sync/atomic"
	"time"
)

// handlerPool runs a Run's tasks on goroutines that, once a task is done,
// wait for the next one instead of ending. A goroutine started for each
// task began with a small stack and grew it on every task's way through
// the handler path (span, heartbeats, the report): runtime.newstack was
// 3–6 % of the process's CPU in the jobs benchmark. At most as many wait
// as have run at once (Config.Concurrency); the one that waited least is
// taken first (its stack and cache are warm), one idle for poolIdle ends,
// and all end with the Run (close).
type handlerPool struct {
	mu      sync.Mutex
	idle    []chan func() // the waiting goroutines' own channels, each of room 1
	stopped bool
	idleFor time.Duration // how long a goroutine waits for its next task
	// started and live count the goroutines begun and not yet ended,
	// for tests.
	started, live atomic.Int64
}

// poolIdle is how long a goroutine waits for its next task.
const poolIdle = time.Minute

func newHandlerPool() *handlerPool { return &handlerPool{idleFor: poolIdle} }

// run runs fn on a waiting goroutine, or a new one if none waits.
func (p *handlerPool) run(fn func()) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 && !p.stopped {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		c <- fn // never blocks: room 1, and only run sends, once a wait
		return
	}
	stopped := p.stopped
	p.mu.Unlock()
	if stopped { // a task started as the Run ends (startLater)
		go fn()
		return
	}
	p.started.Add(1)
	go p.loop(fn)
}

func (p *handlerPool) loop(fn func()) {
	p.live.Add(1)
	defer p.live.Add(-1)
	c := make(chan func(), 1)
	idle := time.NewTimer(p.idleFor)
	defer idle.Stop()
	for ok := true; ok; {
		fn()
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, c)
		p.mu.Unlock()
		idle.Reset(p.idleFor)
		select {
		case fn, ok = <-c:
		case <-idle.C:
			if p.remove(c) {
				return
			}
			fn, ok = <-c // run took it meanwhile: its task is on the way
		}
	}
}

// remove takes c off the waiting list, and says whether it was there.
func (p *handlerPool) remove(c chan func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.idle {
		if x == c {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			return true
		}
	}
	return false
}

// waiting is how many goroutines wait for a task.
func (p *handlerPool) waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// close ends the waiting goroutines, and those still running a task once
// it is done.
func (p *handlerPool) close() {
	p.mu.Lock()
	p.stopped = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		close(c)
	}
}
