#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds Ferry's libFuzzer targets with clang (ASan + UBSan) and runs each
# for a bounded time, starting from the seed corpus the targets make.
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
# Defaults: $FUZZ_SECONDS or 30 s each; targets wire, handshake, initiator, session, meta, rdma_group.
# Environment:
#   FUZZ_BUILD (build-fuzz), FUZZ_JOBS (2: the build's jobs, and how many
#   targets fuzz at once), FUZZ_CORPUS (build dir/corpus), FUZZ_BUILD_ONLY
#   (1: build the targets, fuzz nothing; scripts/test.sh builds ahead so).
# Exit status: 0 when no target found a crash, leak or timeout; else 1, and
# the reproducer lies in $FUZZ_BUILD/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-${FUZZ_SECONDS:-30}}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(wire handshake initiator session meta rdma_group)
BUILD=${FUZZ_BUILD:-build-fuzz}
JOBS=${FUZZ_JOBS:-2}
CC_BIN=${CC:-}
if [ -z "$CC_BIN" ] || ! "$CC_BIN" --version 2>/dev/null | grep -q clang; then
  CC_BIN=$(command -v clang-14 || command -v clang || true)
fi
[ -n "$CC_BIN" ] || { echo "fuzz: clang not found (apt-get install clang libclang-rt-14-dev)"; exit 2; }

CC="$CC_BIN" cmake -S . -B "$BUILD" -DFERRY_FUZZ=ON -DFERRY_SANITIZE=address -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFERRY_WITH_ETCD=ON -DFERRY_WITH_REDIS=OFF -DFERRY_WITH_RDMA=OFF >/dev/null
build_targets=()
for t in "${TARGETS[@]}"; do build_targets+=("fuzz_$t" "fuzz_${t}_replay"); done
cmake --build "$BUILD" -j "$JOBS" --target "${build_targets[@]}" >/dev/null
[ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && exit 0

# Leaks are checked per input by libFuzzer; UBSan findings abort.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
# Each target fuzzes on one core: FUZZ_JOBS of them at once, each its full
# SECS (the same executions per target as one at a time), its result printed
# when it ends.
fuzz_one() { # TARGET
  local t=$1 corpus=${FUZZ_CORPUS:-$BUILD/corpus}/$1 artifacts=$BUILD/artifacts/$1
  mkdir -p "$corpus" "$artifacts"
  "$BUILD/tests/fuzz_${t}_replay" --write-seeds "$corpus"
  echo "fuzz: $t for ${SECS}s (corpus $corpus)"
  # -rss_limit_mb / -malloc_limit_mb: an input that makes the code allocate
  # by what a peer claims fails here. -timeout: one that makes it hang.
  if ! "$BUILD/tests/fuzz_$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=1024 -malloc_limit_mb=256 \
       -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" \
       >"$BUILD/fuzz_$t.log" 2>&1; then
    echo "fuzz: $t FAILED; see $BUILD/fuzz_$t.log and $artifacts/"
    tail -n 40 "$BUILD/fuzz_$t.log"
    return 1
  fi
  grep -E "stat::number_of_executed_units|cov:" "$BUILD/fuzz_$t.log" | tail -n 2 | sed "s/^/fuzz: $t: /" || true
}
status=0
running=0
for t in "${TARGETS[@]}"; do
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || status=1
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || status=1
  running=$((running - 1))
done
exit $status
