package main

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fakeFerry writes an executable that stands for a ferry binary: it
// appends its name to log and prints a bench JSON line with units a
// second.
func fakeFerry(t *testing.T, dir, name, log string, units int) string {
	t.Helper()
	p := filepath.Join(dir, name)
	script := "#!/bin/sh\necho " + name + " >> " + log + "\n" +
		`echo 'starting'` + "\n" +
		`echo '{"workload":"chain10","completed":1000,"units_per_s":` + strconv.Itoa(units) + `,"peak_rss_mb":50.5,"handoff_ms":{"p50":1.5,"p95":3,"p99":6,"max":9},"latency_ms":{"p50":600,"p95":900,"p99":950,"max":990}}'` + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRunAlternatesAndSummarises: the pairs run ABBA, each run's line
// shows its figures, and the summary gives the medians and the pairs B
// won.
func TestRunAlternatesAndSummarises(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "order")
	a := fakeFerry(t, dir, "old", log, 800)
	b := fakeFerry(t, dir, "new", log, 900)
	var out strings.Builder
	if err := run(config{a: a, b: b, workload: "chain10", database: "sqlite", pairs: 3}, &out); err != nil {
		t.Fatal(err)
	}
	order, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(string(order)), []string{"old", "new", "new", "old", "old", "new"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("run order %v, want %v (ABBA)", got, want)
	}
	for _, want := range []string{
		"A 800/s  hand-off p50 1.50 ms  rss 50 MB",
		"B 900/s  hand-off p50 1.50 ms  rss 50 MB",
		"median units/s: A 800, B 900 (B +12.5 %); B ahead in 3 of 3 pairs",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	for _, c := range []config{
		{b: "x", pairs: 1},
		{a: "x", pairs: 1},
		{a: "x", b: "y"},
		{a: "x", b: "y", pairs: 1, workload: "all"},
		{a: "x", b: "y", pairs: 1, workload: "scale"},
		{a: "x", b: "y", pairs: 1, workload: "jobs", extra: []string{"--repeat", "3"}},
		{a: "x", b: "y", pairs: 1, workload: "jobs", extra: []string{"--repeat=3"}},
	} {
		if err := run(c, &strings.Builder{}); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestRunReportsAFailingBuild(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho boom >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := run(config{a: bad, b: bad, workload: "jobs", database: "sqlite", pairs: 1}, &strings.Builder{})
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("err = %v, want the build's stderr", err)
	}
}

func TestParse(t *testing.T) {
	for _, c := range []struct {
		out, latency string
		units        float64
		completed    int64
	}{
		{`{"completed":20000,"units_per_s":15000.5,"latency_ms":{"p50":700,"p99":1000}}`, "latency p50 700.00 ms", 15000.5, 20000},
		{"noise\n" + `{"completed":10000,"units_per_s":4600,"latency_ms":{"p50":1500},"lateness_ms":{"p50":9,"p99":41.35}}`, "lateness p99 41.35 ms", 4600, 10000},
		{`{"completed":1,"units_per_s":1}` + "\n" + `{"completed":1000,"units_per_s":832,"handoff_ms":{"p50":1.51},"latency_ms":{"p50":600}}`, "hand-off p50 1.51 ms", 832, 1000},
	} {
		r, n, err := parse([]byte(c.out))
		if err != nil {
			t.Fatal(err)
		}
		if r.units != c.units || r.latency != c.latency || n != c.completed {
			t.Errorf("parse(%q) = %+v, %d; want %v, %q, %d", c.out, r, n, c.units, c.latency, c.completed)
		}
	}
	if _, _, err := parse([]byte("no json here\n")); err == nil {
		t.Error("output without a JSON line accepted")
	}
}

func TestParseBusy(t *testing.T) {
	got, err := parseBusy([]byte("cpu  100 5 30 9000 7 2 3 11 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"))
	if err != nil || got != 100+5+30+2+3 {
		t.Errorf("parseBusy = %d, %v; want 140 (user nice system irq softirq)", got, err)
	}
	if _, err := parseBusy([]byte("intr 1 2 3\n")); err == nil {
		t.Error("a stat without a cpu line accepted")
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestRunSameBinaryTwice: A and B may be one binary (the noise between
// runs of the same build); each run is labelled by its place in the pair.
func TestRunSameBinaryTwice(t *testing.T) {
	dir := t.TempDir()
	same := fakeFerry(t, dir, "same", filepath.Join(dir, "order"), 800)
	var out strings.Builder
	if err := run(config{a: same, b: same, workload: "chain10", database: "sqlite", pairs: 2}, &out); err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	for _, line := range strings.Split(out.String(), "\n") {
		if b, _, ok := strings.Cut(line, " 800/s"); ok {
			runs[b]++
		}
	}
	if runs["A"] != 2 || runs["B"] != 2 {
		t.Errorf("runs by label %v, want two of A and two of B:\n%s", runs, out.String())
	}
	if want := "median units/s: A 800, B 800 (B +0.0 %); B ahead in 0 of 2 pairs"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}

func TestPerUnit(t *testing.T) {
	// 250 ticks of 10 ms busy over 1,000 units: 2,500 µs each.
	if got := perUnit(1000, 1250, 1000); got != 2500 {
		t.Errorf("perUnit = %v, want 2500", got)
	}
	if got := perUnit(1000, 1250, 0); got != 0 {
		t.Errorf("perUnit with nothing completed = %v, want 0", got)
	}
}

// TestRunPerSideArgs: the flags for both go to both builds, then each
// side's own; a --repeat among a side's flags is refused too.
func TestRunPerSideArgs(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "args")
	p := filepath.Join(dir, "ferry")
	script := "#!/bin/sh\necho \"$*\" >> " + log + "\n" +
		`echo '{"workload":"chain10","completed":1000,"units_per_s":800,"peak_rss_mb":50,"handoff_ms":{"p50":1.5,"p95":3,"p99":6,"max":9}}'` + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	c := config{a: p, b: p, workload: "chain10", database: "sqlite", pairs: 1, extra: []string{"--workers", "8"}, aExtra: []string{"--nodes", "1"}, bExtra: []string{"--nodes", "2"}}
	if err := run(c, io.Discard); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	want := "bench --workload chain10 --database sqlite --json --workers 8 --nodes 1\n" +
		"bench --workload chain10 --database sqlite --json --workers 8 --nodes 2\n"
	if string(got) != want {
		t.Errorf("the builds ran with\n%s\nwant\n%s", got, want)
	}
	c.bExtra = []string{"--repeat", "3"}
	if err := run(c, io.Discard); err == nil || !strings.Contains(err.Error(), "--repeat") {
		t.Errorf("--repeat for B: %v", err)
	}
}
