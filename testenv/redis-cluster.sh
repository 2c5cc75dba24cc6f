#!/usr/bin/env bash
# A 3-master Redis Cluster on loopback ports for the Redis store's tests,
# run from the same redis-server binary as the single test server, and a
# Sentinel (port 7201) watching the single server at 127.0.0.1:6379 as
# master "warden". Data and logs live under testenv/.run/redis-cluster/.
#
#   testenv/redis-cluster.sh        start (idempotent); prints the export lines
#   testenv/redis-cluster.sh stop   stop the cluster's servers and the Sentinel
#
# Ports: WARDEN_REDIS_CLUSTER_PORTS (default "7101 7102 7103"),
# WARDEN_REDIS_SENTINEL_PORT (default 7201).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
run="$root/testenv/.run/redis-cluster"
ports=${WARDEN_REDIS_CLUSTER_PORTS:-"7101 7102 7103"}
sentinel=${WARDEN_REDIS_SENTINEL_PORT:-7201}
log() { printf 'testenv: %s\n' "$*" >&2; }

if [ "${1:-}" = stop ]; then
  for p in $ports $sentinel; do
    redis-cli -h 127.0.0.1 -p "$p" shutdown nosave >/dev/null 2>&1 || true
  done
  exit 0
fi

# start_sentinel: a Sentinel watching the single test server (it never
# fails over: the server has no replica).
start_sentinel() {
  if [ -n "${WARDEN_TEST_REDIS_SENTINEL_ADDRS:-}" ]; then
    echo "export WARDEN_TEST_REDIS_SENTINEL_ADDRS='$WARDEN_TEST_REDIS_SENTINEL_ADDRS'"
    return
  fi
  if ! redis-cli -h 127.0.0.1 -p "$sentinel" ping 2>/dev/null | grep -q PONG; then
    mkdir -p "$run/sentinel"
    log "starting Redis Sentinel on port $sentinel"
    printf 'port %s\nbind 127.0.0.1\ndaemonize yes\ndir %s\nlogfile %s\npidfile %s\nsentinel monitor warden 127.0.0.1 6379 1\nsentinel down-after-milliseconds warden 60000\n' \
      "$sentinel" "$run/sentinel" "$run/sentinel/sentinel.log" "$run/sentinel/sentinel.pid" >"$run/sentinel/sentinel.conf"
    redis-server "$run/sentinel/sentinel.conf" --sentinel >&2
    for _ in $(seq 1 60); do
      redis-cli -h 127.0.0.1 -p "$sentinel" sentinel get-master-addr-by-name warden 2>/dev/null | grep -q 6379 && break
      sleep 0.5
    done
  fi
  echo "export WARDEN_TEST_REDIS_SENTINEL_ADDRS='127.0.0.1:$sentinel'"
}
start_sentinel

if [ -n "${WARDEN_TEST_REDIS_CLUSTER_ADDRS:-}" ]; then
  echo "export WARDEN_TEST_REDIS_CLUSTER_ADDRS='$WARDEN_TEST_REDIS_CLUSTER_ADDRS'"
  exit 0
fi
addrs=()
for p in $ports; do
  addrs+=("127.0.0.1:$p")
  if ! redis-cli -h 127.0.0.1 -p "$p" ping 2>/dev/null | grep -q PONG; then
    mkdir -p "$run/$p"
    log "starting Redis Cluster node on port $p"
    # A node that lost its peers starts from scratch: no saved cluster
    # state, no data (the tests own every key).
    rm -f "$run/$p/nodes.conf"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --save "" --appendonly no \
      --cluster-enabled yes --cluster-config-file "$run/$p/nodes.conf" --cluster-node-timeout 5000 \
      --dir "$run/$p" --logfile "$run/$p/redis.log" --pidfile "$run/$p/redis.pid" >&2
  fi
done
for p in $ports; do
  for _ in $(seq 1 60); do
    redis-cli -h 127.0.0.1 -p "$p" ping 2>/dev/null | grep -q PONG && break
    sleep 0.5
  done
done
first=${addrs[0]}
if ! redis-cli -h 127.0.0.1 -p "${first##*:}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then
  nodes=$(redis-cli -h 127.0.0.1 -p "${first##*:}" cluster nodes 2>/dev/null | wc -l)
  if [ "$nodes" -le 1 ]; then
    log "creating the Redis Cluster ${addrs[*]}"
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >&2
  fi
  for _ in $(seq 1 60); do
    ok=1
    for p in $ports; do
      redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=
    done
    [ -n "$ok" ] && break
    sleep 0.5
  done
  [ -n "$ok" ] || { log "the Redis Cluster did not become ready"; exit 1; }
fi
echo "export WARDEN_TEST_REDIS_CLUSTER_ADDRS='$(IFS=,; echo "${addrs[*]}")'"
