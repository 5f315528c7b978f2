#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Starts and stops the private etcd and Redis servers that Ferry's metadata
# tests talk to. Nothing is installed system-wide and nothing persists.
#
#   scripts/services.sh start DIR   start both, write DIR/services.env
#   scripts/services.sh stop DIR    stop both
#
# DIR/services.env then holds FERRY_TEST_ETCD=127.0.0.1:PORT and
# FERRY_TEST_REDIS=127.0.0.1:PORT; `set -a; . DIR/services.env; set +a`
# before running ctest. Ports are picked free on 127.0.0.1.
set -euo pipefail

WAIT_S=${FERRY_SERVICES_WAIT_S:-20}   # bound on the wait for each server

die() { echo "services: $*" >&2; exit 1; }

# A port on 127.0.0.1 that nothing listens on (random, re-drawn if taken),
# below the kernel's ephemeral range: a port there can be taken at any moment
# as the local end of an outgoing connection, and binding it then fails.
free_port() {
  local p low=32768
  read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  [ "$low" -gt 11000 ] 2>/dev/null || low=32768
  for _ in $(seq 1 50); do
    p=$(( 10000 + RANDOM % (low - 10000) ))
    if ! ss -Htln "sport = :$p" 2>/dev/null | grep -q . &&
       ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"; return 0
    fi
  done
  die "no free port found on 127.0.0.1"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# The pid in PIDFILE still runs the program we started (NAME): a pidfile left
# from an earlier run may name a pid the system has since given to another
# process, which must not be signalled. Processes are only ever stopped by
# the pid this script recorded, never by name.
ours() {
  local pidfile=$1 name=$2 comm
  alive "$pidfile" || return 1
  comm=$(cat "/proc/$(cat "$pidfile")/comm" 2>/dev/null) || return 1
  [ "$comm" = "$name" ]
}

redis_ok() { redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG; }
etcd_ok() { curl -sf --max-time 1 "http://127.0.0.1:$1/health" 2>/dev/null | grep -q '"health":"true"'; }

# wait_for PIDFILE CHECK PORT NAME LOG: until CHECK PORT succeeds, bounded.
wait_for() {
  local pidfile=$1 check=$2 port=$3 name=$4 log=$5
  local deadline=$(( SECONDS + WAIT_S ))
  while (( SECONDS < deadline )); do
    "$check" "$port" && return 0
    # The process may not have written its pidfile yet; only a pidfile
    # naming a dead process means it exited.
    if { [ -f "$pidfile" ] && ! alive "$pidfile"; } || grep -q "Address already in use" "$log" 2>/dev/null; then
      echo "services: $name exited during start-up; last lines of $log:" >&2
      tail -n 15 "$log" >&2 || true
      return 1
    fi
    sleep 0.2
  done
  echo "services: $name on 127.0.0.1:$port did not answer within ${WAIT_S}s; last lines of $log:" >&2
  tail -n 15 "$log" >&2 || true
  return 1
}

start_redis() {
  local dir=$1 port
  port=$(free_port)
  rm -f "$dir/redis.pid" "$dir/redis.log"
  redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
    --dir "$dir" >/dev/null || { echo "services: redis-server failed to start (see $dir/redis.log)" >&2; return 1; }
  wait_for "$dir/redis.pid" redis_ok "$port" redis-server "$dir/redis.log" || return 1
  REDIS_PORT=$port
}

start_etcd() {
  local dir=$1 cport pport
  cport=$(free_port)
  pport=$(free_port)
  [ "$cport" != "$pport" ] || pport=$(free_port)
  rm -rf "$dir/etcd-data"
  # etcd 3.4 refuses to run on arm64 unless told that it may.
  if [ "$(uname -m)" = aarch64 ]; then export ETCD_UNSUPPORTED_ARCH=arm64; fi
  # Backgrounded with nohup; etcd has no daemon mode, so the pidfile is ours.
  nohup etcd --name ferry-test --data-dir "$dir/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$cport" \
    --advertise-client-urls "http://127.0.0.1:$cport" \
    --listen-peer-urls "http://127.0.0.1:$pport" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "ferry-test=http://127.0.0.1:$pport" \
    --initial-cluster-state new >"$dir/etcd.log" 2>&1 </dev/null &
  echo $! >"$dir/etcd.pid"
  wait_for "$dir/etcd.pid" etcd_ok "$cport" etcd "$dir/etcd.log" || return 1
  ETCD_PORT=$cport
}

stop_pid() {
  local pidfile=$1 name=$2
  ours "$pidfile" "$name" || { rm -f "$pidfile"; return 0; }
  local pid; pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
    sleep 0.1
  done
  echo "services: $name (pid $pid) ignored SIGTERM for 5s; killing it" >&2
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

cmd_start() {
  local dir=$1
  for tool in etcd redis-server redis-cli curl ss; do
    command -v "$tool" >/dev/null || die "$tool not found; run scripts/deps.sh"
  done
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  # Already running and answering (from an earlier start): keep them.
  if [ -f "$dir/services.env" ] && alive "$dir/etcd.pid" && alive "$dir/redis.pid"; then
    # shellcheck disable=SC1091
    . "$dir/services.env"
    if etcd_ok "${FERRY_TEST_ETCD##*:}" && redis_ok "${FERRY_TEST_REDIS##*:}"; then
      echo "services: already running ($dir/services.env)"
      return 0
    fi
  fi
  cmd_stop "$dir"
  # A server that failed to come up is stopped with the other: all or none.
  # A port taken between the check and the bind is drawn again, twice.
  local ok=0
  for attempt in 1 2 3; do
    if start_redis "$dir" && start_etcd "$dir"; then ok=1; break; fi
    cmd_stop "$dir"
    echo "services: start attempt $attempt failed; trying other ports" >&2
  done
  if [ "$ok" -ne 1 ]; then
    cmd_stop "$dir"
    die "start failed; nothing left running (logs in $dir)"
  fi
  cat >"$dir/services.env" <<EOF
FERRY_TEST_ETCD=127.0.0.1:$ETCD_PORT
FERRY_TEST_REDIS=127.0.0.1:$REDIS_PORT
EOF
  echo "services: etcd on 127.0.0.1:$ETCD_PORT, redis on 127.0.0.1:$REDIS_PORT ($dir/services.env)"
}

cmd_stop() {
  local dir=$1
  [ -d "$dir" ] || return 0
  stop_pid "$dir/etcd.pid" etcd
  stop_pid "$dir/redis.pid" redis-server
  rm -rf "$dir/services.env" "$dir/etcd-data"
}

[ $# -eq 2 ] || die "usage: $0 start|stop DIR"
case $1 in
  start) cmd_start "$2" ;;
  stop) cmd_stop "$2" ;;
  *) die "usage: $0 start|stop DIR" ;;
esac
