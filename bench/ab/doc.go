// Command ab compares two builds of Ferry on one workload by alternating
// runs: `ferry bench` of build A, then of build B, then B and A (ABBA, so
// that a host whose speed drifts favours neither), for the pairs asked.
// It prints each run's units a second, its main latency figure, its peak
// RSS and the machine's busy CPU per unit (from /proc/stat, both processes
// and the database together), then the medians, B against A, and the
// pairs B won. The host's speed moves by up to three times between
// phases; only runs made side by side compare.
//
//	go run ./bench/ab -a /tmp/ferry-old -b bin/ferry -workload jobs -database sqlite -pairs 5
//	go run ./bench/ab -a /tmp/ferry-old -b bin/ferry -workload jobs -- --transport http
//
// Flags after -- go to `ferry bench` of both builds (make bench-ab's
// ARGS); --repeat is refused, as the pairs are the repeats.
//
// It runs the binaries it is given and imports nothing of Ferry's.
package main
