package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

func main() {
	var c config
	flag.StringVar(&c.a, "a", "", "build A: the path of a ferry binary")
	flag.StringVar(&c.b, "b", "", "build B: the path of a ferry binary")
	flag.StringVar(&c.workload, "workload", "jobs", "the workload (ferry bench --workload)")
	flag.StringVar(&c.database, "database", "sqlite", "sqlite or a postgres:// URL")
	flag.IntVar(&c.pairs, "pairs", 5, "pairs of runs")
	var aArgs, bArgs string
	flag.StringVar(&aArgs, "a-args", "", "more ferry bench flags for A only, space-separated (e.g. '--nodes 1')")
	flag.StringVar(&bArgs, "b-args", "", "more ferry bench flags for B only (e.g. '--nodes 2': A and B may then be one binary)")
	flag.Parse()
	c.aExtra, c.bExtra = strings.Fields(aArgs), strings.Fields(bArgs)
	c.extra = flag.Args() // after --: more ferry bench flags, for both
	if err := run(c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ab:", err)
		os.Exit(1)
	}
}

type config struct {
	a, b, workload, database string
	pairs                    int
	extra                    []string // flags for both
	aExtra, bExtra           []string // flags for A, for B
}

// result is one run of one build.
type result struct {
	build     string
	units     float64 // units_per_s
	latency   string  // the workload's main latency figure, as "name value"
	rss       float64 // peak_rss_mb
	busyPerUs float64 // machine busy CPU µs per completed unit; 0 if unknown
}

func run(c config, out io.Writer) error {
	if c.a == "" || c.b == "" {
		return errors.New("-a and -b name the two ferry binaries")
	}
	if c.pairs < 1 {
		return errors.New("-pairs must be at least 1")
	}
	// One workload, run once: the CPU per unit divides the machine's busy
	// time over the run by the units of the line it reads.
	if c.workload == "all" || c.workload == "scale" {
		return fmt.Errorf("-workload %s: compare one workload at a time", c.workload)
	}
	for _, a := range slices.Concat(c.extra, c.aExtra, c.bExtra) {
		if a == "--repeat" || strings.HasPrefix(a, "--repeat=") || a == "-repeat" || strings.HasPrefix(a, "-repeat=") {
			return errors.New("--repeat: the pairs are the repeats")
		}
	}
	var as, bs []result
	wins := 0
	for i := range c.pairs {
		// By position, not by path: A and B may be the same binary (a
		// measure of the noise).
		order := []bool{false, true} // is B
		if i%2 == 1 {
			order = []bool{true, false}
		}
		var ra, rb result
		for _, isB := range order {
			bin, extra := c.a, c.aExtra
			if isB {
				bin, extra = c.b, c.bExtra
			}
			r, err := once(c, bin, extra)
			if err != nil {
				return err
			}
			if isB {
				r.build, rb = "B", r
			} else {
				r.build, ra = "A", r
			}
			fmt.Fprintf(out, "%s %s\n", r.build, r)
		}
		as, bs = append(as, ra), append(bs, rb)
		if rb.units > ra.units {
			wins++
		}
	}
	fmt.Fprint(out, summary(as, bs, wins))
	return nil
}

func (r result) String() string {
	s := fmt.Sprintf("%.0f/s  %s  rss %.0f MB", r.units, r.latency, r.rss)
	if r.busyPerUs > 0 {
		s += fmt.Sprintf("  machine %.1f µs/unit", r.busyPerUs)
	}
	return s
}

// summary is the medians of A's and B's runs, B against A, and how many
// pairs B won by units a second.
func summary(as, bs []result, wins int) string {
	units := func(rs []result) []float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = r.units
		}
		return v
	}
	busy := func(rs []result) []float64 {
		var v []float64
		for _, r := range rs {
			if r.busyPerUs > 0 {
				v = append(v, r.busyPerUs)
			}
		}
		return v
	}
	ma, mb := median(units(as)), median(units(bs))
	s := fmt.Sprintf("median units/s: A %.0f, B %.0f (B %+.1f %%); B ahead in %d of %d pairs\n", ma, mb, pct(mb, ma), wins, len(as))
	if ba, bb := busy(as), busy(bs); len(ba) > 0 && len(bb) > 0 {
		s += fmt.Sprintf("median machine CPU per unit: A %.1f µs, B %.1f µs (B %+.1f %%)\n", median(ba), median(bb), pct(median(bb), median(ba)))
	}
	return s
}

func pct(b, a float64) float64 {
	if a == 0 {
		return 0
	}
	return (b/a - 1) * 100
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// once runs one ferry bench of bin and reads its last JSON line, with
// the machine's busy CPU over the run.
func once(c config, bin string, extra []string) (result, error) {
	args := slices.Concat([]string{"bench", "--workload", c.workload, "--database", c.database, "--json"}, c.extra, extra)
	before, cpuErr := busyTicks()
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return result{}, fmt.Errorf("%s %s: %w\n%s", bin, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	after, cpuErr2 := busyTicks()
	r, completed, err := parse(stdout.Bytes())
	if err != nil {
		return result{}, fmt.Errorf("%s: %w", bin, err)
	}
	if cpuErr == nil && cpuErr2 == nil {
		r.busyPerUs = perUnit(before, after, completed)
	}
	return r, nil
}

// perUnit is the busy time between two /proc/stat readings, in µs, per
// unit completed (0 when none was).
func perUnit(before, after, completed int64) float64 {
	if completed <= 0 {
		return 0
	}
	return float64(after-before) * tickUs / float64(completed)
}

// parse reads the last JSON line ferry bench printed.
func parse(out []byte) (result, int64, error) {
	var last []byte
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line := bytes.TrimSpace(sc.Bytes()); len(line) > 0 && line[0] == '{' {
			last = slices.Clone(line)
		}
	}
	if last == nil {
		return result{}, 0, errors.New("no JSON line in its output")
	}
	var d struct {
		Completed int64   `json:"completed"`
		Units     float64 `json:"units_per_s"`
		RSS       float64 `json:"peak_rss_mb"`
		Handoff   *pcts   `json:"handoff_ms"`
		Lateness  *pcts   `json:"lateness_ms"`
		Latency   *pcts   `json:"latency_ms"`
	}
	if err := json.Unmarshal(last, &d); err != nil {
		return result{}, 0, fmt.Errorf("its JSON line: %w", err)
	}
	r := result{units: d.Units, rss: d.RSS}
	switch {
	case d.Handoff != nil:
		r.latency = fmt.Sprintf("hand-off p50 %.2f ms", d.Handoff.P50)
	case d.Lateness != nil:
		r.latency = fmt.Sprintf("lateness p99 %.2f ms", d.Lateness.P99)
	case d.Latency != nil:
		r.latency = fmt.Sprintf("latency p50 %.2f ms", d.Latency.P50)
	}
	return r, d.Completed, nil
}

type pcts struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

// tickUs is one clock tick of /proc/stat in µs (USER_HZ is 100 on Linux).
const tickUs = 10_000

// busyTicks is the machine's busy time so far in clock ticks: user, nice,
// system, irq and softirq over all CPUs (not idle, iowait or steal).
func busyTicks() (int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return parseBusy(b)
}

func parseBusy(stat []byte) (int64, error) {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, errors.New("/proc/stat: no cpu line")
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system irq softirq
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		busy += v
	}
	return busy, nil
}
