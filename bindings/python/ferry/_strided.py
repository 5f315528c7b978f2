# SPDX-License-Identifier: Apache-2.0
"""Strided batches: the common paged-KV shape as one descriptor.

n pieces of piece_len bytes; piece i moves
    local_base  + local_indices[i]  * local_stride   (indices None: i)
to or from
    remote_base + remote_indices[i] * remote_stride  (indices None: i).
Indices may be lists, array.array or numpy integer arrays (uint64 and
non-negative int64 are passed without a copy). The library checks the
bounds once for the whole descriptor and, with a peer speaking protocol 3,
sends the pieces as base, stride, length and indices (the target expands
them after its own bounds check); see ferry.h, "strided batches".

detect() recognizes batches whose addresses already follow such a pattern
(equal lengths, each side an arithmetic progression), so a caller holding
address vectors may send them as a descriptor without any index list.
"""

import ctypes
import operator

from . import _lib, _vectors
from .errors import check, fail, CODES


def _indices(idx, n, what):
    """idx as (vector kept alive, ctypes pointer), or (None, None) for None."""
    if idx is None:
        return None, None
    vec = _vectors.u64(idx, what)
    if vec is None:
        fail(CODES["INVALID_ARGUMENT"],
             "INVALID_ARGUMENT (-1): %s must be non-negative ints below 2**64" % what)
    if len(vec) != n:
        fail(CODES["INVALID_ARGUMENT"],
             "INVALID_ARGUMENT (-1): %s has %d entries for %d pieces" % (what, len(vec), n))
    return vec, _vectors.pointer(vec, ctypes.c_uint64)


def _u64(v, what):
    """v as an int in [0, 2**64): a ctypes field would keep only the low 64
    bits of a larger one (n = 2**64 + 1 taken as 1) and wrap a negative one."""
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        fail(CODES["INVALID_ARGUMENT"], "INVALID_ARGUMENT (-1): %s must be an int, not %s"
             % (what, type(v).__name__))
    v = operator.index(v)
    if not 0 <= v < 1 << 64:
        fail(CODES["INVALID_ARGUMENT"], "INVALID_ARGUMENT (-1): %s = %d is not in [0, 2**64)" % (what, v))
    return v


def descriptor(opcode, local_base, local_stride, remote_base, remote_stride, piece_len, n,
               local_indices=None, remote_indices=None):
    """(ferry_strided_t, the index vectors it points to: keep them alive)."""
    d = _lib.new_struct(_lib.Strided)
    d.opcode = opcode
    d.local_base = _u64(local_base, "local_base")
    d.local_stride = _u64(local_stride, "local_stride")
    d.remote_base = _u64(remote_base, "remote_base")
    d.remote_stride = _u64(remote_stride, "remote_stride")
    d.piece_len = _u64(piece_len, "piece_len")
    n = d.n = _u64(n, "n")
    lv, lp = _indices(local_indices, n, "local_indices")
    rv, rp = _indices(remote_indices, n, "remote_indices")
    if lp is not None:
        d.local_idx = lp
    if rp is not None:
        d.remote_idx = rp
    return d, (lv, rv)


def transfer_sync(engine, peer_bytes, opcode, local_base, local_stride, remote_base, remote_stride,
                  piece_len, n, local_indices=None, remote_indices=None):
    """ferry_strided_transfer_sync on a ferry.Engine (core.Engine)."""
    d, keep = descriptor(opcode, local_base, local_stride, remote_base, remote_stride, piece_len, n,
                         local_indices, remote_indices)
    e = engine._enter()
    try:
        check(_lib.fn("ferry_strided_transfer_sync")(e, peer_bytes, ctypes.byref(d)))
    finally:
        engine._leave()
    del keep


def submit(batch, peer_bytes, opcode, local_base, local_stride, remote_base, remote_stride, piece_len, n,
           local_indices=None, remote_indices=None, timeout_ms=0):
    """ferry_batch_submit_strided into a ferry Batch (core.Engine.batch): the
    index of its first request (piece i is request first + i)."""
    d, keep = descriptor(opcode, local_base, local_stride, remote_base, remote_stride, piece_len, n,
                         local_indices, remote_indices)
    b = batch._begin()
    try:
        with batch._submit_lock:
            first = int(_lib.fn("ferry_batch_submit_strided")(b, peer_bytes, ctypes.byref(d), int(timeout_ms)))
            if first >= 0:
                batch._count = max(batch._count, first + n)
    finally:
        batch._end()
    del keep  # the library copied what it needs before returning
    check(first)
    return first


def detect(la, ra, ln):
    """(local_base, local_stride, remote_base, remote_stride, piece_len) when the
    vectors (from _vectors.triple) describe n >= 2 pieces of one length at
    arithmetic progressions on both sides, else None."""
    n = len(ln)
    if n < 2:
        return None
    if isinstance(ln, type(la)) and hasattr(ln, "dtype"):
        np = __import__("numpy")
        if not (ln == ln[0]).all():
            return None
        ls, rs = int(la[1]) - int(la[0]), int(ra[1]) - int(ra[0])
        if ls < 0 or rs < 0:
            return None
        steps = np.arange(n, dtype=np.uint64)
        if not ((la == np.uint64(la[0]) + steps * np.uint64(ls)).all()
                and (ra == np.uint64(ra[0]) + steps * np.uint64(rs)).all()):
            return None
        return int(la[0]), ls, int(ra[0]), rs, int(ln[0])
    first = ln[0]
    if ln.count(first) != n:
        return None
    ls, rs = la[1] - la[0], ra[1] - ra[0]
    if ls < 0 or rs < 0:
        return None
    if list(la) != list(range(la[0], la[0] + ls * n, ls) if ls else [la[0]] * n):
        return None
    if list(ra) != list(range(ra[0], ra[0] + rs * n, rs) if rs else [ra[0]] * n):
        return None
    return la[0], ls, ra[0], rs, first
