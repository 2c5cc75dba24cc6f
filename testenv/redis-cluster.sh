#!/usr/bin/env bash
# A 3-master Redis Cluster on loopback ports for the Redis store's tests,
# run from the same redis-server binary as the single test server. Data
# and logs live under testenv/.run/redis-cluster/.
#
#   testenv/redis-cluster.sh        start (idempotent); prints the export line
#   testenv/redis-cluster.sh stop   stop the three servers
#
# Ports: WARDEN_REDIS_CLUSTER_PORTS (default "7101 7102 7103").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
run="$root/testenv/.run/redis-cluster"
ports=${WARDEN_REDIS_CLUSTER_PORTS:-"7101 7102 7103"}
log() { printf 'testenv: %s\n' "$*" >&2; }

if [ "${1:-}" = stop ]; then
  for p in $ports; do
    redis-cli -h 127.0.0.1 -p "$p" shutdown nosave >/dev/null 2>&1 || true
  done
  exit 0
fi

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
