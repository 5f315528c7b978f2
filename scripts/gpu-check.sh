#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Ferry on a real GPU (issue 24): one prepared check for a machine with an
# NVIDIA GPU, its driver, and PyTorch with CUDA, but no package registry and
# no compiler needed. The build is made elsewhere and carried there:
#
#   scripts/gpu-check.sh --build [DIR]   here: a Release build in DIR
#                                        (default build-gpu) with the optional
#                                        libraries off (RDMA, etcd, Redis, HTTP
#                                        metadata, metrics HTTP, ISA-L), and the
#                                        non-system libraries it needs copied
#                                        into DIR/gpu-libs
#   scripts/gpu-check.sh [DIR]           there: the check (under 8 minutes)
#
# The check: `ldd` finds every library of libferry.so and the test programs
# (with DIR/gpu-libs); the CUDA C tests run (test_cuda, test_cuda_ipc: the stub
# driver, so the carried programs are proven to run there); then
# scripts/gpu_check.py against the real driver, with torch: SUPPORT_CUDA and
# device_memory_supported() true, torch.cuda tensors registered by
# data_ptr() as cuda:N, moved between two processes on one GPU through the
# CUDA IPC transport and through TCP with staging, every byte verified on
# the device, GB/s printed beside torch's own device-to-device and
# device-to-host copy rates measured in the same run.
#
# Without a GPU (no nvidia-smi, no device, or no torch.cuda) it prints why
# and exits 0: "gpu-check: SKIPPED: ..." (ctest gpu_check_skips runs that,
# naming a missing program as NVIDIA_SMI, the nvidia-smi to use).
# Exit status otherwise: 0 all passed, 1 a check failed, 2 usage or a
# missing build.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)

build_here() {
    local dir=$1
    cmake -S "$here" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON \
        -DFERRY_WITH_RDMA=OFF -DFERRY_WITH_ETCD=OFF -DFERRY_WITH_REDIS=OFF -DFERRY_WITH_HTTP_META=OFF \
        -DFERRY_WITH_HTTP=OFF -DFERRY_WITH_ISAL=OFF -DFERRY_WITH_CUDA=ON >/dev/null || return 1
    cmake --build "$dir" -j"$(nproc)" --target ferry_shared test_cuda test_cuda_ipc cuda_stub cuda_stub_partial ||
        return 1
    # Libraries outside the C library's own set travel with the build.
    mkdir -p "$dir/gpu-libs"
    local f lib
    for f in "$dir"/libferry.so "$dir"/tests/test_cuda "$dir"/tests/test_cuda_ipc; do
        ldd "$f" | awk '/=> \//{print $3}' | while read -r lib; do
            case "$(basename "$lib")" in
            libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libgcc_s.so*) ;;
            *) cp -L "$lib" "$dir/gpu-libs/" ;;
            esac
        done
    done
    echo "gpu-check: built $dir (carry it, with $dir/gpu-libs, to the GPU machine's checkout)"
}

if [ "${1:-}" = "--build" ]; then
    build_here "${2:-build-gpu}"
    exit $?
fi
dir=${1:-build-gpu}
case "$dir" in /*) ;; *) dir="$here/$dir" ;; esac

skip() {
    echo "gpu-check: SKIPPED: $*"
    echo "gpu-check: nothing ran on a GPU (docs/RDMA_AND_GPU.md says what has)"
    exit 0
}

# ------------------------------------------------------------ a GPU here?
smi=${NVIDIA_SMI:-nvidia-smi}
if ! command -v "$smi" >/dev/null 2>&1; then
    skip "no NVIDIA driver on this machine ($smi not found)"
fi
if ! gpus=$("$smi" -L 2>&1) || [ -z "$gpus" ]; then
    skip "nvidia-smi lists no GPU: $gpus"
fi
python=${PYTHON:-python3}
if ! why=$("$python" -c 'import torch, sys; sys.exit(0) if torch.cuda.is_available() else sys.exit("torch.cuda.is_available() is False")' 2>&1); then
    skip "no usable torch.cuda: $(echo "$why" | tail -1)"
fi
echo "gpu-check: $gpus"
"$python" -c 'import torch; print("gpu-check: torch", torch.__version__, "CUDA", torch.version.cuda)'

if [ ! -e "$dir/libferry.so" ]; then
    echo "gpu-check: no build at $dir: run scripts/gpu-check.sh --build $dir where Ferry builds, and carry it" >&2
    exit 2
fi
export LD_LIBRARY_PATH="$dir/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
failed=0
check() { # name, command...
    local name=$1
    shift
    local t0=$SECONDS
    if "$@"; then
        echo "gpu-check: PASS $name ($((SECONDS - t0)) s)"
    else
        echo "gpu-check: FAIL $name ($((SECONDS - t0)) s)"
        failed=1
    fi
}

# ------------------------------------------------------ the carried build
ldd_ok() {
    local f out
    for f in "$dir/libferry.so" "$dir/tests/test_cuda" "$dir/tests/test_cuda_ipc"; do
        out=$(ldd "$f" 2>&1) || { echo "$out"; return 1; }
        if echo "$out" | grep -q "not found"; then
            echo "$f:"; echo "$out" | grep "not found"
            return 1
        fi
    done
}
check "ldd: every library found" ldd_ok
check "test_cuda (stub driver)" env FERRY_CUDA_STUB="$dir/tests/libcuda_stub.so" \
    FERRY_CUDA_STUB_PARTIAL="$dir/tests/libcuda_stub_partial.so" timeout 120 "$dir/tests/test_cuda"
check "test_cuda_ipc (stub driver, two processes)" env FERRY_CUDA_STUB="$dir/tests/libcuda_stub.so" \
    timeout 120 "$dir/tests/test_cuda_ipc"

# ---------------------------------------------------------- the real driver
check "torch.cuda tensors between two processes (gpu_check.py)" env FERRY_LIBRARY="$dir/libferry.so" \
    PYTHONPATH="$here/bindings/python${PYTHONPATH:+:$PYTHONPATH}" timeout 360 "$python" "$here/scripts/gpu_check.py"

if [ $failed -ne 0 ]; then
    echo "gpu-check: FAILED"
    exit 1
fi
echo "gpu-check: all passed"
