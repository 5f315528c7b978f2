#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ferry bench end to end, briefly (a smoke test, not a measurement): every
# mode runs, JSON comes out, the transport chosen is named, bad options fail.
set -uo pipefail
FERRY=$1
fails=0; passes=0
check() { # check NAME REGEX: $out must match
  if grep -qE -- "$2" <<<"$out"; then passes=$((passes + 1)); else echo "FAIL $1: wanted /$2/ in:"; echo "$out"; fails=$((fails + 1)); fi
}
json_ok() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if eval(sys.argv[2]) else 1)' "$1" "$2" 2>/dev/null; }
q="--duration 0.2 --warmup 0.05"
out=$("$FERRY" bench --local $q --block-size 64K --batch-size 4 --blocks 2 --json 2>&1)
check local-json '"blocks":2,.*"gb_per_s":[0-9.]+,.*"ok":true'
check local-shm '"transport":"shm"'
check local-lat '"lat_us":\{"p50":[0-9.]+,"p99":[0-9.]+,"p999"'
check local-cpu '"cpu_cores":\{"initiator":[0-9.]+,"target":[0-9.]+\}'
out=$("$FERRY" bench --local $q --transport tcp --op read --block-size 8 --threads 2 2>&1)
check local-tcp "transport +tcp \(forced by config"
check local-text "latency +per call: p50 .* p99 .* p999"
out=$(FERRY_SHM_DISABLE=1 "$FERRY" bench --local $q --block-size 1M --json 2>/dev/null)
check fallback '"transport":"tcp","transport_reason":"shm refused by the target: cross-memory attach disabled'
for b in memcpy memfd cma; do
  out=$("$FERRY" bench baseline $b $q --block-size 1M --json 2>&1); check baseline-$b '"gb_per_s":[0-9.]+,.*"ok":true'
done
out=$("$FERRY" bench extras --regions 500 --sessions 3 --idle 0.1 --json 2>&1)
check extras '"regions":500.*"sessions":3.*"idle_cpu_initiator"'
tmp=$(mktemp -d); trap 'kill $tgt $bg 2>/dev/null; rm -rf "$tmp"' EXIT
bg=""
"$FERRY" bench target --port 0 --buffer-size 4M --duration 20 >"$tmp/t.json" 2>"$tmp/t.err" & tgt=$!
for _ in $(seq 50); do [ -s "$tmp/t.json" ] && break; sleep 0.1; done
read -r name addr len port < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["name"], d["addr"], d["len"], d["port"])' "$tmp/t.json")
out=$(cat "$tmp/t.json"); check target-ready '^\{"name":"0\.0\.0\.0:[0-9]+","addr":[0-9]+,"len":4194304,"pid":[0-9]+,"epoch":"[0-9a-f]{16}","port":[0-9]+,"metrics_port":null\}$'
out=$(cat "$tmp/t.err"); check target-listening "serving 4 MiB on 0\.0\.0\.0:$port \(all interfaces\)"
# The initiator finds the target's buffer through the handshake: no address copied.
out=$("$FERRY" bench initiator --peer "127.0.0.1:$port" $q --block-size 1M --batch-size 4 --interval 0 2>&1)
check initiator "throughput +[0-9.]+ GB/s"
out=$("$FERRY" bench initiator --peer "127.0.0.1:$port" $q --block-size 1M --check --json 2>&1)
check initiator-check '"check":\{"ok":true'
# --remote-addr/--remote-len still override (the buffer's second half).
out=$("$FERRY" bench initiator --peer "$name" --remote-addr $((addr + len / 2)) --remote-len $((len / 2)) $q --block-size 2M --interval 0 2>&1)
check initiator-override "throughput +[0-9.]+ GB/s"
out=$("$FERRY" bench initiator --peer "127.0.0.1:$port" $q --block-size 4M --batch-size 2 2>&1); rc=$?
check too-big "exceed the remote buffer \(4194304\)"
[ $rc -ne 0 ] || { echo "FAIL too-big exited 0"; fails=$((fails + 1)); }
kill $tgt; wait $tgt 2>/dev/null
# --json on failure: one {"error": {code, name, detail}} object on stdout.
out=$("$FERRY" bench initiator --peer 127.0.0.1:1 $q --json 2>/dev/null); rc=$?
check json-error '^\{"error":\{"code":-10[0-9],"name":"[A-Z_]+","detail":".*127\.0\.0\.1:1'
[ $rc -eq 1 ] || { echo "FAIL initiator to a dead port exited $rc"; fails=$((fails + 1)); }
# ... and for a bad option too (exit 2).
out=$("$FERRY" bench --local --json --block-size nan 2>/dev/null); rc=$?
check json-error-option '^\{"error":\{"code":-1,"name":"INVALID_ARGUMENT","detail":"ferry bench: --block-size .nan. is not a size'
[ $rc -eq 2 ] || { echo "FAIL --json --block-size nan exited $rc"; fails=$((fails + 1)); }
# A transport asked for but unusable fails; it is not TCP measured under its name.
out=$("$FERRY" bench --local $q --transport rdma --json 2>/dev/null); rc=$?
if grep -q '"transport":"rdma"' <<<"$out"; then
  passes=$((passes + 1)) # RDMA works here
else
  check rdma-refused '^\{"error":\{"code":-303,"name":"NOT_IMPLEMENTED","detail":"transport rdma was asked for but cannot be used'
  [ $rc -eq 1 ] || { echo "FAIL --transport rdma exited $rc"; fails=$((fails + 1)); }
fi
# Sizes: nan, inf, negative, zero and overflow are refused by name, before any allocation.
for v in nan inf -1 0 1e300 99999999999999999999G; do
  out=$("$FERRY" bench --local --block-size "$v" 2>&1); rc=$?
  check "size-$v" "--block-size '$v' is not a size"
  [ $rc -eq 2 ] || { echo "FAIL --block-size $v exited $rc"; fails=$((fails + 1)); }
done
# --check: verifies the bytes; a flipped byte (the test hook) fails the run.
for op in write read; do
  out=$("$FERRY" bench --local $q --op $op --block-size 4K --batch-size 9 --scatter --check --json 2>&1)
  check "check-scatter-$op" '"check":\{"ok":true,"detail":""\}'
done
for op in write read; do
  out=$("$FERRY" bench --local $q --op $op --block-size 64K --batch-size 4 --check --json 2>&1)
  check "check-$op" '"check":\{"ok":true,"detail":""\},"interrupted":false,"ok":true'
  out=$(FERRY_BENCH_TEST_CORRUPT=70000 "$FERRY" bench --local $q --op $op --block-size 64K --batch-size 4 --check 2>&1); rc=$?
  check "check-corrupt-$op" "check failed: byte 70000 \(block 1, offset 4464\)"
  [ $rc -eq 1 ] || { echo "FAIL corrupted --check $op exited $rc"; fails=$((fails + 1)); }
done
# --sweep: CSV (a header and a row a point), JSON lines, and the SVG plot.
out=$("$FERRY" bench --local --sweep --block-size 4K,64K --batch-size 1,4 --duration 0.05 --warmup 0.01 --csv 2>&1)
check sweep-csv-header '^block_size_bytes,batch_size,threads,seconds,bytes,calls,gb_per_s,req_per_s,lat_p50_us'
[ "$(grep -cE '^(4096|65536),(1|4),1,' <<<"$out")" -eq 4 ] && passes=$((passes + 1)) || { echo "FAIL sweep-csv rows:"; echo "$out"; fails=$((fails + 1)); }
out=$("$FERRY" bench --local --sweep --block-size 4K,64K --batch-size 2 --duration 0.05 --warmup 0.01 --json --plot "$tmp/s.svg" 2>/dev/null)
[ "$(grep -c '"gb_per_s"' <<<"$out")" -eq 2 ] && passes=$((passes + 1)) || { echo "FAIL sweep-json:"; echo "$out"; fails=$((fails + 1)); }
out=$(cat "$tmp/s.svg" 2>&1)
check plot-x-label '>block size \(bytes per request, log scale\)</text>'
check plot-y-label '>throughput \(GB/s, 1 GB = 10\^9 bytes\)</text>'
check plot-ticks '>4 KiB</text>.*|>64 KiB</text>'
check plot-legend '>batch 2</text>'
[ "$(grep -c '<polyline' <<<"$out")" -eq 1 ] && passes=$((passes + 1)) || { echo "FAIL plot: not one line"; fails=$((fails + 1)); }
python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' "$tmp/s.svg" && passes=$((passes + 1)) || { echo "FAIL plot is not XML"; fails=$((fails + 1)); }
out=$("$FERRY" bench --local --block-size 4K,64K 2>&1); rc=$?
check list-needs-sweep "go with --sweep"
[ $rc -eq 2 ] || { echo "FAIL a list without --sweep exited $rc"; fails=$((fails + 1)); }
# Progress lines every --interval, and SIGINT: the summary so far, exit 0.
out=$("$FERRY" bench --local --duration 0.7 --warmup 0.05 --interval 0.2 --block-size 64K 2>&1)
[ "$(grep -cE '^\[ *[0-9.]+- *[0-9.]+ s\] +[0-9.]+ GB/s +[0-9]+ calls/s$' <<<"$out")" -ge 3 ] && passes=$((passes + 1)) || { echo "FAIL interval lines:"; echo "$out"; fails=$((fails + 1)); }
"$FERRY" bench --local --duration 30 --warmup 0.05 --interval 0.2 --block-size 64K >"$tmp/int.out" 2>&1 & bg=$!
for _ in $(seq 100); do grep -q 'GB/s' "$tmp/int.out" && break; sleep 0.1; done
t0=$SECONDS; kill -INT $bg; wait $bg; rc=$?; bg=""
out=$(cat "$tmp/int.out")
check sigint-summary "\(interrupted: the summary so far\)"
check sigint-throughput "throughput +[0-9.]+ GB/s"
[ $rc -eq 0 ] && [ $((SECONDS - t0)) -le 5 ] || { echo "FAIL SIGINT: exit $rc after $((SECONDS - t0)) s"; fails=$((fails + 1)); }
# The forked --local target dies with its initiator, however that ends.
"$FERRY" bench --local --duration 30 >/dev/null 2>&1 & bg=$!
child=""
for _ in $(seq 100); do child=$(pgrep -P $bg | head -1); [ -n "$child" ] && break; sleep 0.05; done
sleep 0.3
kill -9 $bg; wait $bg 2>/dev/null; bg=""
for _ in $(seq 40); do kill -0 "$child" 2>/dev/null || break; sleep 0.05; done
if [ -n "$child" ] && ! kill -0 "$child" 2>/dev/null; then passes=$((passes + 1)); else
  echo "FAIL the --local target ($child) outlived its killed initiator"; kill -9 "$child" 2>/dev/null; fails=$((fails + 1)); fi
# Default address and port: every interface, 7070 (skipped when 7070 is taken).
if ! (ss -ltn 2>/dev/null | grep -q ':7070 '); then
  "$FERRY" bench target --buffer-size 1M --duration 5 >"$tmp/d.json" 2>/dev/null & tgt=$!
  for _ in $(seq 50); do [ -s "$tmp/d.json" ] && break; sleep 0.1; done
  out=$(cat "$tmp/d.json"); check default-port '"name":"0\.0\.0\.0:7070".*"port":7070'
  out=$("$FERRY" bench initiator --peer 127.0.0.1 $q --block-size 64K --interval 0 2>&1)
  check default-peer-port "to 127\.0\.0\.1:7070"
  kill $tgt; wait $tgt 2>/dev/null
fi
# bench-completion: progress lines, and SIGINT prints the figures so far (JSON: "interrupted": true), exit 130.
"$FERRY" bench-completion --regions 2000 --ops 50 --idle-s 0.3 --interval 0.2 --json >"$tmp/bc.json" 2>"$tmp/bc.err" & bg=$!
for _ in $(seq 100); do grep -q 'wait modes, ' "$tmp/bc.err" && break; sleep 0.1; done
kill -INT $bg; wait $bg; rc=$?; bg=""
out=$(cat "$tmp/bc.err")
check completion-progress '^\[ +[0-9.]+ s\] bench-completion: (idle CPU|wait modes|cancel latency)'
check completion-interrupted "bench-completion: interrupted \(SIGINT\) during .* the figures so far:"
check completion-figures "^  wait_blocking_p50_us +[0-9.]+"
out=$(cat "$tmp/bc.json")
if json_ok "$out" 'd["interrupted"] and "wait_blocking_p50_us" in d and d["interrupted_during"]'; then passes=$((passes + 1)); else
  echo "FAIL completion-json: $out"; fails=$((fails + 1)); fi
[ $rc -eq 130 ] || { echo "FAIL bench-completion after SIGINT exited $rc"; fails=$((fails + 1)); }
for sub in target initiator extras "baseline"; do
  out=$("$FERRY" bench $sub -h 2>/dev/null); rc=$?
  check "help-bench-$sub" "usage: ferry bench"
  [ $rc -eq 0 ] || { echo "FAIL bench $sub -h exited $rc"; fails=$((fails + 1)); }
done
out=$("$FERRY" bench --local --op sideways 2>&1); rc=$?
check bad-op "--op is write or read"
[ $rc -eq 2 ] || { echo "FAIL bad op exited $rc"; fails=$((fails + 1)); }
echo "bench cli: $passes passed, $fails failed"
[ $fails -eq 0 ]
