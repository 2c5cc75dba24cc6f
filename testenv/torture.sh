#!/usr/bin/env bash
# warden's multi-process torture run (docs/design.md, "Torture run"): starts
# what the stores need (testenv/up.sh), then runs testenv/torture for every
# store at once — worker processes under network and process faults, a
# fenced resource, and a checker that prints one summary line per store.
#
#   testenv/torture.sh            the short form: 60 s of faults per store, all concurrently
#   testenv/torture.sh --long     10 minutes per store
#   testenv/torture.sh -store redis,sqlite -duration 30s   (flags go to the torture)
#
# With WARDEN_TEST_REQUIRE=all a store whose server is missing fails
# instead of being skipped. Exits non-zero if any store failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v go >/dev/null || { echo "torture.sh: Go 1.26 or newer is required (https://go.dev/dl)" >&2; exit 1; }

eval "$(testenv/up.sh)"

args=()
for a in "$@"; do
  case $a in
    --long) args+=(-long) ;;
    *) args+=("$a") ;;
  esac
done
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd testenv/torture && GOWORK=off go build -o "$bin/torture" .)
"$bin/torture" "${args[@]}"
