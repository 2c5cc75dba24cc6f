#!/usr/bin/env bash
# fuzz.sh: the short fuzz run for CI. Each fuzz target runs for FUZZTIME
# (default 2s) in its module's directory, one line per target; the run
# exits non-zero if any target fails (a failing input is written to the
# package's testdata/fuzz/<Target>/, to commit as a regression test).
# Left out, to run as seed tests with their modules' tests only: store/mongo's
# targets (its TestMain owns the shared MongoDB test database) and
# cmd/warden's (its TestMain builds the warden binary in every fuzz worker). Targets whose seed
# corpus can use a test server only use it without -fuzz, so no server is
# needed here. At the end it prints the committed corpus sizes.
set -u
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-2s}
targets=(
	".:.:FuzzValidateKey" ".:.:FuzzParsePattern" ".:.:FuzzOpenURL"
	".:./driver:FuzzPatternRegexp" ".:./cache:FuzzEnvelope" ".:./idempotency:FuzzResultCodec"
	"store/sqlite:.:FuzzSQLitePattern" "store/sqlite:.:FuzzSQLiteURL"
	"store/mysql:.:FuzzMySQLPattern" "store/mysql:.:FuzzMySQLURL"
	"store/postgres:.:FuzzPostgresPattern" "store/postgres:.:FuzzPostgresURL"
	"store/redis:.:FuzzRedisPattern" "store/redis:.:FuzzRedisURL"
	"store/dynamo:.:FuzzDynamoPattern" "store/dynamo:.:FuzzDynamoValue" "store/dynamo:.:FuzzDynamoURL"
)
# --short (what make test runs): the core module's targets only — key
# validation, pattern parsing and translation, URL redaction, the cache
# and idempotency codecs. Every other target's seed corpus still runs as
# ordinary tests in its module's go test; building a fuzzing binary per
# store module would cost make test minutes on a 2-core machine.
if [ "${1:-}" = --short ]; then
	short=()
	for t in "${targets[@]}"; do
		case $t in .:*) short+=("$t") ;; esac
	done
	targets=("${short[@]}")
fi
start=$SECONDS
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
	IFS=: read -r dir pkg name <<<"$t"
	t0=$SECONDS
	if (cd "$dir" && go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "$pkg") >"$log" 2>&1; then
		echo "ok   $dir/${pkg#./} $name ($((SECONDS - t0))s)"
	else
		echo "FAIL $dir/${pkg#./} $name ($((SECONDS - t0))s)"
		grep -v '^fuzz: elapsed' "$log" | tail -20 | sed 's/^/     /'
		failed=1
	fi
done
echo "fuzz: $((SECONDS - start))s"
echo "corpus files per target (testdata/fuzz):"
find . -path '*/testdata/fuzz/*' -type f | sed 's|^\./||; s|/testdata/fuzz/| |; s|/[^/]*$||' | sort | uniq -c | awk '{printf "  %4d %s %s\n", $1, $2, $3}'
exit $failed
