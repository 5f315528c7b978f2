#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A cluster of Ferry engines on one machine: each engine in its own network
# namespace, all joined by a bridge, every link shaped with tc tbf, a real
# etcd for discovery (FERRY_METADATA=etcd://...), prefill and decode roles
# moving paged KV (`ferry cluster node`), optional churn, then a report
# (`ferry cluster report`): goodput against the links, latency, errors by
# code, every byte verified, and per fault the time to notice and recover.
#
#   scripts/cluster.sh [options]          needs root (namespaces, tc, nft)
#
#   --engines N        prefill + decode engines (16); a probe engine is added
#   --pattern P        pairs | all-to-all | incast | mesh (pairs); mesh: every
#                      engine asks every other and serves them (N(N-1)
#                      sessions), no churn
#   --fan-in K         incast: prefills per decode (15; groups of K+1 engines)
#   --rate R           tbf rate of every link, each direction (200mbit)
#   --duration S       seconds of traffic after the warm-up (20)
#   --warmup S         seconds before measuring (3)
#   --churn C          none | short (one kill, one etcd restart) |
#                      full (kills, SIGSTOP, etcd down 10 s, 5% drop) (none)
#   --timeout-ms T     each request's deadline (2000)
#   --window W --inflight N --streams S --send-slots N
#                      asks in flight per pair (2) and per decode (8), KV
#                      sends at once per pair (2) and per prefill (4: its
#                      sender threads, serving its decodes' queues in turn)
#   --layers L --page-bytes B --pages N
#                      one request: N pages of B bytes in L layers (4, 4096,
#                      16: 256 KiB in 64 pieces)
#   --ferry PATH       the ferry binary (build/ferry)
#   --dir DIR          where logs go (a new temporary directory)
#   --seed N           picks the decode engines hurt by churn
#   --inject X         show that the checks can fail: corrupt (a prefill flips
#                      a byte), stray (a prefill writes into pages it no longer
#                      owns), silent-kill (a decode is killed, not logged as a
#                      fault: its failures are unexplained)
#
# Exit: 0 when the report finds no violation, 1 when it does (or an engine
# failed), 77 when network namespaces cannot be created here (a skip).
# Everything made is removed on exit: the namespaces (which removes the
# bridge, veths, qdiscs and nft tables in them) and the processes started,
# each ended by its own pid. Namespaces left by a run that was SIGKILLed
# (fcl<pid>..., pid dead) are removed at the next start.
#
# Addresses: 10.77.0.0/16, only inside the namespaces this script creates.
set -uo pipefail

ENGINES=16 PATTERN=pairs FAN_IN=15 RATE=200mbit DURATION=20 WARMUP=3 CHURN=none
TIMEOUT_MS=2000 WINDOW=2 INFLIGHT=8 STREAMS=2 SLOTS=4 LAYERS=4 PAGE_BYTES=4096 PAGES=16
FERRY=${FERRY:-build/ferry} DIR= SEED=$RANDOM KEEP=0 INJECT=
CANCEL_MS=1000 PORT=17000 HUB_IP=10.77.255.254 ETCD_PORT=2379

die() { echo "cluster: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -uo/p' "$0" | sed -e 's/^# \{0,1\}//' -e '/^set -uo/d'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
  case $1 in
    --engines) ENGINES=$2; shift ;;
    --pattern) PATTERN=$2; shift ;;
    --fan-in) FAN_IN=$2; shift ;;
    --rate) RATE=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --churn) CHURN=$2; shift ;;
    --timeout-ms) TIMEOUT_MS=$2; shift ;;
    --window) WINDOW=$2; shift ;;
    --inflight) INFLIGHT=$2; shift ;;
    --send-slots) SLOTS=$2; shift ;;
    --streams) STREAMS=$2; shift ;;
    --layers) LAYERS=$2; shift ;;
    --page-bytes) PAGE_BYTES=$2; shift ;;
    --pages) PAGES=$2; shift ;;
    --ferry) FERRY=$2; shift ;;
    --dir) DIR=$2; shift ;;
    --seed) SEED=$2; shift ;;
    --inject) INJECT=$2; shift ;;
    --keep) KEEP=1 ;;
    -h|--help) usage 0 ;;
    *) echo "cluster: unknown option $1" >&2; usage 2 ;;
  esac
  shift
done

case $PATTERN in pairs|all-to-all|incast|mesh) ;; *) die "--pattern must be pairs, all-to-all, incast or mesh" ;; esac
case $CHURN in none|short|full) ;; *) die "--churn must be none, short or full" ;; esac
case $INJECT in ''|corrupt|stray|silent-kill) ;; *) die "--inject must be corrupt, stray or silent-kill" ;; esac
[ "$ENGINES" -ge 2 ] && [ "$ENGINES" -le 400 ] 2>/dev/null || die "--engines must be 2..400"
[ -x "$FERRY" ] || die "no ferry binary at $FERRY (build first, or --ferry PATH)"
FERRY=$(cd "$(dirname "$FERRY")" && pwd)/$(basename "$FERRY")
for tool in ip tc nft etcd curl; do command -v "$tool" >/dev/null || die "$tool not found; run scripts/deps.sh"; done

# Rate in bits per second, from tc's notation (kbit, mbit, gbit).
rate_bps() {
  local r=${1,,}
  case $r in
    *gbit) echo $(( ${r%gbit} * 1000000000 )) ;;
    *mbit) echo $(( ${r%mbit} * 1000000 )) ;;
    *kbit) echo $(( ${r%kbit} * 1000 )) ;;
    *bit) echo "${r%bit}" ;;
    *) die "--rate: use kbit, mbit or gbit (e.g. 200mbit)" ;;
  esac
}
RATE_BPS=$(rate_bps "$RATE") || exit 2

now_ms() { date +%s%3N; }

# ------------------------------------------------------------------ roles
# Engine i is prefill or decode; ASKS[i] lists the prefill indices a decode
# asks. Bottleneck links: the ones the pattern can fill at once.
declare -a ROLE ASKS
case $PATTERN in
  pairs|all-to-all)
    half=$(( ENGINES / 2 ))
    [ $(( ENGINES % 2 )) -eq 0 ] || die "--engines must be even for $PATTERN"
    for ((i = 0; i < half; i++)); do ROLE[i]=prefill; ROLE[i + half]=decode; done
    for ((d = half; d < ENGINES; d++)); do
      if [ "$PATTERN" = pairs ]; then ASKS[d]=$(( d - half ))
      else ASKS[d]=$(seq -s ' ' 0 $(( half - 1 ))); fi
    done
    LINKS=$half ;;
  incast)
    [ "$FAN_IN" -lt "$ENGINES" ] || FAN_IN=$(( ENGINES - 1 ))
    group=$(( FAN_IN + 1 ))
    [ $(( ENGINES % group )) -eq 0 ] || die "--engines $ENGINES is not a multiple of --fan-in + 1 = $group"
    for ((g = 0; g < ENGINES; g += group)); do
      ROLE[g]=decode; ASKS[g]=$(seq -s ' ' $(( g + 1 )) $(( g + FAN_IN )))
      for ((i = g + 1; i <= g + FAN_IN; i++)); do ROLE[i]=prefill; done
    done
    LINKS=$(( ENGINES / group )) ;;
  mesh)
    # Every engine both asks (decode) and serves (prefill): each link is
    # filled both ways.
    [ "$CHURN" = none ] || die "--pattern mesh runs without churn (every engine serves the others)"
    for ((i = 0; i < ENGINES; i++)); do
      ROLE[i]=mesh; ASKS[i]=
      for ((p = 0; p < ENGINES; p++)); do [ "$p" -eq "$i" ] || ASKS[i]+=${ASKS[i]:+ }$p; done
    done
    LINKS=$ENGINES ;;
esac
PROBE=$ENGINES   # one more engine, in its own namespace, for new-session probes

ip_of() { echo "10.77.$(( $1 / 200 )).$(( $1 % 200 + 1 ))"; }
name_of() { echo "$(ip_of "$1"):$PORT"; }

# ------------------------------------------------------------- namespaces
TAG=$$
HUB=fcl${TAG}h
ns_of() { echo "fcl${TAG}n$1"; }
declare -a PIDS
ETCD_PID=
MADE_NS=()

# Namespaces of an earlier run whose script was SIGKILLed: their processes
# (pids listed by the namespace itself) and then the namespaces.
for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^fcl[0-9]+(h|n[0-9]+)$'); do
  p=${n#fcl}; p=${p%%[hn]*}
  kill -0 "$p" 2>/dev/null && continue
  for q in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$q" 2>/dev/null; done
  ip netns del "$n" 2>/dev/null
done

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for p in "${PIDS[@]}" $ETCD_PID; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  for p in "${PIDS[@]}" $ETCD_PID; do [ -n "$p" ] && wait "$p" 2>/dev/null; done
  for n in "${MADE_NS[@]}"; do ip netns del "$n" 2>/dev/null; done
  case ${ETCD_DATA:-} in /dev/shm/ferry-cluster-*) rm -rf "$ETCD_DATA" ;; esac
  if [ "$KEEP" = 0 ] && [ -n "${OWN_DIR:-}" ]; then rm -rf "$DIR"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

if [ -z "$DIR" ]; then DIR=$(mktemp -d /tmp/ferry-cluster.XXXXXX); OWN_DIR=1; else mkdir -p "$DIR"; rm -f "$DIR"/node-*.log "$DIR"/node-*.out "$DIR"/faults; fi
DIR=$(cd "$DIR" && pwd)

if ! ip netns add "$HUB" 2>"$DIR/netns.err"; then
  echo "cluster: SKIP: cannot create a network namespace here: $(cat "$DIR/netns.err")" >&2
  exit 77
fi
MADE_NS+=("$HUB")
hubx() { ip netns exec "$HUB" "$@"; }
ip -n "$HUB" link set lo up
ip -n "$HUB" link add br0 type bridge || die "cannot create a bridge"
ip -n "$HUB" addr add "$HUB_IP/16" dev br0
ip -n "$HUB" link set br0 up

# tbf needs a bucket of at least one maximal (GSO) packet; 4 ms of the rate
# keeps it smooth at high rates.
BURST=$(( RATE_BPS / 8 / 250 )); [ "$BURST" -ge 131072 ] || BURST=131072
shape() { # NS DEV
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$RATE" burst "$BURST" latency 50ms
}

make_node_ns() { # INDEX
  local i=$1 ns; ns=$(ns_of "$i")
  ip netns add "$ns" || return 1
  MADE_NS+=("$ns")
  ip -n "$HUB" link add "v$i" type veth peer name eth0 netns "$ns" || return 1
  ip -n "$HUB" link set "v$i" master br0 up
  ip -n "$ns" link set eth0 address "$(mac_of "$i")"
  ip -n "$ns" addr add "$(ip_of "$i")/16" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  shape "$ns" eth0 && shape "$HUB" "v$i"
}

# Fixed MACs and permanent neighbour entries everywhere: the kernel's ARP
# table is shared by all namespaces (gc_thresh3, 1,024 entries by default),
# and a full mesh of 64 engines learning each other dynamically overflows
# it ("neighbor table overflow": connects time out). Permanent entries are
# exempt from that limit and vanish with their namespaces.
mac_of() { printf '02:77:00:00:%02x:%02x\n' $(( $1 / 256 )) $(( $1 % 256 )); }
HUB_MAC=02:77:00:00:ff:fe
static_neighbours() {
  local i j batch
  ip -n "$HUB" link set br0 address "$HUB_MAC"
  batch=$DIR/neigh.hub
  : >"$batch"
  for ((j = 0; j <= PROBE; j++)); do echo "neigh replace $(ip_of "$j") lladdr $(mac_of "$j") dev br0 nud permanent" >>"$batch"; done
  ip -n "$HUB" -batch "$batch" || return 1
  for ((i = 0; i <= PROBE; i++)); do
    batch=$DIR/neigh.$i
    echo "neigh replace $HUB_IP lladdr $HUB_MAC dev eth0 nud permanent" >"$batch"
    for ((j = 0; j <= PROBE; j++)); do
      [ "$j" -eq "$i" ] || echo "neigh replace $(ip_of "$j") lladdr $(mac_of "$j") dev eth0 nud permanent" >>"$batch"
    done
    ip -n "$(ns_of "$i")" -batch "$batch" || return 1
    rm -f "$batch"
  done
  rm -f "$DIR/neigh.hub"
}

echo "cluster: $ENGINES engines + 1 probe, pattern $PATTERN, links $RATE each way, churn $CHURN, logs in $DIR"
for ((i = 0; i <= PROBE; i++)); do make_node_ns "$i" || die "namespace setup failed for engine $i"; done
static_neighbours || die "could not set the neighbour entries"

# ------------------------------------------------------------------- etcd
ETCD_URL=http://$HUB_IP:$ETCD_PORT
if [ "$(uname -m)" = aarch64 ]; then export ETCD_UNSUPPORTED_ARCH=arm64; fi
# Its data in memory where possible: fsync on a disk shared with the
# builds of a busy machine stalls etcd for seconds (lease grants time out).
ETCD_DATA=$DIR/etcd-data
if [ -d /dev/shm ] && [ -w /dev/shm ]; then ETCD_DATA=/dev/shm/ferry-cluster-$TAG-etcd; fi
start_etcd() {
  ip netns exec "$HUB" etcd --name ferry-cluster --data-dir "$ETCD_DATA" \
    --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster ferry-cluster=http://127.0.0.1:2380 --initial-cluster-state new \
    >>"$DIR/etcd.log" 2>&1 </dev/null &
  ETCD_PID=$!
  for _ in $(seq 1 100); do
    hubx curl -sf --max-time 1 "$ETCD_URL/health" 2>/dev/null | grep -q '"health":"true"' && return 0
    kill -0 "$ETCD_PID" 2>/dev/null || break
    sleep 0.2
  done
  tail -n 15 "$DIR/etcd.log" >&2
  return 1
}
stop_etcd() {
  kill "$ETCD_PID" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$ETCD_PID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$ETCD_PID" 2>/dev/null; wait "$ETCD_PID" 2>/dev/null; ETCD_PID=
}
# Requests etcd handled so far (gRPC, which its JSON gateway also goes
# through); empty when it did not answer.
etcd_ops() {
  hubx curl -sf --max-time 5 "$ETCD_URL/metrics" 2>/dev/null |
    awk '/^grpc_server_handled_total/ {s += $NF; n++} END {if (n) printf "%d\n", s}'
}
OPS_SEEN=0 OPS_KNOWN=1 ETCD_DOWN_MS=0
ops_add() { # FROM TO: counts etcd requests between two readings
  if [ -n "$1" ] && [ -n "$2" ]; then OPS_SEEN=$(( OPS_SEEN + $2 - $1 )); else OPS_KNOWN=0; fi
}
start_etcd || die "etcd did not start (log above)"
export FERRY_METADATA=etcd://$HUB_IP:$ETCD_PORT FERRY_CANCEL_TIMEOUT_MS=$CANCEL_MS
# New sessions (connect + handshake) get the request deadline, 5 s at least.
export FERRY_CONNECT_TIMEOUT_MS=$(( TIMEOUT_MS > 5000 ? TIMEOUT_MS : 5000 ))

# ---------------------------------------------------------------- engines
: >"$DIR/nodes"
for ((i = 0; i < ENGINES; i++)); do echo "$i ${ROLE[i]} $(name_of "$i")" >>"$DIR/nodes"; done
echo "$PROBE probe $(name_of "$PROBE")" >>"$DIR/nodes"
COMMON=(--layers "$LAYERS" --page-bytes "$PAGE_BYTES" --pages "$PAGES" --timeout-ms "$TIMEOUT_MS" --dir "$DIR")
declare -a INCARNATION

peers_of() { # DECODE_INDEX
  local out= p
  for p in ${ASKS[$1]}; do out+=${out:+,}$(name_of "$p"); done
  echo "$out"
}
start_node() { # INDEX
  local i=$1 role=${ROLE[$1]:-probe} extra=()
  INCARNATION[i]=$(( ${INCARNATION[i]:-0} + 1 ))
  case $role in
    decode) extra=(--peers "$(peers_of "$i")" --go-file "$DIR/go" --window "$WINDOW" --inflight "$INFLIGHT") ;;
    mesh) extra=(--peers "$(peers_of "$i")" --go-file "$DIR/go" --window "$WINDOW" --inflight "$INFLIGHT"
                 --streams "$STREAMS" --send-slots "$SLOTS")
          case $INJECT in corrupt|stray) [ "$i" -eq 0 ] && extra+=(--inject "$INJECT") ;; esac ;;
    prefill) extra=(--streams "$STREAMS" --send-slots "$SLOTS")
             case $INJECT in corrupt|stray) [ "$i" -eq 0 ] && extra+=(--inject "$INJECT") ;; esac ;;
    probe) local list= p; for ((p = 0; p < ENGINES; p++)); do case ${ROLE[p]} in prefill|mesh) list+=${list:+,}$(name_of "$p") ;; esac; done
           extra=(--peers "$list") ;;
  esac
  ip netns exec "$(ns_of "$i")" "$FERRY" cluster node --role "$role" --index "$i" --host "$(ip_of "$i")" \
    --port "$PORT" --incarnation "${INCARNATION[i]}" "${COMMON[@]}" "${extra[@]}" \
    >>"$DIR/node-$i.out" 2>&1 </dev/null &
  PIDS[i]=$!
}
# Until engine I logged that it is up (published in etcd), bounded.
wait_up() { # INDEX
  for _ in $(seq 1 300); do
    grep -q '^B ' "$DIR/node-$1.log" 2>/dev/null && return 0
    kill -0 "${PIDS[$1]}" 2>/dev/null || break
    sleep 0.1
  done
  die "engine $1 did not come up: $(tail -n 3 "$DIR/node-$1.out" 2>/dev/null)"
}
# Those that serve first (prefill, mesh: a mesh engine waits for the go
# file before it asks), then the probe, then the decodes.
rm -f "$DIR/go"
for ((i = 0; i < ENGINES; i++)); do case ${ROLE[i]} in prefill|mesh) start_node "$i" ;; esac; done
for ((i = 0; i < ENGINES; i++)); do case ${ROLE[i]} in prefill|mesh) wait_up "$i" ;; esac; done
start_node "$PROBE"
for ((i = 0; i < ENGINES; i++)); do [ "${ROLE[i]}" = decode ] && start_node "$i"; done
for ((i = 0; i <= PROBE; i++)); do wait_up "$i"; done
# Every engine is up: the clock starts, the decodes ask until END_MS.
START_MS=$(now_ms)
END_MS=$(( START_MS + (WARMUP + DURATION) * 1000 ))
echo "$START_MS $END_MS" >"$DIR/go.tmp" && mv "$DIR/go.tmp" "$DIR/go"
OPS0=$(etcd_ops) OPS_T0=$(now_ms)

# ------------------------------------------------------------------ churn
fault() { echo "$(now_ms) $1 $2 $3" >>"$DIR/faults"; echo "cluster: +$(( ($(now_ms) - START_MS) / 1000 )) s: $1 $2 $3"; }
at() { # SECONDS after the start: sleeps until then
  local t=$(( START_MS + $1 * 1000 - $(now_ms) ))
  [ "$t" -gt 0 ] && sleep "$(printf '%d.%03d' $(( t / 1000 )) $(( t % 1000 )))"
}
DECODES=(); for ((i = 0; i < ENGINES; i++)); do [ "${ROLE[i]}" = decode ] && DECODES+=("$i"); done
RANDOM=$SEED
pick_decode() { echo "${DECODES[$(( RANDOM % ${#DECODES[@]} ))]}"; }

kill_restart() { # INDEX DOWN_SECONDS
  local i=$1 name; name=$(name_of "$1")
  fault kill "$name" start
  kill -9 "${PIDS[i]}"; wait "${PIDS[i]}" 2>/dev/null
  sleep "$2"
  start_node "$i"
  fault kill "$name" end
}
stop_cont() { # INDEX SECONDS
  local i=$1 name; name=$(name_of "$1")
  fault stop "$name" start; kill -STOP "${PIDS[i]}"
  sleep "$2"
  kill -CONT "${PIDS[i]}"; fault stop "$name" end
}
etcd_outage() { # SECONDS
  local t0
  ops_add "$OPS0" "$(etcd_ops)"
  t0=$(now_ms)
  fault etcd etcd start; stop_etcd
  sleep "$1"
  start_etcd || die "etcd did not come back"
  fault etcd etcd end
  ETCD_DOWN_MS=$(( ETCD_DOWN_MS + $(now_ms) - t0 ))
  OPS0=$(etcd_ops)
}
drop_link() { # INDEX PERCENT SECONDS
  local i=$1 ns name; ns=$(ns_of "$1"); name=$(name_of "$1")
  fault drop "$name" start
  ip netns exec "$ns" nft -f - <<EOF
table inet fcldrop {
  chain in { type filter hook input priority 0; numgen random mod 100 < $2 drop; }
  chain out { type filter hook output priority 0; numgen random mod 100 < $2 drop; }
}
EOF
  sleep "$3"
  ip netns exec "$ns" nft delete table inet fcldrop
  fault drop "$name" end
}

W=$WARMUP
if [ "$INJECT" = silent-kill ]; then
  at $(( W + 1 )); victim=$(pick_decode); kill -9 "${PIDS[victim]}"; wait "${PIDS[victim]}" 2>/dev/null; start_node "$victim"
fi
case $CHURN in
  short)
    at $(( W + 3 )); kill_restart "$(pick_decode)" 1
    at $(( W + 8 )); etcd_outage 6 ;;
  full)
    at $(( W + 5 )); kill_restart "$(pick_decode)" 2
    at $(( W + 15 )); stop_cont "$(pick_decode)" $(( TIMEOUT_MS * 2 / 1000 + 2 ))
    at $(( W + 25 )); etcd_outage 10
    at $(( W + 42 )); drop_link "$(pick_decode)" 5 8
    at $(( W + 55 )); kill_restart "$(pick_decode)" 1 ;;
esac

# ------------------------------------------------------------------ finish
at $(( W + DURATION ))
ops_add "$OPS0" "$(etcd_ops)"
ETCD_UP_MS=$(( $(now_ms) - OPS_T0 - ETCD_DOWN_MS ))
# Decodes stop asking at END_MS and drain (bounded by their abandon limit).
DRAIN_S=$(( (3 * TIMEOUT_MS + 5000) / 1000 + 10 ))
FAILED_ENGINES=0
for ((i = 0; i < ENGINES; i++)); do
  [ "${ROLE[i]}" = decode ] || continue
  for _ in $(seq 1 $(( DRAIN_S * 10 ))); do kill -0 "${PIDS[i]}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${PIDS[i]}" 2>/dev/null; then
    echo "cluster: decode $i did not finish within ${DRAIN_S}s of the end (a hang); killing it" >&2
    kill -9 "${PIDS[i]}"; FAILED_ENGINES=$(( FAILED_ENGINES + 1 ))
  fi
  wait "${PIDS[i]}"; rc=$?; PIDS[i]=
  [ "$rc" -eq 0 ] || { echo "cluster: decode $i exited $rc (see $DIR/node-$i.out)" >&2; FAILED_ENGINES=$(( FAILED_ENGINES + 1 )); }
done
# A mesh engine logs its decode totals (E with six fields) once its own
# asks drained, and serves the others' until every one has.
for ((i = 0; i < ENGINES; i++)); do
  [ "${ROLE[i]}" = mesh ] || continue
  for _ in $(seq 1 $(( DRAIN_S * 10 ))); do
    grep -Eq '^E [0-9]+ [0-9]+ ' "$DIR/node-$i.log" 2>/dev/null && break
    kill -0 "${PIDS[i]}" 2>/dev/null || break
    sleep 0.1
  done
  grep -Eq '^E [0-9]+ [0-9]+ ' "$DIR/node-$i.log" 2>/dev/null ||
    { echo "cluster: mesh engine $i did not finish its asks within ${DRAIN_S}s of the end (a hang, or it died)" >&2; FAILED_ENGINES=$(( FAILED_ENGINES + 1 )); }
done
# SIGTERM, then at most the time one request may take to end, then -9.
stop_engine() { # INDEX
  local i=$1 rc
  kill -TERM "${PIDS[i]}" 2>/dev/null
  for _ in $(seq 1 $(( (TIMEOUT_MS + CANCEL_MS) / 100 + 50 ))); do kill -0 "${PIDS[i]}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${PIDS[i]}" 2>/dev/null; then
    echo "cluster: engine $i ignored SIGTERM (a hang); killing it" >&2
    kill -9 "${PIDS[i]}"; FAILED_ENGINES=$(( FAILED_ENGINES + 1 ))
  fi
  wait "${PIDS[i]}"; rc=$?; PIDS[i]=
  [ "$rc" -eq 0 ] || { echo "cluster: engine $i exited $rc (see $DIR/node-$i.out)" >&2; FAILED_ENGINES=$(( FAILED_ENGINES + 1 )); }
}
# The probe first: it must not open sessions to prefills that are leaving.
stop_engine "$PROBE"
for ((i = 0; i < ENGINES; i++)); do case ${ROLE[i]} in prefill|mesh) kill -TERM "${PIDS[i]}" 2>/dev/null ;; esac; done
for ((i = 0; i < ENGINES; i++)); do case ${ROLE[i]} in prefill|mesh) stop_engine "$i" ;; esac; done
PIDS=()

cat >"$DIR/run" <<EOF
start_ms=$START_MS
end_ms=$END_MS
rate_bps=$RATE_BPS
links=$LINKS
pattern=$PATTERN
timeout_ms=$TIMEOUT_MS
cancel_ms=$CANCEL_MS
warmup_ms=$(( WARMUP * 1000 ))
EOF
"$FERRY" cluster report --dir "$DIR"; rc=$?
[ "$OPS_KNOWN" = 1 ] && echo "etcd: $OPS_SEEN requests in $(( ETCD_UP_MS / 1000 )) s while it was up = $(( OPS_SEEN * 1000 / (ETCD_UP_MS > 0 ? ETCD_UP_MS : 1) )) per second for $(( ENGINES + 1 )) engines (lease grants and refreshes, lookups, publishes)"
if [ "$FAILED_ENGINES" -gt 0 ]; then
  echo "cluster: $FAILED_ENGINES engine(s) failed or hung; their last words:" >&2
  for f in "$DIR"/node-*.out; do [ -s "$f" ] && { echo "== $f" >&2; tail -n 5 "$f" >&2; }; done
  rc=1
fi
[ "$rc" -eq 0 ] || echo "cluster: logs kept in $DIR" >&2
[ "$rc" -eq 0 ] || KEEP=1
exit "$rc"
