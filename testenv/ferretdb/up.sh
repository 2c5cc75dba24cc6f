#!/usr/bin/env bash
# Builds and starts the MongoDB-compatible test server (FerretDB embedded in
# this folder's module, SQLite handler) on a free loopback port, and prints
#
#   export WARDEN_TEST_MONGODB_URL='mongodb://127.0.0.1:PORT/'
#
# on stdout (progress on stderr). Called by testenv/up.sh. A server started
# earlier is reused while it answers. If WARDEN_TEST_MONGODB_URL is already
# set (a real MongoDB, say), it is printed back and nothing is started.
set -euo pipefail
if [ -n "${WARDEN_TEST_MONGODB_URL:-}" ]; then
  echo "export WARDEN_TEST_MONGODB_URL='$WARDEN_TEST_MONGODB_URL'"
  exit 0
fi
here=$(cd "$(dirname "$0")" && pwd)
run="$here/../.run"
mkdir -p "$run"
run=$(cd "$run" && pwd)
bin="$run/ferretdb"
log() { printf 'testenv/ferretdb: %s\n' "$*" >&2; }

command -v go >/dev/null || { log "Go is required to build the test server"; exit 1; }
log "building (the first build takes a minute or two)"
(cd "$here" && GOWORK=off go build -buildvcs=false -o "$bin" .) >&2

print_url() { echo "export WARDEN_TEST_MONGODB_URL='mongodb://127.0.0.1:$1/'"; }

# Reuse a server started earlier if it still answers.
if [ -f "$run/ferretdb.pid" ] && [ -f "$run/ferretdb.port" ]; then
  pid=$(cat "$run/ferretdb.pid"); port=$(cat "$run/ferretdb.port")
  if kill -0 "$pid" 2>/dev/null && "$bin" -ping "127.0.0.1:$port" 2>/dev/null; then
    log "reusing the server on port $port (pid $pid)"
    print_url "$port"
    exit 0
  fi
fi

mkdir -p "$run/ferretdb-state"
rm -f "$run/ferretdb.port"
log "starting on a free loopback port (log: $run/ferretdb.log)"
# The server picks a free port itself and writes it to ferretdb.port.
setsid nohup "$bin" -listen 127.0.0.1:0 -port-file "$run/ferretdb.port" -state "$run/ferretdb-state" \
  </dev/null >>"$run/ferretdb.log" 2>&1 &
pid=$!
echo "$pid" >"$run/ferretdb.pid"
for _ in $(seq 1 120); do
  port=$(cat "$run/ferretdb.port" 2>/dev/null || true)
  if [ -n "$port" ] && "$bin" -ping "127.0.0.1:$port" 2>/dev/null; then
    log "started on 127.0.0.1:$port (pid $pid)"
    print_url "$port"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then break; fi
  sleep 0.5
done
log "the server did not answer within 60 s; the end of its log:"
tail -n 30 "$run/ferretdb.log" >&2 || true
exit 1
