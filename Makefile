# warden — developer entry points. Every target works on a fresh Debian
# machine with Go installed; testenv/ installs and starts database servers.

.PHONY: test test-all fmt demo bench torture torture-long fuzz

# Runs every module's tests with -race (servers started by testenv/up.sh).
test:
	./testenv/test.sh

# What CI runs: like test, but a store whose server is missing fails.
test-all:
	WARDEN_TEST_REQUIRE=all ./testenv/test.sh

# The multi-process torture run: worker processes under network faults,
# SIGKILL and SIGSTOP, a fenced resource and a checker; one line per store.
# `make test` runs this short form (60 s per store, all at once).
torture:
	./testenv/torture.sh

# The same, 10 minutes per store.
torture-long:
	./testenv/torture.sh --long

# Every fuzz target briefly (FUZZTIME=30s for longer); `make test` runs the
# core module's targets (testenv/fuzz.sh --short).
fuzz:
	./testenv/fuzz.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

# Two processes racing for one lock on the embedded SQLite default.
demo:
	for i in 1 2; do go run ./cmd/warden lock run nightly-report -- sh -c 'echo "report, fencing token $$WARDEN_FENCING_TOKEN"; sleep 3' & done; wait

# Benchmarks beside the raw primitives and the peer libraries, in one run:
# prints the tables and records them in docs/benchmarks.md and
# docs/benchmarks.svg (testenv/bench.sh; takes a while, best on a quiet machine).
bench:
	./testenv/bench.sh
