package bench

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// rssSink holds the test's allocation where the compiler cannot drop it.
var rssSink []byte

// currentRSS is the process's resident set now, in MB.
func currentRSS(t *testing.T) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	t.Skip("no VmRSS")
	return 0
}

// TestPeakRSSStartsAfterFreedMemory: the peak a workload reports does not
// include the heap a workload before it (another of `all`, an earlier
// --repeat) used and freed: the high-water mark is reset once that memory
// is back with the system, not while the runtime still holds it.
func TestPeakRSSStartsAfterFreedMemory(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory is never given back")
	}
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the high-water mark: %v", err)
	}
	base := currentRSS(t)
	rssSink = make([]byte, 256<<20)
	for i := 0; i < len(rssSink); i += 4096 {
		rssSink[i] = 1
	}
	rssSink = nil // what the workload before held, now garbage
	resetPeakRSS(true)
	if peak := peakRSS(); peak > base+128 {
		t.Fatalf("peak RSS after the reset %.0f MB, %.0f MB before 256 MB were used and freed: the freed heap is counted", peak, base)
	}
}
