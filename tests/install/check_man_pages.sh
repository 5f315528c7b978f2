#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The man pages in man/ are what scripts/man.sh makes from this binary's help
# (the date line aside). When a command's help changes:
#   scripts/man.sh build/ferry man
#   check_man_pages.sh FERRY_BINARY SOURCE_DIR
set -eu
ferry=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-manchk.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$src/scripts/man.sh" "$ferry" "$work/man" >/dev/null
strip_date() { sed -e '/^\.TH /d' -e '/^\.\\" DO NOT MODIFY/d' "$1"; }
status=0
for page in "$work"/man/*.1; do
  name=$(basename "$page")
  if [ ! -f "$src/man/$name" ]; then echo "man/$name is missing"; status=1; continue; fi
  strip_date "$page" >"$work/new" && strip_date "$src/man/$name" >"$work/old"
  diff -u "$work/old" "$work/new" >"$work/diff" || { echo "man/$name differs from the CLI's help:"; head -n 20 "$work/diff"; status=1; }
done
for page in "$src"/man/*.1; do
  [ -f "$work/man/$(basename "$page")" ] || { echo "man/$(basename "$page"): no such command now"; status=1; }
done
[ $status -eq 0 ] || echo "regenerate: scripts/man.sh build/ferry man (or cmake --build build --target man)" >&2
exit $status
