#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The ferry CLI as a user runs it: explain, help, option checks, serve + doctor (text and --json), doctor on a dead peer.
set -uo pipefail
FERRY=$1
fails=0; passes=0
check() { # check NAME: the previous command's output ($out) must match $2
  if grep -qE -- "$2" <<<"$out"; then passes=$((passes + 1)); else echo "FAIL $1: wanted /$2/ in:"; echo "$out"; fails=$((fails + 1)); fi
}
# json_check TEXT PYTHON-EXPRESSION: TEXT parses as JSON and the expression (over `d`) holds.
json_check() {
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if eval(sys.argv[2]) else 1)' "$@"
}
# json_error NAME STATUS ERROR-NAME DETAIL-PART: the previous command (stdout in $out, exit status in $rc)
# printed only the {"error": {"code", "name", "detail"}} object `ferry bench --json` prints on failure.
json_error() {
  if json_check "$out" 'list(d) == ["error"] and list(d["error"]) == ["code", "name", "detail"] and d["error"]["code"] < 0 and d["error"]["name"] == sys.argv[3] and sys.argv[4] in d["error"]["detail"]' "$3" "$4" \
     && [ "$(wc -l <<<"$out")" -eq 1 ] && [ "$rc" -eq "$2" ]; then
    passes=$((passes + 1))
  else
    echo "FAIL $1: wanted exit $2 and one {\"error\"} object $3 with '$4', got exit $rc:"; echo "$out"; fails=$((fails + 1))
  fi
}
out=$("$FERRY" explain -3); check explain-number "ADDRESS_NOT_REGISTERED \(-3\)"
check explain-advice "re-register"
out=$("$FERRY" explain PEER_RESTARTED); check explain-name "Retryable: no"
out=$("$FERRY" explain --all); check explain-all "TIMEOUT +the operation did not finish.*\[retryable\]"
out=$("$FERRY" explain BOGUS 2>&1); rc=$?; check explain-unknown "unknown error code"
[ $rc -ne 0 ] || { echo "FAIL explain BOGUS exited 0"; fails=$((fails + 1)); }
# A number outside int's range is no code (4294966894 wrapped to -402, PEER_RESTARTED).
for n in 4294966894 -4294967298 99999999999999999999; do
  out=$("$FERRY" explain $n 2>&1); rc=$?; check "explain-range-$n" "unknown error code '$n'"
  [ $rc -eq 1 ] || { echo "FAIL explain $n exited $rc"; fails=$((fails + 1)); }
done
out=$("$FERRY" nosuchcommand 2>&1); check unknown-command "unknown command"
out=$("$FERRY" --help); check help "doctor"
tmpd=$(mktemp -d)
# `ferry help COMMAND` covers every command the list shows.
cmds=$("$FERRY" help | sed -nE 's/^  ([a-z][a-z-]*) .*/\1/p')
[ -n "$cmds" ] || { echo "FAIL help lists no command"; fails=$((fails + 1)); }
for c in $cmds; do
  out=$("$FERRY" help "$c" 2>&1); rc=$?
  check "help-$c" "usage: ferry $c"
  [ $rc -eq 0 ] || { echo "FAIL ferry help $c exited $rc"; fails=$((fails + 1)); }
  # -h and --help: the help on stdout (nothing on stderr), exit 0, in every command.
  for h in -h --help; do
    out=$("$FERRY" "$c" $h 2>"$tmpd/err"); rc=$?
    check "help-$c$h" "usage: ferry $c"
    [ $rc -eq 0 ] && [ ! -s "$tmpd/err" ] || { echo "FAIL ferry $c $h exited $rc, stderr: $(cat "$tmpd/err")"; fails=$((fails + 1)); }
  done
done
for sub in "cluster node" "cluster report" "bench target" "bench baseline" "plot bars"; do
  out=$("$FERRY" $sub -h 2>/dev/null); rc=$?
  check "help-$sub" "usage: ferry ${sub%% *}"
  [ $rc -eq 0 ] || { echo "FAIL ferry $sub -h exited $rc"; fails=$((fails + 1)); }
done
# ferry info: version, build, transports (why not), devices, settings; --json.
out=$("$FERRY" info); rc=$?
check info-version "^ferry [0-9]+\.[0-9]+\.[0-9]+ \(library"
check info-transports "^  tcp +yes +reaches every peer"
check info-rdma "^  rdma +(yes|no) +[^ ]"
check info-settings "^  timeout_ms +30000"
check info-transport-keys "^  FERRY_RDMA_PORT +rdma +1 +port number \(default\)"
[ $rc -eq 0 ] || { echo "FAIL ferry info exited $rc"; fails=$((fails + 1)); }
out=$(FERRY_TIMEOUT_MS=1234 FERRY_SECRET=hunter2 "$FERRY" info --json); rc=$?
if json_check "$out" 'd["version"]["protocol"] >= 1 and d["transports"]["tcp"]["usable"] and set(d["transports"]) == {"tcp", "shm", "rdma"} and d["settings"]["timeout_ms"] == 1234 and d["settings"]["secret"] and d["environment"]["FERRY_TIMEOUT_MS"] == "1234" and "hunter2" not in json.dumps(d) and "p2p" in d["build"]["metadata_backends"] and d["devices"]["cpus"] >= 1'; then
  passes=$((passes + 1))
else
  echo "FAIL info-json: unexpected:"; echo "$out"; fails=$((fails + 1))
fi
out=$(FERRY_SHM_NOMAP=1 FERRY_RDMA_DEVICE=mlx5_9 "$FERRY" info --json); rc=$?
if json_check "$out" 'd["transport_settings"]["FERRY_SHM_NOMAP"] == {"transport": "shm", "value": 1, "set": True, "help": d["transport_settings"]["FERRY_SHM_NOMAP"]["help"]} and d["transport_settings"]["FERRY_RDMA_DEVICE"]["value"] == "mlx5_9" and d["transport_settings"]["FERRY_RDMA_PORT"]["value"] == 1 and not d["transport_settings"]["FERRY_RDMA_PORT"]["set"]'; then
  passes=$((passes + 1))
else
  echo "FAIL info-json: unexpected:"; echo "$out"; fails=$((fails + 1))
fi
out=$(FERRY_TIMEOUT_MS=soon "$FERRY" info 2>&1); rc=$?
check info-bad-env "ERROR: .*FERRY_TIMEOUT_MS"
[ $rc -eq 1 ] || { echo "FAIL ferry info with a bad FERRY_TIMEOUT_MS exited $rc"; fails=$((fails + 1)); }
# ferry plot bars: an SVG with the labels, values and the reference line.
printf 'a / b\t1.5\nc / d\t0.5\tlower\n' | "$FERRY" plot bars --out "$tmpd/bars.svg" --title T --x-label "ratio" --reference 1
out=$(cat "$tmpd/bars.svg" 2>&1)
check plot-bars-label ">a / b</text>"
check plot-bars-value ">1.50</text>"
check plot-bars-reference 'stroke-dasharray'
# bench/compare --plot: the ratios of a saved run (old "gbps" keys read too) drawn by ferry plot bars.
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
printf '%s\n' '{"key":"tcp_w1m","r":{"gbps":2.0,"transport":"tcp"}}' '{"key":"iperf_1m","r":{"gb_per_s":2.5}}' \
  '{"key":"_load","r":{"before":"1","after":"1","elapsed":1,"dur":1,"rounds":1,"round_dur":1}}' >"$tmpd/res.jsonl"
out=$(BUILD=$(cd "$(dirname "$FERRY")" && pwd) "$ROOT/bench/compare" --from "$tmpd/res.jsonl" --plot "$tmpd/cmp.svg" 2>&1)
check compare-ratio "TCP write 1 MiB, hot \(16/call, 2 conns\) +2\.00 GB/s +iperf3 1 stream -l 1M +2\.50 GB/s +0\.80"
check compare-plotted "ratios drawn in $tmpd/cmp.svg"
out=$(cat "$tmpd/cmp.svg" 2>&1); check compare-plot-bar ">0\.80</text>"
out=$(printf 'no tab here\n' | "$FERRY" plot bars --out "$tmpd/x.svg" 2>&1); rc=$?
check plot-bars-bad "line 1: no TAB"
[ $rc -eq 1 ] || { echo "FAIL plot bars on a bad line exited $rc"; fails=$((fails + 1)); }
out=$("$FERRY" help nosuchcommand 2>&1); rc=$?; check help-unknown "unknown command 'nosuchcommand'"
[ $rc -eq 2 ] || { echo "FAIL ferry help nosuchcommand exited $rc"; fails=$((fails + 1)); }
out=$("$FERRY" doctor 127.0.0.1:7 --probe-mib 4x 2>&1); rc=$?; check doctor-bad-number "--probe-mib '4x' is not a whole number"
[ $rc -eq 2 ] || { echo "FAIL doctor --probe-mib 4x exited $rc"; fails=$((fails + 1)); }
out=$("$FERRY" bench --local --threads x 2>&1); rc=$?; check bench-bad-number "--threads 'x' is not a whole number"
[ $rc -eq 2 ] || { echo "FAIL bench --threads x exited $rc"; fails=$((fails + 1)); }
out=$("$FERRY" bench --local --duration 1s 2>&1); rc=$?; check bench-bad-duration "--duration '1s' is not a number"
[ $rc -eq 2 ] || { echo "FAIL bench --duration 1s exited $rc"; fails=$((fails + 1)); }
out=$("$FERRY" bench initiator --peer 127.0.0.1:7 --remote-addr 0xzz --remote-len 4K 2>&1); rc=$?
check bench-bad-addr "--remote-addr '0xzz' is not an unsigned number"
[ $rc -eq 2 ] || { echo "FAIL bench --remote-addr 0xzz exited $rc"; fails=$((fails + 1)); }
out=$(FERRY_TIMEOUT_MS=soon "$FERRY" doctor 127.0.0.1:7 --json 2>&1); rc=$?
if json_check "$out" 'not d["ok"] and d["checks"][0]["check"] == "local" and d["checks"][0]["error"] == "INVALID_ARGUMENT" and "FERRY_TIMEOUT_MS" in d["checks"][0]["message"]'; then
  passes=$((passes + 1))
else
  echo "FAIL doctor-json-bad-env: unexpected report:"; echo "$out"; fails=$((fails + 1))
fi
[ $rc -eq 1 ] || { echo "FAIL doctor with a bad FERRY_TIMEOUT_MS exited $rc"; fails=$((fails + 1)); }
out=$("$FERRY" serve --size 0 2>&1); rc=$?; check serve-bad-number "--size '0' is not a whole number"
[ $rc -eq 2 ] || { echo "FAIL serve --size 0 exited $rc"; fails=$((fails + 1)); }
# serve, doctor --json and metabench --json fail with the {"error"} object on stdout, as bench --json.
out=$("$FERRY" serve --size 0 2>/dev/null); rc=$?; json_error serve-json-bad-number 2 INVALID_ARGUMENT "--size '0'"
out=$(FERRY_TIMEOUT_MS=soon "$FERRY" serve 2>/dev/null); rc=$?; json_error serve-json-bad-env 1 INVALID_ARGUMENT FERRY_TIMEOUT_MS
out=$("$FERRY" doctor --json 2>/dev/null); rc=$?; json_error doctor-json-no-peer 2 INVALID_ARGUMENT "give one peer"
out=$("$FERRY" doctor 127.0.0.1:7 --timeout 0 --json 2>/dev/null); rc=$?; json_error doctor-json-bad-number 2 INVALID_ARGUMENT "--timeout '0'"
out=$("$FERRY" metabench --seconds 1 --json 2>/dev/null); rc=$?; json_error metabench-json-no-metadata 2 INVALID_ARGUMENT "--metadata is missing"
out=$("$FERRY" metabench --metadata p2p --json 2>/dev/null); rc=$?; json_error metabench-json-p2p 2 INVALID_ARGUMENT "p2p stores nothing"
out=$("$FERRY" metabench --metadata etcd://127.0.0.1:1 --json 2>/dev/null); rc=$?; json_error metabench-json-down 1 METADATA "127.0.0.1:1"

tmp=$(mktemp -d); trap 'kill $serve 2>/dev/null; rm -rf "$tmp" "$tmpd"' EXIT
# serve: the ready line of `bench target`, the Prometheus port it got with FERRY_METRICS_PORT=-1.
FERRY_METRICS_PORT=-1 "$FERRY" serve --port 0 --buffer-size 8M --duration 60 >"$tmp/serve.json" 2>"$tmp/serve.err" & serve=$!
for _ in $(seq 50); do [ -s "$tmp/serve.json" ] && break; sleep 0.1; done
out=$(cat "$tmp/serve.json")
check serve-ready '^\{"name":"0\.0\.0\.0:[0-9]+","addr":[0-9]+,"len":8388608,"pid":[0-9]+,"epoch":"[0-9a-f]{16}","port":[0-9]+,"metrics_port":[1-9][0-9]*\}$'
mport=$(sed -E 's/.*"metrics_port":([0-9]+).*/\1/' "$tmp/serve.json")
out=$(cat "$tmp/serve.err"); check serve-says-metrics "Prometheus metrics on port $mport"
out=$(python3 -c 'import sys,urllib.request; print(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode()[:2000])' "$mport" 2>&1)
check serve-metrics-served "^# (HELP|TYPE) ferry_"
port=$(sed -E 's/.*"port":([0-9]+),.*/\1/' "$tmp/serve.json")
name="127.0.0.1:$port"
out=$("$FERRY" serve --bind 127.0.0.1 --port "$port" --duration 0 2>/dev/null); rc=$?
json_error serve-json-port-taken 1 SOCKET "Address already in use"
out=$("$FERRY" doctor "$name" --probe-mib 4 2>&1); rc=$?
check doctor-ok "all checks passed"
check doctor-transport "transport: shm \\(.*cross-memory attach"
# A reason that fills the 128-byte peer-info field is cut at a word, saying where the whole one is.
if grep -q "transport: shm (.\{126\}" <<<"$out"; then
  check doctor-reason-cut "[a-z)] \.\.\. \[cut at the 128-byte peer-info field; \`ferry info\` shows"
fi
check doctor-segments "segments: 1 remote-accessible region"
check doctor-probe "bandwidth probe: read"
[ $rc -eq 0 ] || { echo "FAIL doctor exited $rc"; fails=$((fails + 1)); }
out=$("$FERRY" doctor "$name" --probe-mib 4 --json); rc=$?
if json_check "$out" 'd["ok"] and d["peer"] and [c["check"] for c in d["checks"]] == ["connect", "session", "transport", "segments", "rtt", "bandwidth"][:len(d["checks"])] and len(d["checks"]) >= 6 and all(c["status"] in ("ok", "note") for c in d["checks"]) and d["checks"][3]["count"] == 1 and "error" not in d'; then
  passes=$((passes + 1))
else
  echo "FAIL doctor-json: unexpected report:"; echo "$out"; fails=$((fails + 1))
fi
[ $rc -eq 0 ] || { echo "FAIL doctor --json exited $rc"; fails=$((fails + 1)); }
kill $serve; wait $serve 2>/dev/null
out=$("$FERRY" doctor "$name" --timeout 1000 2>&1); rc=$?
check doctor-dead "FAIL +connect and handshake"
check doctor-dead-explained "SOCKET \(-102\).*retryable"
check doctor-dead-advice "What to do"
[ $rc -eq 1 ] || { echo "FAIL doctor on a dead peer exited $rc"; fails=$((fails + 1)); }
out=$("$FERRY" doctor "$name" --timeout 1000 --json 2>&1); rc=$?
if json_check "$out" 'not d["ok"] and d["checks"][0]["status"] == "fail" and d["checks"][0]["error"] == "SOCKET" and d["checks"][0]["retryable"] and "What to do" in d["checks"][0]["advice"] and d["error"] == {"code": -102, "name": "SOCKET", "detail": d["checks"][0]["message"]}'; then
  passes=$((passes + 1))
else
  echo "FAIL doctor-json-dead: unexpected report:"; echo "$out"; fails=$((fails + 1))
fi
[ $rc -eq 1 ] || { echo "FAIL doctor --json on a dead peer exited $rc"; fails=$((fails + 1)); }
out=$("$FERRY" doctor "no.such.host.invalid:7" 2>&1); check doctor-dns "DNS \(-101\)"
# cluster node: a mesh engine (decode and prefill) needs the peers it asks.
out=$("$FERRY" cluster node --role mesh --index 0 --host 127.0.0.1 --port 7 --dir /tmp 2>&1); rc=$?
check cluster-mesh-no-peers "cluster node: missing or bad option"
check cluster-mesh-usage "usage: ferry cluster node --role prefill\|decode\|mesh\|probe"
[ $rc -eq 2 ] || { echo "FAIL cluster node --role mesh without --peers exited $rc"; fails=$((fails + 1)); }
# metabench: option checks, an unreachable service, and (with the suite's services) a short run.
out=$("$FERRY" metabench --seconds 1 2>&1); rc=$?; check metabench-no-metadata "usage: ferry metabench"
[ $rc -eq 2 ] || { echo "FAIL metabench without --metadata exited $rc"; fails=$((fails + 1)); }
out=$("$FERRY" metabench --metadata p2p 2>&1); rc=$?; check metabench-p2p "p2p stores nothing"
[ $rc -eq 2 ] || { echo "FAIL metabench --metadata p2p exited $rc"; fails=$((fails + 1)); }
out=$("$FERRY" metabench --metadata etcd://127.0.0.1:1 2>&1); rc=$?; check metabench-down "127.0.0.1:1"
[ $rc -eq 1 ] || { echo "FAIL metabench on a dead service exited $rc"; fails=$((fails + 1)); }
for svc in ${FERRY_TEST_ETCD:+etcd://$FERRY_TEST_ETCD} ${FERRY_TEST_REDIS:+redis://$FERRY_TEST_REDIS}; do
  out=$("$FERRY" metabench --metadata "$svc" --seconds 0.3 --clients 2 --engines 8,64 2>&1); rc=$?
  check "metabench-$svc" "served: [0-9]+ lookups/s \(0 failed\), [0-9]+ lease keepalives/s \(0 failed\)"
  check "metabench-table-$svc" "^ +64 +19\.2 +3\.3 +403\.2 +22\.5"
  [ $rc -eq 0 ] || { echo "FAIL metabench on $svc exited $rc"; fails=$((fails + 1)); }
done
echo "cli: $passes passed, $fails failed"
[ $fails -eq 0 ]
