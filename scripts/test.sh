#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite, as `make test` and CI run it:
#   1. ASan+UBSan build, every ctest test (etcd and Redis started for them)
#   2. TSan build, the threaded tests
#   3. Python binding tests against a release build
#   4. optional builds that must compile (CUDA), and bounded fuzzing
# Each stage prints its own summary; the last line counts stages passed.
# The ctest stages run CTEST_JOBS (2) tests at once: most wait on sockets and
# deadlines; tests that cannot share the machine say so (RUN_SERIAL,
# RESOURCE_LOCK in tests/*.cmake). While the ASan tests run, the builds of
# the later stages (TSan, release, fuzz, optional) go on in the background at
# nice 19, so they take only the CPU the tests leave idle; each stage then
# waits for its build and shows its errors.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
CTEST_JOBS=${CTEST_JOBS:-2}
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
  # shellcheck disable=SC2086 # BUILD_TARGETS: a list of names, or empty for all
  cmake --build "$dir" -j "$JOBS" ${BUILD_TARGETS:+--target $BUILD_TARGETS} 2>&1 | grep -E "error:|warning:|Error [0-9]" ; return "${PIPESTATUS[0]}"
}

# The later stages' builds, one after the other, in the background at the
# lowest priority; each writes build-stages/NAME.log and NAME.rc.
PREBUILD_PID=
prebuild_one() { # NAME COMMAND...
  local name=$1; shift
  "$@" >"build-stages/$name.log" 2>&1; echo $? >"build-stages/$name.rc"
}
prebuild_all() {
  mkdir -p build-tsan build
  prebuild_one tsan configure_build build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_SANITIZE=thread
  # The release build serves the Python stage: the library and the CLI (what
  # `cmake --install` installs). Its tests would be the TSan stage's test
  # sources compiled again with optimisation; the TSan build (-O2) has them.
  BUILD_TARGETS="ferry ferry_shared ferry_cli" \
    prebuild_one release configure_build build -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON
  [ -x scripts/fuzz.sh ] && prebuild_one fuzz env FUZZ_BUILD_ONLY=1 scripts/fuzz.sh
  [ -x scripts/optional-builds.sh ] && prebuild_one optional env OPTIONAL_BUILD_ONLY=1 scripts/optional-builds.sh
  return 0
}
prebuild_start() {
  rm -rf build-stages; mkdir -p build-stages
  ( nice -n 19 bash -c "$(declare -f configure_build prebuild_one prebuild_all); JOBS=$JOBS; prebuild_all" ) &
  PREBUILD_PID=$!
}
prebuild_wait() { # NAME: waits for that build, prints its log, returns its status
  local name=$1
  while [ ! -f "build-stages/$name.rc" ]; do
    if [ -z "$PREBUILD_PID" ] || ! kill -0 "$PREBUILD_PID" 2>/dev/null; then
      [ -f "build-stages/$name.rc" ] && break
      echo "test: the background build ($name) did not finish"; return 1
    fi
    sleep 1
  done
  cat "build-stages/$name.log"
  return "$(cat "build-stages/$name.rc")"
}

asan() {
  mkdir -p build-asan
  configure_build build-asan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=address
  local built=$?
  prebuild_start
  [ "$built" -eq 0 ] || return 1
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure --timeout 300 -j "$CTEST_JOBS")
}

tsan() {
  prebuild_wait tsan || return 1
  # TSan runs the tests whose code is threaded; pure parsers gain nothing from it.
  (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$ROOT/tests/tsan.supp" \
     ctest --output-on-failure --timeout 600 -LE no-tsan -j "$CTEST_JOBS")
}

release() {
  prebuild_wait release
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
  prebuild_wait optional >/dev/null # the script shows its own errors
  scripts/optional-builds.sh
}

fuzz() {
  [ -x scripts/fuzz.sh ] || { echo "no fuzz targets yet"; return 0; }
  prebuild_wait fuzz >/dev/null # the script shows its own errors
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
