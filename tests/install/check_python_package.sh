#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The ferry-transfer distribution (bindings/python), as a user installs it:
# `pip install --no-build-isolation --no-index` (no network, no setuptools or
# `wheel` needed: bindings/python/_build/ferry_backend.py writes the wheel)
# into a temporary --target directory, the wheel carrying the libferry.so of
# `cmake --install` into a temporary prefix. The installed package must move
# bytes between two engines with the library found
#   - in the wheel, with no LD_LIBRARY_PATH and no FERRY_LIBRARY;
#   - through the system loader (LD_LIBRARY_PATH here, the ldconfig cache on
#     a real system), which goes before the wheel's copy;
#   - through FERRY_LIBRARY.
# With PYTHON, and with the python3 first on PATH when that is another one
# (a pyenv interpreter without the `wheel` package, issue 25).
#   check_python_package.sh BUILD_DIR [PYTHON]
set -eu
build=$1 py=${2:-/usr/bin/python3}
[ -x "$py" ] || py=python3
src=$(cd "$(dirname "$0")/../../bindings/python" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-pypkg.XXXXXX")
trap 'rm -rf "$work"' EXIT
die() { echo "check_python_package: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" || { cat "$work/install.log"; die "cmake --install failed"; }
libdir=$(sed -n "s/^CMAKE_INSTALL_LIBDIR:[A-Z]*=//p" "$build/CMakeCache.txt")  # lib, or lib/<multiarch> for /usr
# A copy outside the checkout (the wheel's library then comes from FERRY_WHEEL_LIBRARY).
mkdir "$work/src"
cp -r "$src/ferry" "$src/_build" "$src/pyproject.toml" "$src/README.md" "$work/src/"

cat >"$work/use.py" <<'PY'
import os, sys
import ferry
want_dir = sys.argv[1]
lib = ferry.library_path()
maps = open("/proc/self/maps").read()
loaded = sorted({l.split()[-1] for l in maps.splitlines() if "libferry.so" in l})
assert ferry.__file__.startswith(sys.argv[2]), ferry.__file__
assert loaded and all(p.startswith(want_dir) for p in loaded), (lib, loaded)
with ferry.Engine("127.0.0.1", 0) as a, ferry.Engine("127.0.0.1", 0) as b:
    src = bytearray(os.urandom(1 << 16))
    dst = bytearray(len(src))
    a.register(src, flags=ferry.MEM_LOCAL)
    remote = b.register(dst)
    a.transfer(b.name, ferry.WRITE, src, remote)
    assert dst == src, "bytes differ"
print("python package: OK, %s loaded as %s from %s" % (ferry.__file__, lib, loaded[0]))
PY

check_with() { # PYTHON TAG
  p=$1 site=$work/site-$2
  echo "== $p: pip install --no-build-isolation --no-index --target"
  FERRY_WHEEL_LIBRARY="$work/prefix/$libdir/libferry.so.0" "$p" -m pip install --quiet --disable-pip-version-check \
    --no-build-isolation --no-index --no-deps --target "$site" "$work/src" 2>"$work/pip.log" ||
    { cat "$work/pip.log"; die "pip install with $p failed"; }
  [ -f "$site/ferry/__init__.py" ] || die "ferry not installed into the target"
  [ -f "$site/ferry/_libs/libferry.so.0" ] || die "the wheel does not carry libferry.so.0"
  ls "$site"/ferry_transfer-*.dist-info/METADATA >/dev/null 2>&1 || die "not installed as ferry-transfer"
  grep -q '^License: Apache-2.0' "$site"/ferry_transfer-*.dist-info/METADATA || die "no licence in the metadata"
  (
    cd "$work"   # not the checkout: its build directories must not be what is found
    echo "== the wheel's library (no LD_LIBRARY_PATH, no FERRY_LIBRARY)"
    want=$site/ferry/_libs
    if ldconfig -p 2>/dev/null | grep -q 'libferry\.so\.0 '; then
      echo "   (a libferry.so.0 is installed on this system: it goes first)"; want=/
    fi
    env -u FERRY_LIBRARY -u LD_LIBRARY_PATH PYTHONPATH="$site" "$p" "$work/use.py" "$want" "$site"
    echo "== the system loader (LD_LIBRARY_PATH=$work/prefix/$libdir), before the wheel's copy"
    env -u FERRY_LIBRARY PYTHONPATH="$site" LD_LIBRARY_PATH="$work/prefix/$libdir" \
      "$p" "$work/use.py" "$work/prefix/$libdir" "$site"
    echo "== FERRY_LIBRARY"
    env -u LD_LIBRARY_PATH PYTHONPATH="$site" FERRY_LIBRARY="$work/prefix/$libdir/libferry.so.0" \
      "$p" "$work/use.py" "$work/prefix/$libdir" "$site"
  )
}

check_with "$py" given
first=$(command -v python3 || true)
if [ -n "$first" ] && [ "$(readlink -f "$first")" != "$(readlink -f "$py")" ] &&
   "$first" -c 'import sys, pip; sys.exit(sys.version_info < (3, 8))' 2>/dev/null; then
  check_with "$first" path
fi
echo "check_python_package: OK"
