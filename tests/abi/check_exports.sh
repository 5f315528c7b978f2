#!/bin/sh
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
nm -D --defined-only "$lib" | awk '{print $NF}' |
  grep -vxE '_init|_fini|_edata|_end|__bss_start|__odr_asan[.].*' | sort -u >"$got"
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
