#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Every source file of Ferry carries the line
#   SPDX-License-Identifier: Apache-2.0
# in its first lines, in the file's own comment syntax (after a shebang).
#   scripts/spdx.sh --check   list the files lacking it; exit 1 if any does
#   scripts/spdx.sh --fix     add it where it lacks
# Files: the git-tracked ones (every file under the tree outside build*/ and
# .git when this is not a git checkout) whose kind is known below.
set -eu
cd "$(dirname "$0")/.."
TAG="SPDX-License-Identifier: Apache-2.0"
mode=${1:-}
case $mode in --check|--fix) ;; *) echo "usage: $0 --check|--fix" >&2; exit 2 ;; esac

list_files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files
  else
    find . -type f ! -path './.git/*' ! -path './build*' | sed 's|^\./||'
  fi
}

# The comment syntax for a file, or nothing for a file that is not source.
syntax_of() {
  case $1 in
    *.c|*.h|*.map.in) echo c ;;
    *.py|*.sh|*.cmake|*.cmake.in|*.pc.in|*.toml|*.supp|CMakeLists.txt|*/CMakeLists.txt|Makefile|*/Makefile) echo hash ;;
    *) if [ -f "$1" ] && head -c 2 "$1" | grep -q '^#!'; then echo hash; fi ;;
  esac
}

has_tag() { head -n 5 "$1" | grep -q "$TAG"; }

add_tag() {
  f=$1 syntax=$2 tmp="$1.spdx.$$"
  if [ "$syntax" = c ]; then line="/* $TAG */"; else line="# $TAG"; fi
  if head -n 1 "$f" | grep -q '^#!'; then
    { head -n 1 "$f"; echo "$line"; tail -n +2 "$f"; } >"$tmp"
  else
    { echo "$line"; cat "$f"; } >"$tmp"
  fi
  chmod --reference="$f" "$tmp" 2>/dev/null || true
  mv "$tmp" "$f"
}

missing=0
for f in $(list_files); do
  [ -f "$f" ] || continue
  syntax=$(syntax_of "$f")
  [ -n "$syntax" ] || continue
  has_tag "$f" && continue
  if [ "$mode" = --fix ]; then
    add_tag "$f" "$syntax"
    echo "spdx: added to $f"
  else
    echo "$f"
    missing=$((missing + 1))
  fi
done
if [ "$mode" = --check ] && [ "$missing" -gt 0 ]; then
  echo "spdx: $missing file(s) lack '$TAG' (scripts/spdx.sh --fix adds it)" >&2
  exit 1
fi
exit 0
