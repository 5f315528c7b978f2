#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The layer rule of src/ (README, "Layout"), checked.

Layers, bottom to top; a file may include headers of its own folder and of
the layers below its own, never of a layer above it nor of another folder of
its own layer (two transports never include each other):

    util  wire  link  transport/<name> meta  engine  serve  kv

With --objects DIR (a build tree), the same rule is checked on calls: an
object of a lower layer must not use a symbol that only a higher layer's
object defines (nm), which catches a call made through a declaration
written by hand instead of an include.

Also checked: no library file over 800 lines; the engine struct's header
(src/engine/engine.h) included by at most 8 files, tests and tools counted.

scripts/layers.allow lists the known violations still being cut, one per
line as printed; an entry no longer seen is itself an error, so the list
only shrinks. Exit status 1 when a check fails."""

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANK = {"util": 0, "wire": 1, "link": 2, "transport": 3, "meta": 3, "engine": 4, "serve": 5, "kv": 6}
MAX_LINES = 800
ENGINE_H = "src/engine/engine.h"
MAX_ENGINE_H_INCLUDERS = 8
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    """The layer folder of a path under src/ ("transport/tcp" for a
    transport's files), or None outside src/."""
    parts = path.split("/")
    if parts[0] != "src" or len(parts) < 3:
        return None
    if parts[1] == "transport" and len(parts) >= 4:
        return "transport/" + parts[2]
    return parts[1]


def rank_of(folder):
    return RANK.get(folder.split("/")[0])


def allowed(src_folder, dst_folder):
    if src_folder == dst_folder:
        return True
    rs, rd = rank_of(src_folder), rank_of(dst_folder)
    if rs is None or rd is None:
        return False
    return rd < rs


def tracked(*patterns):
    out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.split()
    found = []  # not a git checkout (an unpacked tarball): walk the tree
    for top in ("src", "tests", "tools", "bench", "bindings"):
        for d, _, names in os.walk(os.path.join(ROOT, top)):
            found += [os.path.relpath(os.path.join(d, n), ROOT) for n in names if n.endswith((".c", ".h"))]
    return found


def resolve(path, name):
    for base in (os.path.dirname(path), "src"):
        cand = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(ROOT, cand)):
            return cand
    return None


def include_findings(files):
    findings, includers = [], []
    for path in files:
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        src_folder = folder_of(path)
        for name in INCLUDE.findall(text):
            target = resolve(path, name)
            if target is None:
                continue
            if target == ENGINE_H and path != ENGINE_H:
                includers.append(path)
            dst_folder = folder_of(target)
            if src_folder is None or dst_folder is None:
                continue
            if rank_of(src_folder) is None:
                findings.append("unknown layer: %s (folder %s)" % (path, src_folder))
            elif not allowed(src_folder, dst_folder):
                findings.append("include up: %s -> %s" % (path, target))
    return findings, includers


def size_findings(files):
    out = []
    for path in files:
        if not path.startswith("src/") and not path.startswith("bindings/python/ferry/"):
            continue
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_LINES:
            out.append("over %d lines: %s (%d)" % (MAX_LINES, path, n))
    return out


def object_findings(build):
    """Calls up, from the objects of the library in build DIR (nm)."""
    objdir = os.path.join(build, "CMakeFiles", "ferry_objects.dir")
    objs = {}
    for d, _, names in os.walk(objdir):
        for n in names:
            if n.endswith(".c.o"):
                full = os.path.join(d, n)
                src = os.path.relpath(full, objdir)[: -len(".o")]
                if os.path.isfile(os.path.join(ROOT, src)):  # not an object left by a moved file
                    objs[src] = full
    if not objs:
        return ["no objects under %s: build the library first" % objdir]
    defined, undefined = {}, {}
    by_obj = {obj: src for src, obj in objs.items()}

    def nm(*flags):
        """{object: [lines]} from one nm run over every object."""
        out = subprocess.run(["nm", *flags, *by_obj], capture_output=True, text=True).stdout
        per, cur = {}, None
        for line in out.splitlines():
            if line.endswith(":") and line[:-1] in by_obj:
                cur = per.setdefault(line[:-1], [])
            elif line.strip() and cur is not None:
                cur.append(line)
        return per

    for obj, lines in nm("--defined-only", "-g").items():
        for line in lines:
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBRVW":
                defined.setdefault(parts[2], by_obj[obj])
    for obj, lines in nm("-u").items():
        undefined[by_obj[obj]] = [line.split()[-1] for line in lines]
    findings = set()
    for src, syms in undefined.items():
        sf = folder_of(src)
        for sym in syms:
            dst = defined.get(sym)
            if dst is None or sf is None:
                continue
            df = folder_of(dst)
            if df and not allowed(sf, df):
                findings.add("call up: %s -> %s (%s)" % (src, dst, sym))
    return sorted(findings)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", metavar="BUILD", help="also check calls, from this build tree's objects")
    ap.add_argument("--allow", default=os.path.join(ROOT, "scripts", "layers.allow"))
    ap.add_argument("--report", action="store_true", help="print every finding, allowed or not")
    ap.add_argument("--plant", metavar="PATH=INCLUDE", action="append", default=[],
                    help="check as if PATH also included INCLUDE (the test that shows the check fails)")
    args = ap.parse_args()

    files = [f for f in tracked("src", "tests", "tools", "bench", "bindings") if f.endswith((".c", ".h", ".py"))]
    c_files = [f for f in files if f.endswith((".c", ".h"))]
    findings, includers = include_findings(c_files)
    for plant in args.plant:
        path, name = plant.split("=", 1)
        target = resolve(path, name)
        if target and folder_of(path) and folder_of(target) and not allowed(folder_of(path), folder_of(target)):
            findings.append("include up: %s -> %s" % (path, target))
    findings += size_findings(files)
    if len(includers) > MAX_ENGINE_H_INCLUDERS:
        findings.append("engine.h has %d includers (at most %d): %s"
                        % (len(includers), MAX_ENGINE_H_INCLUDERS, " ".join(sorted(includers))))
    if args.objects:
        findings += object_findings(args.objects)

    allow = set()
    if os.path.exists(args.allow):
        with open(args.allow) as fh:
            allow = {line.rstrip("\n") for line in fh if line.strip() and not line.startswith("#")}
    # Line counts and includer lists change with every edit: an allowed
    # entry matches on its text before " (" or ": " + list.
    def key(f):
        return re.sub(r" \(\d+\)$", "", f.split(" has ")[0] if f.startswith("engine.h has") else f)
    allow_keys = {key(a) for a in allow}
    seen_keys = {key(f) for f in findings}
    bad = [f for f in findings if key(f) not in allow_keys]
    stale = sorted(a for a in allow_keys if a not in seen_keys
                   and (args.objects or not a.startswith("call up:")))
    for f in sorted(findings) if args.report else bad:
        print(f)
    for a in stale:
        print("allowed but no longer seen (remove it from %s): %s" % (os.path.relpath(args.allow, ROOT), a))
    if bad or stale:
        print("layers: %d violation(s), %d stale allowance(s); the rule is in %s"
              % (len(bad), len(stale), os.path.relpath(__file__, ROOT)), file=sys.stderr)
        return 1
    print("layers: ok (%d allowed, still to cut)" % len(allow_keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
