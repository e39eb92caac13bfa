//go:build race

package bench

// raceEnabled: the race detector's shadow of the heap stays resident
// after the heap is returned, so RSS tests cannot run under it.
const raceEnabled = true
