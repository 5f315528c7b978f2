#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite, as `make test` and CI run it:
#   1. ASan+UBSan build, every ctest test (etcd and Redis started for them)
#   2. TSan build, the threaded tests
#   3. Python binding tests against a release build
#   4. optional builds that must compile (CUDA), and bounded fuzzing
# Each stage prints its own summary; the last line counts stages passed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
STAGES_OK=0
STAGES_FAILED=0
FAILED_NAMES=()

scripts/deps.sh || { echo "test: installing dependencies failed"; exit 1; }

SVC=$(mktemp -d /tmp/ferry-svc.XXXXXX)
cleanup() { scripts/services.sh stop "$SVC" >/dev/null 2>&1; rm -rf "$SVC"; }
trap cleanup EXIT
if ! scripts/services.sh start "$SVC"; then
  echo "test: could not start etcd/redis for the metadata tests"; exit 1
fi
set -a; . "$SVC/services.env"; set +a

stage() { # stage NAME COMMAND...
  local name=$1; shift
  echo "=== $name"
  local t0=$SECONDS
  if "$@"; then
    STAGES_OK=$((STAGES_OK + 1)); echo "=== $name: ok ($((SECONDS - t0)) s)"
  else
    STAGES_FAILED=$((STAGES_FAILED + 1)); FAILED_NAMES+=("$name"); echo "=== $name: FAILED ($((SECONDS - t0)) s)"
  fi
}

configure_build() { # DIR CMAKE_ARGS...
  local dir=$1; shift
  cmake -S . -B "$dir" "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j "$JOBS" 2>&1 | grep -E "error:|warning:|Error [0-9]" ; return "${PIPESTATUS[0]}"
}

asan() {
  mkdir -p build-asan
  configure_build build-asan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=address || return 1
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure --timeout 300)
}

tsan() {
  mkdir -p build-tsan
  configure_build build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_SANITIZE=thread || return 1
  # TSan runs the tests whose code is threaded; pure parsers gain nothing from it.
  (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$ROOT/tests/tsan.supp" \
     ctest --output-on-failure --timeout 600 -LE no-tsan)
}

release() {
  mkdir -p build
  configure_build build -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON
}

python_tests() {
  [ -d bindings/python/tests ] || { echo "no Python tests yet"; return 0; }
  FERRY_LIBRARY="$ROOT/build/libferry.so" PYTHONPATH="$ROOT/bindings/python" \
    /usr/bin/python3 -m unittest discover -s bindings/python/tests -v 2>&1 | tail -n 40
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  # pip install of the package, the library from `cmake --install`.
  tests/install/check_python_package.sh build /usr/bin/python3
}

optional_builds() {
  [ -x scripts/optional-builds.sh ] || { echo "no optional builds defined"; return 0; }
  scripts/optional-builds.sh
}

fuzz() {
  [ -x scripts/fuzz.sh ] || { echo "no fuzz targets yet"; return 0; }
  FUZZ_SECONDS=${FUZZ_SECONDS:-20} scripts/fuzz.sh
}

stage "asan+ubsan ctest" asan
stage "tsan ctest" tsan
stage "release build" release
stage "python tests" python_tests
stage "optional builds" optional_builds
stage "fuzz" fuzz

echo
if [ "$STAGES_FAILED" -gt 0 ]; then echo "failed stages: ${FAILED_NAMES[*]}"; fi
echo "suite: $STAGES_OK passed, $STAGES_FAILED failed"
[ "$STAGES_FAILED" -eq 0 ]
