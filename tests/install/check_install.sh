#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs the build into a temporary prefix and builds a user's program
# (consumer.c) against it three ways: pkg-config (shared), libferry.a with
# ferry.pc's Libs.private, and CMake find_package(ferry)
# (ferry::ferry and ferry::ferry_static).
# Each program runs a transfer between two engines on loopback.
#   check_install.sh BUILD_DIR [SANITIZE]   (SANITIZE: '', address, thread)
set -eu
build=$1 sanitize=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
CC=${CC:-cc}
# A sanitized library needs its runtime in the program too.
case $sanitize in
  address) SAN="-fsanitize=address,undefined" ;;
  thread) SAN="-fsanitize=thread" ;;
  *) SAN="" ;;
esac

step() { echo "== $*"; }
die() { echo "check_install: $*" >&2; exit 1; }

step "cmake --install into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; die "install failed"; }
libdir=$(sed -n "s/^CMAKE_INSTALL_LIBDIR:[A-Z]*=//p" "$build/CMakeCache.txt")  # lib, or lib/<multiarch> for /usr
for f in include/ferry/ferry.h include/ferry/error.h include/ferry/export.h include/ferry/kv.h include/ferry/pool.h \
         "$libdir/libferry.a" "$libdir/libferry.so" "$libdir/pkgconfig/ferry.pc" \
         "$libdir/cmake/ferry/ferryConfig.cmake" "$libdir/cmake/ferry/ferryConfigVersion.cmake" bin/ferry; do
  [ -e "$prefix/$f" ] || die "missing $f"
done
so=$(ls "$prefix/$libdir"/libferry.so.*.*.* 2>/dev/null | head -n 1)
[ -n "$so" ] || die "no libferry.so.MAJOR.MINOR.PATCH in $prefix/$libdir"
soname=$(readelf -d "$so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ -e "$prefix/$libdir/$soname" ] || die "SONAME $soname of $so is not installed"
"$prefix/bin/ferry" help >/dev/null || die "installed ferry CLI does not run"

step "each installed header compiles alone (C11 -pedantic, and C++ when there is a compiler)"
CXX=${CXX:-c++}
for h in "$prefix"/include/ferry/*.h; do
  printf '#include <ferry/%s>\nint main(void) { return 0; }\n' "$(basename "$h")" >"$work/header.c"
  $CC -std=c11 -Wall -Wextra -Werror -pedantic -I"$prefix/include" -c "$work/header.c" -o /dev/null ||
    die "$(basename "$h") does not compile alone"
  if command -v "$CXX" >/dev/null; then
    cp "$work/header.c" "$work/header.cpp"
    "$CXX" -std=c++11 -Wall -Wextra -Werror -I"$prefix/include" -c "$work/header.cpp" -o /dev/null ||
      die "$(basename "$h") does not compile as C++"
  fi
done

export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
step "pkg-config ferry: $(pkg-config --modversion ferry)"
# shellcheck disable=SC2046
$CC $SAN -std=c11 -Wall -Wextra -Werror -o "$work/consumer_pc" "$here/consumer.c" \
  $(pkg-config --cflags --libs ferry) -Wl,-rpath,"$prefix/$libdir"
ldd "$work/consumer_pc" | grep -q "$prefix/$libdir/$soname" || die "consumer_pc does not load $soname from the prefix"
"$work/consumer_pc"

step "libferry.a with ferry.pc's Libs.private"
# What `pkg-config --static --libs ferry` gives, with libferry.a named (-lferry
# would take the .so): the backends' libraries are plain -l flags, linked shared.
pc=$PKG_CONFIG_PATH/ferry.pc
libs_private=$(sed -n 's/^Libs.private: *//p' "$pc")
case " $libs_private " in *" -lcrypto "*) ;; *) die "ferry.pc's Libs.private lacks -lcrypto: $libs_private" ;; esac
if grep -q '^Requires' "$pc"; then die "ferry.pc requires other modules: $(grep '^Requires' "$pc")"; fi
# shellcheck disable=SC2046,SC2086
$CC $SAN -std=c11 -Wall -Wextra -Werror -o "$work/consumer_static" "$here/consumer.c" \
  $(pkg-config --cflags ferry) "$prefix/$libdir/libferry.a" $libs_private
if ldd "$work/consumer_static" | grep -q libferry; then die "consumer_static loads libferry.so"; fi
"$work/consumer_static"

step "find_package(ferry)"
cmake -S "$here" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="$SAN" \
  -DCMAKE_EXE_LINKER_FLAGS="$SAN" >"$work/cmake.log" || { cat "$work/cmake.log"; die "find_package(ferry) failed"; }
cmake --build "$work/cmake-build" >"$work/build.log" || { cat "$work/build.log"; die "consumer build failed"; }
ldd "$work/cmake-build/consumer" | grep -q "$prefix/$libdir/$soname" || die "consumer does not load $soname from the prefix"
"$work/cmake-build/consumer"
step "find_package(ferry): ferry::ferry_static"
if ldd "$work/cmake-build/consumer_static" | grep -q libferry; then die "consumer_static (CMake) loads libferry.so"; fi
"$work/cmake-build/consumer_static"
echo "check_install: OK"
