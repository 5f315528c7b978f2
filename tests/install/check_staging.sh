#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# A packager's install, as `make install PREFIX=/usr DESTDIR=stage` does it:
#   - configure with BUILD_TESTING=OFF where cmocka cannot be found (a
#     pkg-config directory without cmocka.pc), prefix /usr given at configure
#     time; build only the library and the CLI (ccache makes this quick after
#     any release build of the same tree);
#   - install into DESTDIR: the multiarch libdir, no test program built,
#     man pages (`man ferry-bench` through MANPATH), bash completion, licence;
#   - a C program built with `pkg-config --cflags --libs ferry` seeing only
#     Ferry's .pc file, run against the staged library;
#   - scripts/uninstall.sh leaves nothing: no file, no folder.
#   check_staging.sh SOURCE_DIR
set -eu
src=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-staging.XXXXXX")
trap 'rm -rf "$work"' EXIT
CC=${CC:-cc}
step() { echo "== $*"; }
die() { echo "check_staging: $*" >&2; exit 1; }

step "configure: BUILD_TESTING=OFF, no cmocka visible, prefix /usr"
mkdir "$work/pcdir"
for d in $(pkg-config --variable pc_path pkg-config | tr ':' ' '); do
  [ -d "$d" ] || continue
  for pc in "$d"/*.pc; do
    case $(basename "$pc") in cmocka.pc) continue ;; esac
    [ -e "$work/pcdir/$(basename "$pc")" ] || ln -s "$pc" "$work/pcdir/"
  done
done
launcher=""
command -v ccache >/dev/null && launcher="-DCMAKE_C_COMPILER_LAUNCHER=ccache"
PKG_CONFIG_LIBDIR=$work/pcdir PKG_CONFIG_PATH="" cmake -S "$src" -B "$work/b" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_TESTING=OFF -DCMAKE_INSTALL_PREFIX=/usr $launcher >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; die "configure without cmocka failed"; }
grep -q "tests OFF" "$work/configure.log" || die "configure did not leave the tests out"
step "build the library and the CLI"
nice cmake --build "$work/b" -j 2 --target ferry ferry_shared ferry_cli >"$work/build.log" 2>&1 ||
  { tail -n 30 "$work/build.log"; die "build failed"; }
[ ! -e "$work/b/tests" ] || die "BUILD_TESTING=OFF still configured tests/"

stage=$work/stage
step "install with DESTDIR=$stage"
DESTDIR=$stage cmake --install "$work/b" >"$work/install.log" 2>&1 || { cat "$work/install.log"; die "install failed"; }
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:[A-Z]*=//p' "$work/b/CMakeCache.txt")
if [ -f /etc/debian_version ] && command -v dpkg-architecture >/dev/null; then
  [ "$libdir" = "lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)" ] || die "libdir is $libdir, not Debian's multiarch one"
fi
usr=$stage/usr
for f in "$libdir/libferry.so" "$libdir/libferry.a" "$libdir/pkgconfig/ferry.pc" bin/ferry \
         include/ferry/ferry.h share/man/man1/ferry.1 share/man/man1/ferry-bench.1 \
         share/bash-completion/completions/ferry share/doc/ferry/LICENSE; do
  [ -e "$usr/$f" ] || die "missing /usr/$f in the staging tree"
done
grep -q '^License: Apache-2.0' "$usr/$libdir/pkgconfig/ferry.pc" || die "ferry.pc does not state the licence"

step "pkg-config --cflags --libs ferry with only Ferry's .pc visible"
mkdir "$work/empty"
flags=$(PKG_CONFIG_LIBDIR=$work/empty PKG_CONFIG_PATH=$usr/$libdir/pkgconfig pkg-config --cflags --libs ferry) ||
  die "pkg-config ferry fails with only ferry.pc present"
echo "   $flags"
# shellcheck disable=SC2086
$CC -std=c11 -Wall -Wextra -Werror -o "$work/consumer" "$here/consumer.c" $flags ||
  die "a program does not build with pkg-config's flags"
LD_LIBRARY_PATH=$usr/$libdir "$work/consumer" || die "the program built against the staged library fails"

step "man ferry-bench (MANPATH=$usr/share/man)"
if command -v man >/dev/null; then
  MANPATH=$usr/share/man man -w ferry-bench | grep -q "^$usr/share/man/man1/ferry-bench.1" ||
    die "man does not find ferry-bench in the staging tree"
  MANPATH=$usr/share/man MANPAGER=cat PAGER=cat man ferry-bench 2>/dev/null | grep -q -- "--block-size" ||
    die "man ferry-bench does not show bench's options"
else
  echo "   (no man here: skipped)"
fi
step "bash completion"
bash -c ". '$usr/share/bash-completion/completions/ferry' && complete -p ferry" >/dev/null ||
  die "the completion script does not define a completion for ferry"

step "uninstall leaves nothing"
DESTDIR=$stage "$src/scripts/uninstall.sh" "$work/b" >"$work/uninstall.log" || { cat "$work/uninstall.log"; die "uninstall failed"; }
if [ -e "$stage" ]; then
  find "$stage" | head -n 20
  die "uninstall left the above behind"
fi
echo "check_staging: OK"
