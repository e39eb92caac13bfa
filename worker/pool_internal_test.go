package worker

import (
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/testwait"
)

// TestHandlerPoolReusesGoroutines: a task that comes while a goroutine
// waits runs on it (one goroutine for a hundred tasks one after another),
// tasks that come together each get one, closing the pool ends the
// waiting goroutines, and a task run after it still runs.
func TestHandlerPoolReusesGoroutines(t *testing.T) {
	p := newHandlerPool()
	for i := range 100 {
		done := make(chan struct{})
		p.run(func() { close(done) })
		<-done
		testwait.Until(t, 10*time.Second, "the goroutine to wait again", func() bool { return p.waiting() == 1 })
		if n := p.started.Load(); n != 1 {
			t.Fatalf("after %d tasks one after another, %d goroutines started, want 1", i+1, n)
		}
	}

	release := make(chan struct{})
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		p.run(func() { defer wg.Done(); <-release })
	}
	if n, w := p.started.Load(), p.waiting(); n != 5 || w != 0 {
		t.Fatalf("five tasks at once: %d goroutines started, %d waiting; want 5 and 0 (the waiting one took the first)", n, w)
	}
	close(release)
	wg.Wait()
	testwait.Until(t, 10*time.Second, "the five to wait", func() bool { return p.waiting() == 5 })

	hold := make(chan struct{})
	p.run(func() { <-hold }) // still running when the pool closes
	p.close()
	if w := p.waiting(); w != 0 {
		t.Fatalf("%d goroutines wait after close", w)
	}
	testwait.Until(t, 10*time.Second, "the waiting goroutines to end", func() bool { return p.live.Load() == 1 })
	close(hold)
	testwait.Until(t, 10*time.Second, "the last to end after its task", func() bool { return p.live.Load() == 0 })
	ran := make(chan struct{})
	p.run(func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("a task run after close did not run")
	}
	if n := p.started.Load(); n != 5 {
		t.Errorf("%d goroutines started in all, want 5 (none for the task after close: a plain one)", n)
	}
}

// TestHandlerPoolIdleGoroutineEnds: a goroutine that waits longer than
// its idle time for a task ends, and the next task starts another.
func TestHandlerPoolIdleGoroutineEnds(t *testing.T) {
	p := &handlerPool{idleFor: 10 * time.Millisecond}
	defer p.close()
	done := make(chan struct{})
	p.run(func() { close(done) })
	<-done
	testwait.Until(t, 10*time.Second, "the idle goroutine to end", func() bool { return p.live.Load() == 0 && p.waiting() == 0 })
	done = make(chan struct{})
	p.run(func() { close(done) })
	<-done
	if n := p.started.Load(); n != 2 {
		t.Errorf("%d goroutines started, want 2 (the first ended idle)", n)
	}
}
