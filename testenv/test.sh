#!/usr/bin/env bash
# The project's test command (README: `make test`; CI: .ci/run).
# Starts what the stores need (testenv/up.sh), then checks formatting, vets
# and runs every module's tests with -race. With WARDEN_TEST_REQUIRE=all a
# store whose server is missing fails instead of skipping.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v go >/dev/null || { echo "test.sh: Go 1.26 or newer is required (https://go.dev/dl)" >&2; exit 1; }

# -trimpath keeps file-system paths out of what is compiled, and so out of
# the build cache's keys: a fresh clone elsewhere on a machine that ran the
# tests before reuses the compiled packages instead of building them all
# again (measured: ~200 CPU-seconds of a run from a new clone path).
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath"

eval "$(testenv/up.sh)"

# testenv's own modules are tools (the FerretDB server, the torture run);
# the torture's checker has tests of its own.
modules="$(find . -name go.mod -not -path './testenv/*' -not -path '*/node_modules/*' -exec dirname {} \; | sort) ./testenv/torture"

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

# run_module M: vets and tests module M, appending "M SECONDS STATUS" to
# $times.
times=$(mktemp)
logs=$(mktemp -d)
trap 'rm -rf "$times" "$logs"' EXIT
# A name starting with @ is a script of testenv/ run in a lane like a
# module: @fuzz is testenv/fuzz.sh --short, the short fuzz run.
run_module() {
  local m=$1 start rc=0
  start=$(date +%s)
  case $m in
    @fuzz) testenv/fuzz.sh --short || rc=1 ;;
    @*) testenv/${m#@}.sh || rc=1 ;;
    *) (cd "$m" && go vet ./... && go test -race -count=1 -timeout 20m ${WARDEN_GOTEST_FLAGS:-} ./...) || rc=1 ;;
  esac
  echo "$m $(( $(date +%s) - start )) $rc" >>"$times"
  return $rc
}

# The modules run in lanes (WARDEN_TEST_LANES, default 2), each lane one
# module after another, so the suites paced by their servers (FerretDB,
# dynalite, fsyncs) overlap with the CPU-bound ones on a 2-core machine.
# A module's output is shown whole when it ends. Modules are dealt to lanes
# longest first by the wall time they took in a two-lane run (cost below,
# seconds; a new module counts 30) — only the balance depends on these.
cost() {
  case $1 in
    ./store/mongo) echo 860 ;; ./store/postgres) echo 530 ;; ./store/mysql) echo 520 ;;
    ./store/sqlite) echo 400 ;; ./store/dynamo) echo 290 ;; ./cmd/warden) echo 200 ;;
    ./store/redis) echo 145 ;; .) echo 80 ;; @fuzz) echo 40 ;; ./bench) echo 40 ;; *) echo 30 ;;
  esac
}
lanes=${WARDEN_TEST_LANES:-2}
case $lanes in '' | *[!0-9]* | 0) echo "test.sh: WARDEN_TEST_LANES must be a positive number" >&2; exit 1 ;; esac
declare -a lane_mods lane_load
for ((i = 0; i < lanes; i++)); do lane_mods[i]=""; lane_load[i]=0; done
for m in $(for m in $modules @fuzz; do echo "$(cost "$m") $m"; done | sort -rn | awk '{print $2}'); do
  best=0
  for ((i = 1; i < lanes; i++)); do
    [ "${lane_load[i]}" -lt "${lane_load[best]}" ] && best=$i
  done
  lane_mods[best]="${lane_mods[best]} $m"
  lane_load[best]=$(( lane_load[best] + $(cost "$m") ))
done
print_log() { # print_log M: shows module M's output once it has ended
  echo "=== module $1"
  cat "$logs/$(echo "$1" | tr / _).log"
}
pids=()
for ((i = 0; i < lanes; i++)); do
  (
    for m in ${lane_mods[i]}; do
      run_module "$m" >"$logs/$(echo "$m" | tr / _).log" 2>&1 || true
      print_log "$m"
    done
  ) &
  pids+=($!)
done
# The README's install lines and example, from a module outside this one.
(
  start=$(date +%s); rc=0
  testenv/outside.sh >"$logs/outside.log" 2>&1 || rc=1
  echo "outside-module $(( $(date +%s) - start )) $rc" >>"$times"
  echo "=== outside module (README install and example)"; cat "$logs/outside.log"
) &
pids+=($!)
for p in "${pids[@]}"; do wait "$p" || true; done

# The torture run's short form (testenv/torture.sh), alone: its check that
# no lock stays stuck past its TTL plus a margin should not compete with
# the suites for the two cores.
echo "=== torture (short form: every store at once)"
start=$(date +%s); rc=0
testenv/torture.sh || rc=1
echo "@torture $(( $(date +%s) - start )) $rc" >>"$times"

echo "=== per-module wall time (s)"
sort "$times" | while read -r m secs rc; do
  [ "$rc" = 0 ] && st=ok || st=FAIL
  printf '%-16s %5s  %s\n' "$m" "$secs" "$st"
done
passed=$(awk '$3==0' "$times" | wc -l)
failed=$(awk '$3!=0' "$times" | wc -l)
echo "modules: $passed passed, $failed failed"
[ "$failed" = 0 ]
