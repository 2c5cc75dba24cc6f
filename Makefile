# warden — developer entry points. Every target works on a fresh Debian
# machine with Go installed; testenv/ installs and starts database servers.

.PHONY: test test-all vet fmt demo

# Runs every module's tests with -race (servers started by testenv/up.sh).
test:
	./testenv/test.sh

# What CI runs: like test, but a store whose server is missing fails.
test-all:
	WARDEN_TEST_REQUIRE=all ./testenv/test.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

# Something real on the embedded SQLite default.
demo:
	go run ./examples/nightly
