# SPDX-License-Identifier: Apache-2.0
"""The decode side of an SGLang prefill/decode pair, as a separate process.

Imports Mooncake's API by name through ferry's shim (as SGLang does), starts
an engine on 127.0.0.1, registers a KV buffer and prints one JSON line:
{"session_id", "kv_addr", "kv_len", "pid"}. Then it serves JSON-line commands
on stdin, one reply line each:
  {"cmd": "digest", "ranges": [[o, n], ...]} -> {"sha256": [hex of kv[o:o+n], ...]}
  {"cmd": "fill", "seed": s}              -> kv filled with pattern(seed)
  {"cmd": "notifies"}                     -> {"notifies": [[name, msg], ...]}
  {"cmd": "scratch_reg", "size": n}       -> a per-request buffer, zeroed and registered;
                                             always at the same address, as an allocator
                                             handing it back: {"addr", "rc"}
  {"cmd": "scratch_dereg"}                -> {"rc"}: deregistered after receipt
  {"cmd": "scratch_digest", "n": n}       -> {"sha256": hex of scratch[:n]}
  {"cmd": "exit"}
EOF on stdin ends it too.
"""

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import random
import sys

import ferry

if os.environ.get("FERRY_DIFF_ENGINE") == "mooncake":  # differential.py: the real Mooncake
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _engine_switch
    _engine_switch.mooncake_class()  # with get_session_id as SGLang's wrapper has it
else:
    ferry.install_mooncake_shim()
from mooncake.engine import TransferEngine  # noqa: E402  (SGLang's import)


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hostname", default="127.0.0.1")
    ap.add_argument("--protocol", default="tcp")
    ap.add_argument("--size", type=int, default=8 << 20)
    ap.add_argument("--buffer", default="mmap", choices=["mmap", "numpy", "ctypes"])
    args = ap.parse_args()

    te = TransferEngine()
    rc = te.initialize(args.hostname, "P2PHANDSHAKE", args.protocol, "")
    if rc != 0:
        out({"error": rc, "detail": ferry.errors.last_error_detail()})
        return 1
    if args.buffer == "numpy":
        import numpy as np
        kv = np.zeros(args.size, dtype=np.uint8)
        addr = kv.ctypes.data
        view = memoryview(kv)
    elif args.buffer == "ctypes":
        kv = (ctypes.c_char * args.size)()
        addr = ctypes.addressof(kv)
        view = memoryview(kv).cast("B")
    else:
        kv = mmap.mmap(-1, args.size)
        view = memoryview(kv)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(kv))
    # SGLang registers with an int address (tensor.data_ptr()).
    rc = te.register_memory(addr, args.size)
    if rc != 0:
        out({"error": rc, "detail": ferry.errors.last_error_detail()})
        return 1
    out({"session_id": te.get_session_id(), "kv_addr": addr, "kv_len": args.size,
         "rpc_port": te.get_rpc_port(), "pid": __import__("os").getpid()})

    scratch = scratch_view = scratch_addr = None
    for line in sys.stdin:
        cmd = json.loads(line)
        c = cmd["cmd"]
        if c == "digest":
            out({"sha256": [hashlib.sha256(view[o:o + n]).hexdigest() for o, n in cmd["ranges"]]})
        elif c == "fill":
            view[:] = random.Random(cmd["seed"]).randbytes(args.size)
            out({"ok": True})
        elif c == "notifies":
            out({"notifies": [[n.name, n.msg] for n in te.get_notifies()]})
        elif c == "scratch_reg":
            if scratch is None:
                scratch = mmap.mmap(-1, cmd["size"])
                scratch_view = memoryview(scratch)
                scratch_addr = ctypes.addressof(ctypes.c_char.from_buffer(scratch))
            scratch_view[:] = bytes(len(scratch))
            out({"addr": scratch_addr, "rc": te.register_memory(scratch_addr, len(scratch))})
        elif c == "scratch_dereg":
            out({"rc": te.unregister_memory(scratch_addr)})
        elif c == "scratch_digest":
            out({"sha256": hashlib.sha256(scratch_view[:cmd["n"]]).hexdigest()})
        elif c == "exit":
            out({"ok": True})
            break
    te.unregister_memory(addr)
    te.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
