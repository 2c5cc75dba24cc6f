#!/usr/bin/env bash
# warden's benchmarks beside the raw primitives and the peer libraries, in
# one run (docs/benchmarks.md): starts the servers (testenv/up.sh), runs
# every case -count times (3 by default) and records the run in
# docs/benchmarks.md (the "Latest full run" section) and docs/benchmarks.svg.
#
#   testenv/bench.sh                    the full run, written into docs/
#   testenv/bench.sh -run redis         some cases only (still written)
#   testenv/bench.sh -count 1 -write '' print only
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v go >/dev/null || { echo "bench.sh: Go 1.26 or newer is required (https://go.dev/dl)" >&2; exit 1; }
eval "$(testenv/up.sh)"
cd bench
exec go run ./cmd/report -write ../docs "$@"
