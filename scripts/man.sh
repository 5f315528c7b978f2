#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Man pages from what the CLI prints: ferry(1) from `ferry --help`, and
# ferry-COMMAND(1) from `ferry COMMAND --help` for each command `ferry help`
# lists, through help2man (Debian: help2man).
#   scripts/man.sh FERRY_BINARY OUT_DIR
# The pages are committed in man/ (`make install` needs no help2man);
# regenerate them after changing a command's help:
#   scripts/man.sh build/ferry man    (or: cmake --build build --target man)
# ctest man_pages checks that man/ matches the binary.
set -eu
ferry=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
out=$2
command -v help2man >/dev/null || { echo "man.sh: help2man not found (apt-get install help2man)" >&2; exit 2; }
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-man.XXXXXX")
trap 'rm -rf "$work"' EXIT
version=$("$ferry" --version | sed -n '1s/^ferry \([0-9][0-9.]*\).*/\1/p')
# The date help2man writes: the last commit's, so that the pages change only
# when the help does (reproducible builds honour SOURCE_DATE_EPOCH too).
: "${SOURCE_DATE_EPOCH:=$(git -C "$(dirname "$0")" log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH

# page NAME DESCRIPTION COMMAND...: help2man needs one program answering
# --help and --version, so each command gets a small wrapper named like its
# page. It passes the help through help.awk, which turns the help's headings
# into help2man's ("usage:" -> "Usage:", further usage lines -> "  or:",
# "options:" -> "Options:"), for SYNOPSIS and OPTIONS sections.
cat >"$work/help.awk" <<'AWK'
/^usage:/ { sub(/^usage:/, "Usage:") }
/^       ferry / { sub(/^       /, "   or: ") }
# a usage line's continuation: onto the line it continues
/^                    +[^ ]/ && prev ~ /^(Usage:|   or:)/ { sub(/^ +/, " "); prev = prev $0; next }
/^[a-z][a-z -]*:$/ { $0 = toupper(substr($0, 1, 1)) substr($0, 2) }
# a command list entry ("  NAME  TEXT"): two spaces after the name and a
# blank line before it, which help2man needs to keep entries apart
/^  [a-z][a-z0-9-]* +[a-z]/ { sub(/^  [a-z0-9-]+ /, "& "); print prev; prev = ""; if (!cmds++) prev = "Commands:" }
{ if (NR > 1) print prev; prev = $0 }
END { if (NR > 0) print prev }
AWK
page() {
  name=$1 desc=$2; shift 2
  wrapper=$work/$name
  { echo '#!/bin/sh'
    echo "[ \"\${1:-}\" = --version ] && { echo '$name $version'; exit 0; }"
    echo "$* --help 2>&1 | awk -f '$work/help.awk'"; } >"$wrapper"
  chmod +x "$wrapper"
  help2man --no-info --no-discard-stderr --section 1 --name "$desc" \
    --source "Ferry $version" --manual "Ferry manual" \
    --include "$work/see-also" --output "$out/$name.1" "$wrapper"
}

commands=$("$ferry" help | sed -n 's/^  \([a-z][a-z0-9-]*\)  *\(.*\)$/\1/p')
{ echo '[SEE ALSO]'
  for c in $commands; do printf '.BR ferry-%s (1),\n' "$c"; done
  echo '.BR ferry (1)'
  echo 'and README.md in the source distribution.'; } >"$work/see-also"

page ferry "a data transfer engine for disaggregated LLM inference" "\"$ferry\""
for c in $commands; do
  desc=$("$ferry" help | sed -n "s/^  $c  *\(.*\)$/\1/p")
  page "ferry-$c" "$desc" "\"$ferry\" $c"
done
echo "man.sh: $(ls "$out" | wc -l) pages in $out"
