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

# The source files, one a line, then those among them lacking the line in
# their first 5 lines (one awk over all of them: quick on a 2-core machine).
sources=$(mktemp) && trap 'rm -f "$sources"' EXIT
list_files | while IFS= read -r f; do
  [ -f "$f" ] && [ -n "$(syntax_of "$f")" ] && printf '%s\n' "$f"
done >"$sources"
lacking=$(tr '\n' '\0' <"$sources" | xargs -0 -r awk -v tag="$TAG" '
  FNR == 1 { if (prev != "" && !found) print prev; prev = FILENAME; found = 0 }
  FNR <= 5 && index($0, tag) { found = 1 }
  FNR > 5 { nextfile }
  END { if (prev != "" && !found) print prev }')
# awk never sees an empty file: those lack it too
lacking=$(printf '%s\n' "$lacking"; while IFS= read -r f; do [ -s "$f" ] || printf '%s\n' "$f"; done <"$sources")
lacking=$(printf '%s\n' "$lacking" | sed '/^$/d')

[ -n "$lacking" ] || exit 0
if [ "$mode" = --fix ]; then
  printf '%s\n' "$lacking" | while IFS= read -r f; do
    add_tag "$f" "$(syntax_of "$f")"
    echo "spdx: added to $f"
  done
  exit 0
fi
printf '%s\n' "$lacking"
echo "spdx: $(printf '%s\n' "$lacking" | wc -l) file(s) lack '$TAG' (scripts/spdx.sh --fix adds it)" >&2
exit 1
