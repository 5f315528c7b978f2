#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CI step: CUDA support is in the default build (FERRY_WITH_CUDA=ON: the
# driver API is dlopen'ed at run time, nothing from CUDA is needed to build),
# where test_cuda runs it over a stub driver. This step checks the other
# side: -DFERRY_WITH_CUDA=OFF still compiles, and its memory-kind tests pass
# (test_cuda is then a skip). Usage: scripts/ci_cuda.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-nocuda}
JOBS=${JOBS:-2}
cmake -S . -B "$BUILD" -DFERRY_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target test_cuda test_memkind test_transfer
ctest --test-dir "$BUILD" --output-on-failure -R '^(test_cuda|test_memkind|test_transfer)$'
