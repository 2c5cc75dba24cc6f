#!/usr/bin/env bash
# Starts dynalite (a DynamoDB-compatible server, from the npm registry) for
# the tests of store/dynamo and prints one line for the caller to eval:
#
#   export WARDEN_TEST_DYNAMODB_ENDPOINT='http://127.0.0.1:PORT'
#
# If WARDEN_TEST_DYNAMODB_ENDPOINT is already set (DynamoDB Local, a real
# endpoint), it is printed back and nothing is started. Otherwise Node.js and
# npm are installed with apt-get if missing (root only), `npm ci` installs
# the locked packages when node_modules is missing or older than the lock
# file, and a server started earlier by this script (pid and port in
# testenv/.run/) is reused if it still answers; else dynalite starts
# detached (server.js) on a free loopback port, in memory, logging to
# testenv/.run/dynalite.log. Progress goes to stderr, only the export line
# to stdout.
set -euo pipefail

if [ -n "${WARDEN_TEST_DYNAMODB_ENDPOINT:-}" ]; then
  echo "export WARDEN_TEST_DYNAMODB_ENDPOINT='$WARDEN_TEST_DYNAMODB_ENDPOINT'"
  exit 0
fi

here=$(cd "$(dirname "$0")" && pwd)
run="$here/../.run"
mkdir -p "$run"
run=$(cd "$run" && pwd)
pidfile="$run/dynalite.pid"
portfile="$run/dynalite.port"
logfile="$run/dynalite.log"
log() { printf 'testenv/dynalite: %s\n' "$*" >&2; }

# answers PORT: dynalite replies to an unsigned request with a DynamoDB
# error document, which is enough to know it is up.
answers() {
  local body
  body=$(curl -s -m 2 -X POST -H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
    -H 'Content-Type: application/x-amz-json-1.0' -d '{}' "http://127.0.0.1:$1/" 2>/dev/null) || return 1
  case "$body" in *'__type'*|*'TableNames'*) return 0 ;; esac
  return 1
}

if ! command -v curl >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    log "installing curl"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >&2
  else
    log "curl is missing and installing it needs root"; exit 1
  fi
fi

# Reuse a server this script started earlier.
if [ -f "$pidfile" ] && [ -f "$portfile" ]; then
  pid=$(cat "$pidfile"); port=$(cat "$portfile")
  if [ -n "$pid" ] && [ -n "$port" ] && kill -0 "$pid" 2>/dev/null && answers "$port"; then
    log "reusing dynalite (pid $pid) on port $port"
    echo "export WARDEN_TEST_DYNAMODB_ENDPOINT='http://127.0.0.1:$port'"
    exit 0
  fi
fi

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [ "$(id -u)" != 0 ]; then log "Node.js/npm are missing and installing them needs root"; exit 1; fi
  log "installing Node.js and npm with apt-get"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >&2
fi

# npm ci when node_modules is missing or older than the lock file (npm
# writes node_modules/.package-lock.json on every install).
if [ ! -f "$here/node_modules/dynalite/package.json" ] || [ ! -f "$here/node_modules/.package-lock.json" ] ||
   [ "$here/package-lock.json" -nt "$here/node_modules/.package-lock.json" ]; then
  log "npm ci (dynalite)"
  (cd "$here" && npm ci --omit=optional --no-audit --no-fund >&2)
fi

# A free loopback port: ask the kernel for one.
port=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')

log "starting dynalite on 127.0.0.1:$port (log: $logfile)"
cd "$here"
# server.js runs dynalite with instant table state changes (see there).
setsid nohup node server.js --host 127.0.0.1 --port "$port" >"$logfile" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$pidfile"
echo "$port" >"$portfile"

for _ in $(seq 1 120); do
  if answers "$port"; then
    echo "export WARDEN_TEST_DYNAMODB_ENDPOINT='http://127.0.0.1:$port'"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then break; fi
  sleep 0.5
done
log "dynalite did not answer on port $port within 60 s; log tail:"
tail -n 30 "$logfile" >&2 || true
kill "$pid" 2>/dev/null || true
rm -f "$pidfile" "$portfile"
exit 1
