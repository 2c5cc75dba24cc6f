# warden — developer entry points. Every target works on a fresh Debian
# machine with Go installed; testenv/ installs and starts database servers.

.PHONY: test test-all fmt demo bench

# Runs every module's tests with -race (servers started by testenv/up.sh).
test:
	./testenv/test.sh

# What CI runs: like test, but a store whose server is missing fails.
test-all:
	WARDEN_TEST_REQUIRE=all ./testenv/test.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

# Two processes racing for one lock on the embedded SQLite default.
demo:
	for i in 1 2; do go run ./cmd/warden lock run nightly-report -- sh -c 'echo "report, fencing token $$WARDEN_FENCING_TOKEN"; sleep 3' & done; wait

# Benchmarks beside the raw database primitives, as a markdown table.
bench:
	cd bench && go run ./cmd/report
