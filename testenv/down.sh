#!/usr/bin/env bash
# Stops the test servers that testenv started for itself and that `make test`
# leaves running so that the next run starts at once:
#
#   FerretDB   (testenv/ferretdb/up.sh; pid in testenv/.run/ferretdb.pid)
#   dynalite   (testenv/dynalite/up.sh; pid in testenv/.run/dynalite.pid)
#   the Redis Cluster nodes of testenv/redis-cluster.sh (ports 7101–7103)
#
#   testenv/down.sh          stop them
#   testenv/down.sh --purge  stop them and delete testenv/.run (logs, the
#                            FerretDB build and its data)
#
# A pid is signalled only if that process is still the server this
# repository started (its command line names the binary or script in
# testenv/), so a pid reused by another program is left alone.
#
# MariaDB, PostgreSQL and Redis on port 6379 are left running: they are the
# machine's services (testenv/up.sh installs them from Debian's packages and
# starts them only when they are not already running, and records nothing
# of it), and other programs may use them. Stop them yourself if you want:
#   mariadb-admin -h 127.0.0.1 -uroot shutdown
#   pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main stop
#   redis-cli -h 127.0.0.1 -p 6379 shutdown nosave
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
run="$here/.run"
log() { printf 'testenv/down: %s\n' "$*" >&2; }

purge=
case "${1:-}" in
  "") ;;
  --purge) purge=1 ;;
  *) log "usage: testenv/down.sh [--purge]"; exit 2 ;;
esac

# stop NAME PIDFILE PATTERN [DIR]: SIGTERM the process in PIDFILE if its
# command line contains PATTERN (and its working directory is DIR, if
# given), wait up to 10 s, then SIGKILL; remove the pid and port files.
stop() {
  local name=$1 pidfile=$2 pattern=$3 dir=${4:-} pid cmdline
  if [ ! -f "$pidfile" ]; then
    log "$name: not started by testenv (no $pidfile)"
    return 0
  fi
  pid=$(cat "$pidfile")
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
  if [ -z "$pid" ] || [ -z "$cmdline" ]; then
    log "$name: not running (pid ${pid:-?} is gone)"
  elif [[ "$cmdline" != *"$pattern"* ]] || { [ -n "$dir" ] && [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" != "$dir" ]; }; then
    log "$name: pid $pid is now another program ($cmdline); left alone"
  else
    log "$name: stopping pid $pid"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.25
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name: still running after 10 s; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile" "${pidfile%.pid}.port"
}

stop FerretDB "$run/ferretdb.pid" "$run/ferretdb"
stop dynalite "$run/dynalite.pid" "server.js" "$here/dynalite"
if [ -d "$run/redis-cluster" ] && [ -x "$here/redis-cluster.sh" ]; then
  log "Redis Cluster: stopping its nodes"
  "$here/redis-cluster.sh" stop || true
fi
if [ -n "$purge" ]; then
  log "deleting $run"
  rm -rf "$run"
fi
log "done; MariaDB, PostgreSQL and Redis on 6379 are left running (see the top of this script to stop them)"
