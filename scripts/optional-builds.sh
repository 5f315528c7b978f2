#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Optional builds that must keep compiling (scripts/test.sh, "optional builds"):
#   1. -DFERRY_WITH_CUDA=OFF (scripts/ci_cuda.sh; CUDA support is in the
#      default build, tested there over a stub driver), with its tests;
#   2. -DFERRY_WITH_RDMA=OFF: the library without the verbs code, and the
#      RDMA tests that must then say "not built" and fall back to TCP.
# OPTIONAL_BUILD_ONLY=1: compile both, run nothing (scripts/test.sh builds
# ahead so while other stages' tests run; a later run then only tests).
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
ok=0; failed=0
run() { local name=$1; shift; echo "--- $name"; if "$@"; then ok=$((ok + 1)); else failed=$((failed + 1)); echo "--- $name: FAILED"; fi; }

no_rdma() {
  cmake -S . -B build-nordma -DFERRY_WITH_RDMA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || return 1
  cmake --build build-nordma -j "$JOBS" --target test_rdma_probe test_rdma_fake test_rdma_group test_rdma_wire test_memkind 2>&1 \
    | grep -E "error:|warning:|Error [0-9]"
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  ctest --test-dir build-nordma --output-on-failure -R '^(test_rdma_probe|test_rdma_fake|test_rdma_group|test_rdma_wire|test_memkind)$'
}

if [ "${OPTIONAL_BUILD_ONLY:-0}" = 1 ]; then
  # The configuration scripts/ci_cuda.sh and no_rdma use, and their targets.
  cmake -S . -B build-nocuda -DFERRY_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build build-nocuda -j "$JOBS" --target test_cuda test_memkind test_transfer >/dev/null
  a=$?
  cmake -S . -B build-nordma -DFERRY_WITH_RDMA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build build-nordma -j "$JOBS" --target test_rdma_probe test_rdma_fake test_rdma_group test_rdma_wire test_memkind >/dev/null
  b=$?
  [ "$a" -eq 0 ] && [ "$b" -eq 0 ]; exit
fi
run "build without CUDA (FERRY_WITH_CUDA=OFF)" env JOBS="$JOBS" scripts/ci_cuda.sh build-nocuda
run "build without RDMA (FERRY_WITH_RDMA=OFF)" no_rdma
echo "optional builds: $ok passed, $failed failed"
[ "$failed" -eq 0 ]
