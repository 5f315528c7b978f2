#!/usr/bin/env bash
# ferry bench end to end, briefly (a smoke test, not a measurement): every
# mode runs, JSON comes out, the transport chosen is named, bad options fail.
set -uo pipefail
FERRY=$1
fails=0; passes=0
check() { # check NAME REGEX: $out must match
  if grep -qE -- "$2" <<<"$out"; then passes=$((passes + 1)); else echo "FAIL $1: wanted /$2/ in:"; echo "$out"; fails=$((fails + 1)); fi
}
q="--duration 0.2 --warmup 0.05"
out=$("$FERRY" bench --local $q --block-size 64K --batch-size 4 --blocks 2 --json 2>&1)
check local-json '"blocks":2,.*"ok":true'
check local-shm '"transport":"shm"'
check local-lat '"lat_us":\{"p50":[0-9.]+,"p99":[0-9.]+,"p999"'
out=$("$FERRY" bench --local $q --transport tcp --op read --block-size 8 --threads 2 2>&1)
check local-tcp "transport +tcp \(forced by config"
check local-text "latency +per call: p50 .* p99 .* p999"
out=$(FERRY_SHM_DISABLE=1 "$FERRY" bench --local $q --block-size 1M --json 2>/dev/null)
check fallback '"transport":"tcp","transport_reason":"shm refused by the target: cross-memory attach disabled'
for b in memcpy memfd cma; do
  out=$("$FERRY" bench baseline $b $q --block-size 1M --json 2>&1); check baseline-$b '"ok":true'
done
out=$("$FERRY" bench extras --regions 500 --sessions 3 --idle 0.1 --json 2>&1)
check extras '"regions":500.*"sessions":3.*"idle_cpu_initiator"'
tmp=$(mktemp -d); trap 'kill $tgt 2>/dev/null; rm -rf "$tmp"' EXIT
"$FERRY" bench target --buffer-size 4M --duration 20 >"$tmp/t.json" & tgt=$!
for _ in $(seq 50); do [ -s "$tmp/t.json" ] && break; sleep 0.1; done
read -r name addr len < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["name"], d["addr"], d["len"])' "$tmp/t.json")
out=$("$FERRY" bench initiator --peer "$name" --remote-addr "$addr" --remote-len "$len" $q --block-size 1M --batch-size 4 2>&1)
check initiator "throughput +[0-9.]+ GB/s"
out=$("$FERRY" bench initiator --peer "$name" --remote-addr "$addr" --remote-len "$len" $q --block-size 4M --batch-size 2 2>&1); rc=$?
check too-big "exceed the remote buffer"
[ $rc -ne 0 ] || { echo "FAIL too-big exited 0"; fails=$((fails + 1)); }
out=$("$FERRY" bench --local --op sideways 2>&1); rc=$?
check bad-op "--op is write or read"
[ $rc -eq 2 ] || { echo "FAIL bad op exited $rc"; fails=$((fails + 1)); }
echo "bench cli: $passes passed, $fails failed"
[ $fails -eq 0 ]
