#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Removes what the last `cmake --install BUILD` (or `make install`) put in
# place: the files of BUILD/install_manifest.txt, then the folders that
# install created (BUILD/install_dirs.txt, cmake/install.cmake), deepest
# first and only when empty, so nothing of the install is left and nothing
# else is touched.
# CMake's manifest names the files without DESTDIR: give the same DESTDIR
# as the install (`make uninstall DESTDIR=stage`).
#   [DESTDIR=stage] scripts/uninstall.sh BUILD_DIR
set -eu
build=${1:-build}
manifest=$build/install_manifest.txt
[ -f "$manifest" ] || { echo "uninstall: nothing installed from $build (no $manifest)" >&2; exit 1; }
destdir=${DESTDIR:-}
while IFS= read -r f || [ -n "$f" ]; do  # the manifest lacks a final newline
  [ -n "$f" ] || continue
  f=$destdir$f
  if [ -e "$f" ] || [ -L "$f" ]; then rm -f "$f" && echo "removed $f"; fi
done <"$manifest"
if [ -f "$build/install_dirs.txt" ]; then
  LC_ALL=C sort -ru "$build/install_dirs.txt" | while IFS= read -r d; do
    [ -d "$d" ] && rmdir --ignore-fail-on-non-empty "$d" && [ ! -d "$d" ] && echo "removed $d/"
    :
  done
fi
rm -f "$manifest" "$build/install_dirs.txt"
