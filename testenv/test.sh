#!/usr/bin/env bash
# The project's test command (README: `make test`; CI: .ci/run).
# Starts what the stores need (testenv/up.sh), then checks formatting, vets
# and runs every module's tests with -race. With WARDEN_TEST_REQUIRE=all a
# store whose server is missing fails instead of skipping.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v go >/dev/null || { echo "test.sh: Go 1.25 or newer is required (https://go.dev/dl)" >&2; exit 1; }

eval "$(testenv/up.sh)"

modules=$(find . -name go.mod -not -path './testenv/*' -not -path '*/node_modules/*' -exec dirname {} \; | sort)

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

status=0
for m in $modules; do
  echo "=== module $m"
  (cd "$m" && go vet ./... && go test -race -count=1 -timeout 20m ${WARDEN_GOTEST_FLAGS:-} ./...) || status=1
done
exit $status
