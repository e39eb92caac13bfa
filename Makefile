# Ferry: `make test` is the one command that runs every test (CI calls it).
GO ?= go
PKGS := ./...

.PHONY: test vet fmt build run bench bench-peers bench-dbos bench-ab fuzz

# FERRY_RUNCACHE_CHECK: every run SQLite's writer takes from its cache is
# compared with the tables (a difference fails the write).
test: fmt vet
	FERRY_RUNCACHE_CHECK=1 $(GO) test -race -count=1 -timeout 12m $(PKGS)

vet:
	$(GO) vet $(PKGS)

# gofmt must report nothing.
fmt:
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

build:
	$(GO) build -o bin/ferry ./cmd/ferry

run:
	$(GO) run ./cmd/ferry server

# Short fuzzing sessions for the parsers (not part of `make test`).
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParseCondition -fuzztime=30s ./internal/expr/
	$(GO) test -run='^$$' -fuzz=FuzzParseTemplate -fuzztime=30s ./internal/expr/
	$(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=30s ./internal/spec/

# Every workload on SQLite and on the local Postgres; JSON lines in
# bench/results.jsonl. Timing never runs in `make test`.
BENCH_PG ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
bench:
	$(GO) build -o bin/ferry ./cmd/ferry
	./bin/ferry bench --workload all --repeat 3 --database sqlite --json > bench/results.jsonl
	./bin/ferry bench --workload all --repeat 3 --database '$(BENCH_PG)' --json >> bench/results.jsonl
	cat bench/results.jsonl

# River, the peer behind the jobs target, measured on this machine the way
# `ferry bench --workload jobs` measures Ferry (bench/peers/river, a module
# of its own so Ferry's go.mod never takes River). Run it beside make bench:
# the host's speed moves, ratios measured together do not.
bench-peers:
	cd bench/peers/river && $(GO) run . --repeat 3 --database sqlite
	cd bench/peers/river && $(GO) run . --repeat 3 --database '$(BENCH_PG)'

# DBOS Transact Go, the peer behind the chain10, fanout and sleep targets,
# measured the same way (bench/peers/dbos, a module of its own) on SQLite
# and Postgres: all four workloads, or W=chain10 and so on.
bench-dbos:
	cd bench/peers/dbos && $(GO) run . --workload '$(or $(W),all)' --database sqlite
	cd bench/peers/dbos && $(GO) run . --workload '$(or $(W),all)' --database '$(BENCH_PG)'

# Two builds side by side: ABBA runs of one workload (bench/ab), with the
# medians, the pairs B won and the machine's CPU per unit. A is a ferry
# binary built from the code to compare against; B defaults to this tree's.
# ARGS are more ferry bench flags for both builds, A_ARGS and B_ARGS for
# one side only (A may then be this tree's build too).
#   make bench-ab A=/tmp/ferry-before W=chain10 DB=postgres PAIRS=5
#   make bench-ab A=/tmp/ferry-before W=jobs ARGS='--transport http'
#   make bench-ab A=bin/ferry W=chain10 DB=postgres B_ARGS='--nodes 2'
bench-ab:
	$(GO) build -o bin/ferry ./cmd/ferry
	$(GO) run ./bench/ab -a '$(A)' -b '$(or $(B),bin/ferry)' -workload '$(or $(W),jobs)' \
		-database '$(if $(filter postgres,$(DB)),$(BENCH_PG),$(or $(DB),sqlite))' -pairs '$(or $(PAIRS),5)' \
		-a-args '$(A_ARGS)' -b-args '$(B_ARGS)' -- $(ARGS)
