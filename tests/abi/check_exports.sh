#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The dynamic symbols libferry.so defines must be exactly tests/abi/exported.txt:
# the public API (FERRY_API in include/ferry/), no internal function. A new
# public function is added to the list on purpose, in the same change
# (docs/ABI.md); a removed or renamed one breaks callers' binaries.
# With INCLUDE_DIR, every ferry_* function the public headers name must be
# exported too: a declaration added without FERRY_API is caught here.
#   check_exports.sh LIBFERRY_SO EXPORTED_TXT [INCLUDE_DIR]
set -eu
lib=$1 want=$2 include=${3:-}
got=$(mktemp)
trap 'rm -f "$got"' EXIT
# Linker-made markers and AddressSanitizer's ODR indicators (one per
# exported variable, in ASan builds) are not API; everything else counts.
# Names are compared without their version suffix; the version node itself
# (type A) is not a symbol of the API.
nm -D --defined-only "$lib" | awk '$2 != "A" {print $NF}' | sed 's/@.*//' |
  grep -vxE '_init|_fini|_edata|_end|__bss_start|__odr_asan[.].*' | sort -u >"$got"
# Every ferry_ symbol carries the version of the SONAME's major (cmake/ferry.map.in).
major=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[libferry\.so\.\([0-9]*\)\]/\1/p')
[ -n "$major" ] || { echo "check_exports: $lib has no SONAME libferry.so.MAJOR" >&2; exit 1; }
unversioned=$(nm -D --defined-only "$lib" | awk -v v="@@FERRY_$major" \
  '$2 != "A" && $NF ~ /^ferry_/ && substr($NF, length($NF) - length(v) + 1) != v {print $NF}')
if [ -n "$unversioned" ]; then
  echo "check_exports: symbols without the version FERRY_$major (cmake/ferry.map.in):" $unversioned >&2
  exit 1
fi
if ! diff -u "$want" "$got"; then
  echo "check_exports: $lib exports differ from $want (- expected, + exported)." >&2
  echo "Internal functions must not carry FERRY_API; a deliberate API change updates $want and docs/ABI.md." >&2
  exit 1
fi
if [ -n "$include" ]; then
  # Names called in the headers (declarations, macros, comments); the
  # header's own helpers end in '_' and are not library symbols.
  named=$(grep -ohE '\bferry_[a-z0-9_]*[a-z0-9]\s*\(' "$include"/ferry/*.h | tr -d '( ' | sort -u)
  missing=$(printf '%s\n' "$named" | comm -23 - "$got")
  if [ -n "$missing" ]; then
    echo "check_exports: named in $include/ferry/*.h but not exported by $lib:" >&2
    printf '  %s\n' $missing >&2
    echo "A public function is declared with FERRY_API and listed in $want (docs/ABI.md)." >&2
    exit 1
  fi
fi
echo "check_exports: $(wc -l <"$got") symbols, as listed"
