#!/bin/sh
# `pip install` of bindings/python (no network, no build isolation) into a
# temporary --target directory, with the library installed into a temporary
# prefix; the installed package must find libferry.so.MAJOR through the
# system loader (LD_LIBRARY_PATH here, the ldconfig cache on a real system)
# and through FERRY_LIBRARY, and move bytes between two engines.
#   check_python_package.sh BUILD_DIR [PYTHON]
set -eu
build=$1 py=${2:-/usr/bin/python3}
[ -x "$py" ] || py=python3
src=$(cd "$(dirname "$0")/../../bindings/python" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-pypkg.XXXXXX")
trap 'rm -rf "$work"' EXIT
die() { echo "check_python_package: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" || { cat "$work/install.log"; die "cmake --install failed"; }
libdir=$(cd "$work/prefix" && ls -d lib* | head -n 1)
# A copy: pip builds in the source tree (build/, *.egg-info), the checkout stays clean.
mkdir "$work/src"
cp -r "$src/ferry" "$src/pyproject.toml" "$src/README.md" "$work/src/"
echo "== pip install --no-build-isolation --no-index --target"
"$py" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-index --no-deps \
  --target "$work/site" "$work/src" 2>"$work/pip.log" || { cat "$work/pip.log"; die "pip install failed"; }
[ -f "$work/site/ferry/__init__.py" ] || die "ferry not installed into the target"

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
cd "$work"   # not the checkout: its build directories must not be what is found
echo "== the system loader (LD_LIBRARY_PATH=$work/prefix/$libdir)"
env -u FERRY_LIBRARY PYTHONPATH="$work/site" LD_LIBRARY_PATH="$work/prefix/$libdir" \
  "$py" "$work/use.py" "$work/prefix/$libdir" "$work/site"
echo "== FERRY_LIBRARY"
env -u LD_LIBRARY_PATH PYTHONPATH="$work/site" FERRY_LIBRARY="$work/prefix/$libdir/libferry.so.0" \
  "$py" "$work/use.py" "$work/prefix/$libdir" "$work/site"
echo "check_python_package: OK"
