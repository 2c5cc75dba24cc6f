#!/usr/bin/env bash
# Installs the go-go-scope Node adapters pinned in package-lock.json (npm ci)
# when node_modules is missing, incomplete (npm writes
# node_modules/.package-lock.json last) or older than the lock file. The
# mixed-fleet tests (store/mysql, store/mongo) run it before driving the
# adapters; a lock on /tmp/warden-node.lock keeps two test binaries from
# installing at once. Needs node and npm on PATH.
set -euo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
cd "$dir"
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "testenv/node: node and npm are required (apt-get install nodejs npm)" >&2; exit 1; }
install() {
  if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    # The adapters declare node >= 24 but run on older releases; npm only
    # warns about it. go-go-scope itself is replaced by go-go-scope-stub
    # (package.json "overrides"): the registry does not serve it and the
    # adapters import nothing from it.
    npm ci --omit=optional --no-audit --no-fund --loglevel=error >&2
    touch node_modules/.package-lock.json
  fi
}
if command -v flock >/dev/null; then
  exec 9>/tmp/warden-node.lock
  flock 9
fi
install
