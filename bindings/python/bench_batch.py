#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How fast the Python binding turns batch arguments into C vectors.

    FERRY_LIBRARY=build/libferry.so PYTHONPATH=bindings/python \\
        /usr/bin/python3 bindings/python/bench_batch.py [--entries 100000] [--transport shm]

Prints entries a second for each input kind (list of ints, array.array,
numpy uint64, numpy int64, a strided numpy view):

  convert   the conversion alone, as batch_transfer_sync_write does it
            (ferry._vectors: three vectors, zero lengths dropped), and, for the
            async calls, the request array built from them;
  binding   the public calls batch_transfer_sync_write and
            batch_transfer_async_write (all their Python work: checks,
            conversion, ctypes marshalling) with the library's
            ferry_batch_transfer_sync / ferry_batch_submit replaced by a stub
            that returns at once: what the binding costs, without the transfer;
  call      (with --call) the real batch of N pieces of --piece bytes between
            two engines of this process over loopback, beside the same batch
            through the C function with prebuilt vectors.

Not a test: nothing is asserted. Numbers in bindings/python/README.md.
"""

import argparse
import array
import ctypes
import mmap
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ferry  # noqa: E402
from ferry import _lib, _vectors, errors  # noqa: E402
from ferry.engine import TransferEngine  # noqa: E402

try:
    import numpy as np
except ImportError:
    np = None


def best_of(runs, f):
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def inputs(base_src, base_dst, n, piece):
    loc = [base_src + i * piece for i in range(n)]
    rem = [base_dst + (n - 1 - i) * piece for i in range(n)]  # scattered: reversed
    lens = [piece] * n
    kinds = [("list of int", (loc, rem, lens)),
             ("array.array('Q')", tuple(array.array("Q", v) for v in (loc, rem, lens)))]
    if np is not None:
        kinds.append(("numpy uint64", tuple(np.array(v, dtype=np.uint64) for v in (loc, rem, lens))))
        kinds.append(("numpy int64", tuple(np.array(v, dtype=np.int64) for v in (loc, rem, lens))))
        strided = []
        for v in (loc, rem, lens):
            two = np.zeros((n, 2), dtype=np.uint64)
            two[:, 0] = v
            strided.append(two[:, 0])
        kinds.append(("numpy uint64, strided", tuple(strided)))
    return kinds


def convert_sync(args):
    vecs = _vectors.triple(*args)
    assert vecs is not None
    return _vectors.nonzero(*vecs)


def convert_async(args):
    return _vectors.requests(_lib.Request, 1, *convert_sync(args))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=100000)
    ap.add_argument("--piece", type=int, default=64, help="bytes a piece in the 'call' rows")
    ap.add_argument("--transport", default="shm", help="shm, tcp or auto")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--call", action="store_true", help="also time the real transfer")
    a = ap.parse_args()
    n = a.entries

    print("ferry %s, %s, Python %s, numpy %s, %d entries, best of %d"
          % (ferry.core.version(), ferry.library_path(),
             sys.version.split()[0], np.__version__ if np else "absent", n, a.runs))
    print("%-24s %16s %16s" % ("input", "convert sync/s", "convert async/s"))
    kinds = inputs(1 << 40, 1 << 41, n, a.piece)
    for name, args in kinds:
        ts = best_of(a.runs, lambda: convert_sync(args))
        ta = best_of(a.runs, lambda: convert_async(args))
        print("%-24s %13.1f M %13.1f M" % (name, n / ts / 1e6, n / ta / 1e6))

    p, d = TransferEngine(), TransferEngine()
    for te in (p, d):
        if te.initialize("127.0.0.1", "P2PHANDSHAKE", a.transport, "") != 0:
            sys.exit("initialize: %s" % errors.last_error_detail())
    src, dst = mmap.mmap(-1, n * a.piece), mmap.mmap(-1, n * a.piece)
    sa, da = p.engine.register(src), d.engine.register(dst)
    sid = d.get_session_id()
    base = inputs(sa, da, n, a.piece)

    print("\n%-24s %16s %16s" % ("input", "binding sync/s", "binding async/s"))
    with stubbed("ferry_batch_transfer_sync", "ferry_batch_submit"):
        for name, args in base:
            ts = best_of(a.runs, lambda: check(p.batch_transfer_sync_write(sid, *args) == 0))
            ta = best_of(a.runs, lambda: check(p.batch_transfer_async_write(sid, *args) > 0))
            print("%-24s %13.1f M %13.1f M" % (name, n / ts / 1e6, n / ta / 1e6))
    print("\n%-24s %16s %16s" % ("input", "register/s", "unregister/s"))
    with stubbed("ferry_register_batch", "ferry_deregister_batch"):
        for name, args in base:
            tr = best_of(1, lambda: check(p.batch_register_memory(args[0], args[2]) == 0))
            tu = best_of(1, lambda: check(p.batch_unregister_memory(args[0]) == 0))
            print("%-24s %13.1f M %13.1f M" % (name, n / tr / 1e6, n / tu / 1e6))
    p.close()  # frees the async batches the stub left empty
    if not a.call:
        d.close()
        return

    p = TransferEngine()
    p.initialize("127.0.0.1", "P2PHANDSHAKE", a.transport, "")
    sa = p.engine.register(src)
    base = inputs(sa, da, n, a.piece)
    c_fn = _lib.fn("ferry_batch_transfer_sync")
    vecs = tuple(array.array("Q", v) for v in base[0][1])
    c_args = (_vectors.pointer(vecs[0], ctypes.c_void_p), _vectors.pointer(vecs[1], ctypes.c_uint64),
              _vectors.pointer(vecs[2], ctypes.c_size_t))
    t_c = best_of(a.runs, lambda: check(c_fn(p.engine.handle, sid.encode(), 1, *c_args, n) == 0))
    print("\n%d pieces of %d B over %s, batch_transfer_sync_write (the C call alone: %.1f ms)"
          % (n, a.piece, a.transport, t_c * 1e3))
    for name, args in base:
        t = best_of(a.runs, lambda: check(p.batch_transfer_sync_write(sid, *args) == 0))
        print("%-24s %8.1f ms  %6.2f M pieces/s" % (name, t * 1e3, n / t / 1e6))
    p.close()
    d.close()


def check(ok):
    if not ok:
        raise SystemExit("failed: %s" % errors.last_error_detail())


class stubbed:
    """Replaces library functions, as the binding looks them up, by stubs of
    the same prototype that return 0 at once."""

    def __init__(self, *names):
        self.names = names
        self.saved = {}

    def __enter__(self):
        for name in self.names:
            real = _lib.fn(name)
            proto = ctypes.CFUNCTYPE(real.restype, *real.argtypes)
            self.saved[name] = real
            _lib._bound[name] = proto(lambda *args: 0)
        return self

    def __exit__(self, *exc):
        _lib._bound.update(self.saved)


if __name__ == "__main__":
    main()
