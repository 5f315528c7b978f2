#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# scripts/spdx.sh on a small tree outside git: --check lists what lacks the
# line and fails; --fix adds it in each file's comment syntax, after a
# shebang, keeping the mode, a Python docstring and non-source files as they
# were; --check then passes.
#   check_spdx_script.sh SOURCE_DIR
set -eu
src=$1
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-spdx.XXXXXX")
trap 'rm -rf "$work"' EXIT
die() { echo "check_spdx_script: $*" >&2; exit 1; }
mkdir -p "$work/scripts" "$work/sub"
cp "$src/scripts/spdx.sh" "$work/scripts/"
cd "$work"
printf '#!/bin/sh\necho run-ok\n' >sub/run && chmod 755 sub/run
printf 'int x;\n' >a.c
printf '"""doc"""\nx = 1\n' >b.py
: >empty.h
printf 'cmake_minimum_required(VERSION 3.16)\n' >CMakeLists.txt
echo data >notes.txt
if scripts/spdx.sh --check >check.out 2>/dev/null; then die "--check passed on files without the line"; fi
for f in a.c b.py empty.h CMakeLists.txt sub/run; do grep -qx "$f" check.out || die "--check did not list $f"; done
if grep -q notes.txt check.out; then die "--check listed a non-source file"; fi
scripts/spdx.sh --fix >/dev/null
scripts/spdx.sh --check >/dev/null || die "--check fails after --fix"
[ "$(sed -n 1p sub/run)" = '#!/bin/sh' ] || die "the shebang is no longer first"
[ "$(sed -n 2p sub/run)" = '# SPDX-License-Identifier: Apache-2.0' ] || die "no SPDX line after the shebang"
[ -x sub/run ] && [ "$(sub/run)" = run-ok ] || die "the script lost its mode or no longer runs"
[ "$(sed -n 1p a.c)" = '/* SPDX-License-Identifier: Apache-2.0 */' ] || die "a.c: $(sed -n 1p a.c)"
[ "$(python3 -c 'import b; print(b.__doc__)')" = doc ] || die "b.py lost its docstring"
[ "$(cat notes.txt)" = data ] || die "a non-source file was changed"
echo "check_spdx_script: OK"
