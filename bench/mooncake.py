#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Mooncake's Transfer Engine as a side-by-side baseline of bench/compare.

  bench/mooncake.py locate            # prints the build folder, or how to get one (rc 1)
  bench/mooncake.py build             # builds it once (about 10 minutes on 2 cores)
  bench/mooncake.py rounds --ferry build/ferry [--rounds 3] [--dur 1] [--only 1m,2k]
                                      # JSON lines {"key", "r"} for bench/compare

The build is Mooncake (kvcache-ai/Mooncake at 3b5a594, Apache-2.0) built from
the source archive by its build.sh (found at $MOONCAKE_SRC, or at
../shared/baselines/mooncake from the repository root, or /work/shared/...),
into $MOONCAKE_BUILD (default: .baseline/mooncake in the repository, ignored
by git). It gives transfer_engine_bench and the Python module mooncake.engine
(TCP and P2PHANDSHAKE only: no RDMA device, no GPU).

`rounds` runs Mooncake's transfer_engine_bench (initiator against a target
kept up for the whole run) and `ferry bench --local` on the same shapes,
over TCP on loopback, alternated (Ferry first in odd rounds, Mooncake first
in even ones), each run --dur seconds:
  1 MiB x 16 a call, 64 MiB x 1, and 1,024 x 2 KiB, 4 KiB, 32 KiB a call;
  read and write; 1 and 4 initiator threads.
Mooncake's throughput is computed from its batch count (batches x batch size
x block size / its measured duration), not from its print rounded to 0.01
GB/s. Its CPU is the initiator's (its whole process, from getrusage) plus
the target's during the run (/proc), less the same for a --duration=0 run of
the same shape (start, handshake, buffer set-up, and the one batch a thread
may still move there, which errs in Mooncake's favour), measured once per shape.
Mooncake's bench places a call's blocks next to each other (it has no
option to scatter them); Ferry's small-piece runs scatter them (--scatter),
the harder case for Ferry, whose TCP path then cannot merge neighbours.
"""

import argparse
import json
import os
import re
import resource
import select
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BUILD = os.path.join(ROOT, ".baseline", "mooncake")
BENCH_REL = os.path.join("build", "mooncake-transfer-engine", "example", "transfer_engine_bench")

# name, block size, requests a call, Ferry scatters the blocks
SHAPES = (("1m", 1 << 20, 16, False), ("64m", 64 << 20, 1, False), ("2k", 2048, 1024, True),
          ("4k", 4096, 1024, True), ("32k", 32768, 1024, True))
OPS = ("write", "read")
THREADS = (1, 4)
TARGET_BUFFER = 256 << 20  # the largest shape: 64 MiB x 1 x 4 threads


def build_dir():
    return os.environ.get("MOONCAKE_BUILD") or DEFAULT_BUILD


def bench_path(d=None):
    return os.path.join(d or build_dir(), BENCH_REL)


def py_dir(d=None):
    return os.path.join(d or build_dir(), "py")


def source_dir():
    for d in (os.environ.get("MOONCAKE_SRC"), os.path.join(ROOT, "..", "shared", "baselines", "mooncake"),
              "/work/shared/baselines/mooncake"):
        if d and os.path.isfile(os.path.join(d, "build.sh")):
            return os.path.abspath(d)
    return None


HOW_TO_GET = """Mooncake baseline not found at %s.
  Get it: bench/mooncake.py build (or make bench-mooncake), which runs build.sh from Mooncake's
  source archive (kvcache-ai/Mooncake 3b5a594 with its submodules; set MOONCAKE_SRC to the folder
  holding build.sh and mooncake-te-*-src.tar.xz), about 10 minutes on 2 cores; or point
  MOONCAKE_BUILD at an existing build.sh output folder."""


def have_build(d=None):
    return os.access(bench_path(d), os.X_OK)


def do_build():
    if have_build():
        return 0
    src = source_dir()
    if src is None:
        print(HOW_TO_GET % build_dir(), file=sys.stderr)
        print("  (no build.sh found: looked at $MOONCAKE_SRC, ../shared/baselines/mooncake, "
              "/work/shared/baselines/mooncake)", file=sys.stderr)
        return 1
    log = os.path.join(os.path.dirname(build_dir()), "mooncake-build.log")
    os.makedirs(build_dir(), exist_ok=True)
    print("mooncake: building into %s (log %s; about 10 minutes)" % (build_dir(), log), file=sys.stderr)
    with open(log, "w") as f:
        rc = subprocess.call(["nice", os.path.join(src, "build.sh"), build_dir()], stdout=f, stderr=subprocess.STDOUT)
    if rc != 0 or not have_build():
        print("mooncake: build failed (rc %d), see %s" % (rc, log), file=sys.stderr)
        return 1
    return 0


def proc_cpu_s(pid):
    """utime + stime of a live process, seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Target:
    """A transfer_engine_bench target, kept up for the whole run."""

    def __init__(self, binary):
        self.binary = binary
        self.proc = None
        self.port = None

    def start(self):
        self.proc = subprocess.Popen(
            [self.binary, "--mode=target", "--protocol=tcp", "--metadata_server=P2PHANDSHAKE",
             "--local_server_name=127.0.0.1:12345", "--buffer_size=%d" % TARGET_BUFFER],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        end = time.monotonic() + 60
        text = b""
        fd = self.proc.stderr.fileno()
        while time.monotonic() < end:
            r, _, _ = select.select([fd], [], [], 1)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                text += chunk
                m = re.search(rb"listening on [^:\s]+:(\d+)", text)
                if m:
                    self.port = int(m.group(1))
            # its buffer is registered a moment after the listener: wait until the log goes quiet
            elif self.port is not None:
                break
        if self.port is None:
            self.stop()
            raise RuntimeError("mooncake target did not start: %s" % text[-500:].decode(errors="replace"))
        # Keep draining its log so that it never blocks on a full pipe.
        self.drain = subprocess.Popen(["cat"], stdin=self.proc.stderr, stdout=subprocess.DEVNULL)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def cpu_s(self):
        return proc_cpu_s(self.proc.pid)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def mooncake_run(binary, target, op, block, batch, threads, dur):
    """One initiator run: {"gb_per_s", "seconds", "bytes", "batches", "cpu_s"} or {"error"}."""
    if not target.alive():
        target.start()
    need = block * batch * threads
    args = [binary, "--mode=initiator", "--protocol=tcp", "--metadata_server=P2PHANDSHAKE",
            "--local_server_name=127.0.0.1:12346", "--segment_id=127.0.0.1:%d" % target.port,
            "--operation=" + op, "--block_size=%d" % block, "--batch_size=%d" % batch,
            "--threads=%d" % threads, "--duration=%d" % dur, "--buffer_size=%d" % need]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t_cpu0 = target.cpu_s()
    try:
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=dur + 60)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), -9
    t_cpu1 = target.cpu_s() if target.alive() else t_cpu0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    init_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    m = re.search(r"duration ([0-9.]+), batch count (\d+)", out)
    if rc != 0 or not m:
        return {"error": "rc %d: %s" % (rc, " | ".join(out.strip().splitlines()[-3:]))}
    seconds, batches = float(m.group(1)), int(m.group(2))
    nbytes = batches * batch * block
    return {"gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else 0.0, "seconds": seconds, "bytes": nbytes,
            "batches": batches, "cpu_s": init_cpu + (t_cpu1 - t_cpu0), "req_per_s": batches * batch / seconds
            if seconds > 0 else 0.0}


def ferry_run(ferry, op, block, batch, threads, scatter, dur):
    args = [ferry, "bench", "--local", "--duration", str(dur), "--json", "--transport", "tcp", "--op", op,
            "--block-size", str(block), "--batch-size", str(batch), "--threads", str(threads)]
    if scatter:
        args.append("--scatter")
    try:
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=dur * 3 + 30)
        j = json.loads(p.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return {"error": repr(e)}
    if not j.get("ok", True) or not j.get("seconds"):
        return {"error": json.dumps(j.get("error"))}
    cores = j["cpu_cores"]["initiator"] + (j["cpu_cores"].get("target") or 0)
    gbs = j["bytes"] / j["seconds"] / 1e9
    return {"gb_per_s": gbs, "seconds": j["seconds"], "bytes": j["bytes"], "cores": cores,
            "req_per_s": j.get("req_per_s"), "transport": "tcp"}


def rounds(a):
    binary = bench_path()
    if not have_build():
        print(HOW_TO_GET % build_dir(), file=sys.stderr)
        return 1
    only = set(a.only.split(",")) if a.only else None
    target = Target(binary)
    target.start()

    def emit(key, r):
        print(json.dumps({"key": key, "r": r}), flush=True)

    try:
        for name, block, batch, scatter in SHAPES:
            if only and name not in only:
                continue
            for threads in THREADS:
                # Start-up cost of Mooncake's initiator for this shape (no transfer time).
                # A --duration=0 run: start-up, handshake, buffer set-up (and the batch a
                # thread may still move there), subtracted from each run's CPU.
                calib = mooncake_run(binary, target, "write", block, batch, threads, 0)
                if "error" in calib:
                    calib = {"cpu_s": 0.0, "bytes": 0}
                for op in OPS:
                    key = "%s_%s_t%d" % (op, name, threads)
                    print("mooncake: %s (%d rounds of %d s each side)" % (key, a.rounds, a.dur), file=sys.stderr)
                    for r in range(1, a.rounds + 1):
                        order = ("ferry", "mooncake") if r % 2 == 1 else ("mooncake", "ferry")
                        for who in order:
                            if who == "ferry":
                                res = ferry_run(a.ferry, op, block, batch, threads, scatter, a.dur)
                                if "error" not in res:
                                    emit("mcf_%s_r%d" % (key, r), res)
                            else:
                                res = mooncake_run(binary, target, op, block, batch, threads, a.dur)
                                if "error" not in res:
                                    # less the start-up run's CPU, its batches' included: errs in
                                    # Mooncake's favour (bench/compare recomputes it the same way)
                                    res["cores"] = max(res["cpu_s"] - calib["cpu_s"], 0.0) / res["seconds"]
                                    res["startup_cpu_s"] = calib["cpu_s"]
                                    res["startup_bytes"] = calib["bytes"]
                                    res["transport"] = "tcp"
                                    emit("mc_%s_r%d" % (key, r), res)
                            if "error" in res:
                                print("mooncake: %s %s round %d failed: %s" % (who, key, r, res["error"]),
                                      file=sys.stderr)
    finally:
        target.stop()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("locate")
    sub.add_parser("build")
    r = sub.add_parser("rounds")
    r.add_argument("--ferry", required=True)
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--dur", type=int, default=1)
    r.add_argument("--only", default="", help="shapes, comma-separated: " + ",".join(s[0] for s in SHAPES))
    a = ap.parse_args()
    if a.cmd == "locate":
        if have_build():
            print(build_dir())
            return 0
        print(HOW_TO_GET % build_dir(), file=sys.stderr)
        return 1
    if a.cmd == "build":
        return do_build()
    return rounds(a)


if __name__ == "__main__":
    sys.exit(main())
