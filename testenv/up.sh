#!/usr/bin/env bash
# Starts (installing on a fresh Debian machine if need be) every database
# server the store modules present in this repository need for their
# tests, and prints `export WARDEN_TEST_…=…` lines for the caller to eval:
#
#   eval "$(testenv/up.sh)"
#
# A variable already set in the environment is kept: point it at your own
# server to test against it. Progress goes to stderr; only exports to stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { printf 'testenv: %s\n' "$*" >&2; }

apt_updated=
apt_install() {
  if [ "$(id -u)" != 0 ]; then log "need root to apt-get install $*"; return 1; fi
  if [ -z "$apt_updated" ]; then DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# wait_for CMD…: retry a readiness probe for up to 30 s.
wait_for() {
  for _ in $(seq 1 60); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  return 1
}

ensure_postgres() {
  [ -n "${WARDEN_TEST_POSTGRES_URL:-}" ] && { echo "export WARDEN_TEST_POSTGRES_URL='$WARDEN_TEST_POSTGRES_URL'"; return; }
  if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    command -v pg_ctlcluster >/dev/null || apt_install postgresql postgresql-client
    log "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start >&2 || true
    wait_for pg_isready -h 127.0.0.1 -p 5432 || { log "PostgreSQL did not start"; return 1; }
  fi
  psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" 2>/dev/null | grep -q 1 ||
    su postgres -c "createdb test" >&2 2>&1 || true
  echo "export WARDEN_TEST_POSTGRES_URL='postgres://postgres@127.0.0.1:5432/test?sslmode=disable'"
}

ensure_mariadb() {
  [ -n "${WARDEN_TEST_MYSQL_URL:-}" ] && { echo "export WARDEN_TEST_MYSQL_URL='$WARDEN_TEST_MYSQL_URL'"; return; }
  if ! mariadb-admin -h 127.0.0.1 -uroot ping >/dev/null 2>&1; then
    command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || apt_install mariadb-server mariadb-client
    log "starting MariaDB"
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd >&2
    wait_for mariadb-admin -h 127.0.0.1 -uroot ping || { log "MariaDB did not start"; return 1; }
  fi
  mariadb -h 127.0.0.1 -uroot -e "CREATE DATABASE IF NOT EXISTS test" >&2
  echo "export WARDEN_TEST_MYSQL_URL='mysql://root@127.0.0.1:3306/test'"
}

ensure_redis() {
  [ -n "${WARDEN_TEST_REDIS_URL:-}" ] && { echo "export WARDEN_TEST_REDIS_URL='$WARDEN_TEST_REDIS_URL'"; return; }
  if ! redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then
    command -v redis-server >/dev/null || apt_install redis-server
    log "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/warden-test.log >&2
    wait_for sh -c 'redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG' || { log "Redis did not start"; return 1; }
  fi
  echo "export WARDEN_TEST_REDIS_URL='redis://127.0.0.1:6379/0'"
}

# Which servers the present store modules need. A store issue adds its line
# (and, for MongoDB/DynamoDB, its ensure_ function starting the server from
# testenv/ferretdb or testenv/dynalite).
[ -f "$root/store/postgres/go.mod" ] && ensure_postgres
[ -f "$root/store/mysql/go.mod" ] && ensure_mariadb
if [ -f "$root/store/redis/go.mod" ]; then
  ensure_redis
  # A 3-master cluster and a Sentinel for the Redis store's tests.
  "$root/testenv/redis-cluster.sh" || log "the Redis Cluster or Sentinel did not start: their tests skip"
fi
# MongoDB (FerretDB embedded in testenv/ferretdb) and DynamoDB (dynalite from
# testenv/dynalite): each folder's up.sh builds or installs, starts on a free
# loopback port, and prints its export line.
[ -f "$root/store/mongo/go.mod" ] && "$root/testenv/ferretdb/up.sh"
[ -f "$root/store/dynamo/go.mod" ] && "$root/testenv/dynalite/up.sh"
true
