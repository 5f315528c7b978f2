#!/usr/bin/env bash
# CI step: Ferry must compile with -DFERRY_WITH_CUDA=ON. Builds in
# build-cuda and runs the tests that need no GPU (test_cuda, the memory-kind
# staging tests, and a plain transfer suite against the CUDA-linked library).
# Without a CUDA toolkit on the machine the step is skipped, with a message,
# and succeeds. Usage: scripts/ci_cuda.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda}
JOBS=${JOBS:-2}
ROOT=${CUDAToolkit_ROOT:-${CUDA_HOME:-/usr/local/cuda}}
NVCC=""
if [ -x "$ROOT/bin/nvcc" ]; then NVCC="$ROOT/bin/nvcc"; elif command -v nvcc >/dev/null 2>&1; then NVCC=$(command -v nvcc); ROOT=$(dirname "$(dirname "$NVCC")"); fi
if [ -z "$NVCC" ] || [ ! -f "$ROOT/include/cuda_runtime_api.h" ]; then
  echo "ci-cuda: SKIPPED: no CUDA toolkit here (looked for nvcc and cuda_runtime_api.h under $ROOT and in PATH)"
  exit 0
fi
echo "ci-cuda: toolkit $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') at $ROOT"
cmake -S . -B "$BUILD" -DFERRY_WITH_CUDA=ON -DCUDAToolkit_ROOT="$ROOT" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "$JOBS"
ctest --test-dir "$BUILD" --output-on-failure -R '^(test_cuda|test_memkind|test_transfer|test_rdma_wire)$'
