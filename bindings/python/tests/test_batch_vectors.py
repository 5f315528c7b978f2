# SPDX-License-Identifier: Apache-2.0
"""Batch arguments as lists, array.array and numpy arrays (the vector fast
path of ferry/_vectors.py): the right bytes land, zero lengths complete, and
wrong entries give the codes and TypeErrors they always gave. Speed is shown
by bindings/python/bench_batch.py, never asserted here."""

import array
import ctypes
import mmap
import random
import unittest

from _support import EnvPatch, requires_engine, requires_numpy

import ferry
from ferry import _vectors, errors
from ferry.engine import TransferEngine

try:
    import numpy as np
except ImportError:
    np = None

PIECE = 64
PIECES = 256
SIZE = PIECE * PIECES


class TestVectorConversion(unittest.TestCase):
    """_vectors.u64 converts only what the per-entry path would take as is."""

    def test_lists(self):
        self.assertEqual(_vectors.u64([1, 2, 2 ** 64 - 1]).tolist(), [1, 2, 2 ** 64 - 1])
        self.assertEqual(_vectors.u64((5, 6)).tolist(), [5, 6])
        self.assertEqual(_vectors.u64(range(3)).tolist(), [0, 1, 2])
        self.assertEqual(len(_vectors.u64([])), 0)
        for bad in ([1, True], [1, -1], [2 ** 64], [1, 2.0], [1, "2"], [None], [bytearray(8)],
                    (i for i in range(3)), "123", b"123"):
            self.assertIsNone(_vectors.u64(bad), repr(bad))

    def test_array_array(self):
        a = array.array("Q", [1, 2])
        self.assertIs(_vectors.u64(a), a)  # no copy
        self.assertEqual(_vectors.u64(array.array("I", [3, 4])).tolist(), [3, 4])
        self.assertEqual(_vectors.u64(array.array("q", [3, 4])).tolist(), [3, 4])
        self.assertIsNone(_vectors.u64(array.array("q", [3, -4])))
        self.assertIsNone(_vectors.u64(array.array("u", "ab")))
        with self.assertRaises(TypeError):
            _vectors.u64(array.array("d", [1.0]))

    @requires_numpy
    def test_numpy(self):
        a = np.arange(10, dtype=np.uint64)
        self.assertIs(_vectors.u64(a), a)  # contiguous uint64: its own data
        strided = np.arange(20, dtype=np.uint64)[::2]
        self.assertEqual(_vectors.u64(strided).tolist(), list(range(0, 20, 2)))
        self.assertEqual(_vectors.u64(np.arange(4, dtype=np.int32)).tolist(), [0, 1, 2, 3])
        self.assertIsNone(_vectors.u64(np.array([1, -1], dtype=np.int64)))
        self.assertIsNone(_vectors.u64(np.zeros((2, 2), dtype=np.uint64)))
        self.assertIsNone(_vectors.u64(np.array([True])))
        self.assertEqual(_vectors.u64(np.array([1, 2 ** 40], dtype=">u8")).tolist(), [1, 2 ** 40])
        # numpy integer scalars in a list convert too
        self.assertEqual(_vectors.u64([np.uint64(7), np.int64(8)]).tolist(), [7, 8])
        for dt in (np.float64, np.float32, np.complex128):
            with self.assertRaises(TypeError):
                _vectors.u64(np.ones(3, dtype=dt))

    def test_nonzero_and_requests(self):
        la, ra, ln = (array.array("Q", v) for v in ([1, 2, 3], [4, 5, 6], [7, 0, 9]))
        got = _vectors.nonzero(la, ra, ln)
        self.assertEqual([v.tolist() for v in got], [[1, 3], [4, 6], [7, 9]])
        reqs = _vectors.requests(ferry._lib.Request, 1, *got)
        self.assertEqual([(r.opcode, r.local, r.remote, r.len) for r in reqs],
                         [(1, 1, 4, 7), (1, 3, 6, 9)])

    @requires_numpy
    def test_nonzero_and_requests_numpy(self):
        vecs = _vectors.triple(np.array([1, 2, 3], dtype=np.uint64), [4, 5, 6],
                               array.array("Q", [0, 8, 9]))
        got = _vectors.nonzero(*vecs)
        self.assertEqual([v.tolist() for v in got], [[2, 3], [5, 6], [8, 9]])
        reqs = _vectors.requests(ferry._lib.Request, 0, *got)
        self.assertEqual([(r.opcode, r.local, r.remote, r.len) for r in reqs],
                         [(0, 2, 5, 8), (0, 3, 6, 9)])


@requires_engine
class TestBatchInputs(unittest.TestCase):
    """Two TransferEngines on loopback; every input kind moves scattered pieces."""

    @classmethod
    def setUpClass(cls):
        with EnvPatch(FERRY_TIMEOUT_MS="5000", FERRY_CONNECT_TIMEOUT_MS="2000",
                      FERRY_TRANSPORT=None, FERRY_METADATA=None):
            cls.p = TransferEngine()
            cls.d = TransferEngine()
            assert cls.p.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
            assert cls.d.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        cls.src = mmap.mmap(-1, SIZE)
        cls.dst = mmap.mmap(-1, SIZE)
        cls.src_addr = cls.p.engine.register(cls.src)
        cls.dst_addr = cls.d.engine.register(cls.dst)
        cls.sid = cls.d.get_session_id()

    @classmethod
    def tearDownClass(cls):
        cls.p.close()
        cls.d.close()

    def setUp(self):
        self.src[:] = random.Random(self.id()).randbytes(SIZE)
        self.dst[:] = b"\0" * SIZE
        # piece i of src goes to slot perm[i] of dst (scattered on both sides)
        self.perm = list(range(PIECES))
        random.Random(7).shuffle(self.perm)

    def lists(self, count=PIECES):
        loc = [self.src_addr + i * PIECE for i in range(count)]
        rem = [self.dst_addr + self.perm[i] * PIECE for i in range(count)]
        return loc, rem, [PIECE] * count

    def expected(self, lens=None):
        out = bytearray(SIZE)
        for i, slot in enumerate(self.perm):
            n = PIECE if lens is None else lens[i]
            out[slot * PIECE:slot * PIECE + n] = self.src[i * PIECE:i * PIECE + n]
        return bytes(out)

    def check_write(self, loc, rem, lens, expect_lens=None, call="sync"):
        if call == "sync":
            rc = self.p.batch_transfer_sync_write(self.sid, loc, rem, lens)
        else:
            bid = self.p.batch_transfer_async_write(self.sid, loc, rem, lens)
            self.assertGreater(bid, 0, errors.last_error_detail())
            rc = self.p.get_batch_transfer_status([bid])
        self.assertEqual(rc, 0, errors.last_error_detail())
        self.assertEqual(bytes(self.dst), self.expected(expect_lens))

    def test_list(self):
        self.check_write(*self.lists())

    def test_list_async(self):
        self.check_write(*self.lists(), call="async")

    def test_array_array(self):
        loc, rem, lens = self.lists()
        self.check_write(array.array("Q", loc), array.array("Q", rem), array.array("I", lens))

    def test_tuples_and_mixed_kinds(self):
        loc, rem, lens = self.lists()
        self.check_write(tuple(loc), array.array("Q", rem), lens, call="async")

    @requires_numpy
    def test_numpy_uint64(self):
        loc, rem, lens = self.lists()
        self.check_write(np.array(loc, dtype=np.uint64), np.array(rem, dtype=np.uint64),
                         np.array(lens, dtype=np.uint64))

    @requires_numpy
    def test_numpy_async_and_mixed(self):
        loc, rem, lens = self.lists()
        self.check_write(np.array(loc, dtype=np.uint64), rem, np.array(lens, dtype=np.int64),
                         call="async")

    @requires_numpy
    def test_numpy_non_contiguous_and_other_dtypes(self):
        loc, rem, lens = self.lists()
        # every other column of a 2-D array: strided views
        loc2 = np.zeros((PIECES, 2), dtype=np.uint64)
        loc2[:, 0] = loc
        rem2 = np.zeros((2, PIECES), dtype=np.int64).T
        rem2[:, 1] = rem
        self.assertFalse(loc2[:, 0].flags["C_CONTIGUOUS"])
        self.check_write(loc2[:, 0], rem2[:, 1], np.array(lens, dtype=np.uint32))

    @requires_numpy
    def test_strict_engine_and_read_only_arrays(self):
        loc, rem, lens = self.lists()
        arrs = [np.array(v, dtype=np.uint64) for v in (loc, rem, lens)]
        for a in arrs:
            a.flags.writeable = False
        self.p.engine.write_batch(self.sid, *arrs)
        self.assertEqual(bytes(self.dst), self.expected())
        bad = np.array(rem, dtype=np.int64)
        bad[0] = -1
        with self.assertRaises(ferry.InvalidArgument):
            self.p.engine.write_batch(self.sid, arrs[0], bad, arrs[2])
        with self.assertRaises(TypeError):
            self.p.engine.write_batch(self.sid, arrs[0], arrs[1], arrs[2].astype(np.float64))

    @requires_numpy
    def test_numpy_scalars_in_lists(self):
        loc, rem, lens = self.lists()
        self.check_write([np.uint64(a) for a in loc], rem, [np.int32(n) for n in lens])

    def test_zero_lengths_complete(self):
        loc, rem, lens = self.lists()
        lens = [0 if i % 3 == 0 else PIECE for i in range(PIECES)]
        self.check_write(loc, rem, lens, lens)
        self.dst[:] = b"\0" * SIZE
        self.check_write(array.array("Q", loc), rem, lens, lens, call="async")
        bid = self.p.batch_transfer_async_write(self.sid, loc, rem, [0] * PIECES)
        self.assertGreater(bid, 0)
        self.assertEqual(self.p.transfer_check_status(bid), 1)

    @requires_numpy
    def test_zero_lengths_complete_numpy(self):
        loc, rem, lens = self.lists()
        lens = [0 if i % 5 == 1 else PIECE for i in range(PIECES)]
        self.check_write(np.array(loc, np.uint64), np.array(rem, np.uint64),
                         np.array(lens, np.uint64), lens)

    @requires_numpy
    def test_read(self):
        # dst (the peer) -> src (local), numpy on the sync path, a list on the async one
        self.dst[:] = random.Random(3).randbytes(SIZE)
        loc, rem, lens = self.lists()
        rc = self.p.batch_transfer_sync_read(self.sid, np.array(loc, np.uint64),
                                             np.array(rem, np.uint64), np.array(lens, np.uint64))
        self.assertEqual(rc, 0, errors.last_error_detail())
        for i, slot in enumerate(self.perm):
            self.assertEqual(self.src[i * PIECE:(i + 1) * PIECE],
                             self.dst[slot * PIECE:(slot + 1) * PIECE])
        self.src[:] = b"\0" * SIZE
        bid = self.p.batch_transfer_async_read(self.sid, loc, rem, lens)
        self.assertGreater(bid, 0, errors.last_error_detail())
        self.assertEqual(self.p.get_batch_transfer_status([bid]), 0)
        self.assertEqual(self.src[7 * PIECE:8 * PIECE],
                         self.dst[self.perm[7] * PIECE:(self.perm[7] + 1) * PIECE])

    def test_many_entries(self):
        # A 100,000-entry batch of 8-byte pieces, converted once, moved once.
        n = 100000
        loc = [self.src_addr + (i % (SIZE // 8)) * 8 for i in range(n)]
        rem = [self.dst_addr + (i % (SIZE // 8)) * 8 for i in range(n)]
        self.assertEqual(self.p.batch_transfer_sync_write(self.sid, loc, rem, [8] * n), 0,
                         errors.last_error_detail())
        self.assertEqual(bytes(self.dst), bytes(self.src))

    # ------------------------------------------------------------ bad entries
    @requires_numpy
    def test_negative_int64_is_an_error(self):
        loc, rem, lens = self.lists()
        bad = np.array(rem, dtype=np.int64)
        bad[5] = -64
        self.assertEqual(self.p.batch_transfer_sync_write(self.sid, loc, bad, lens),
                         errors.INVALID_ARGUMENT)
        self.assertIn("peer address 5", errors.last_error_detail())
        bad_lens = np.array(lens, dtype=np.int64)
        bad_lens[9] = -1
        self.assertEqual(self.p.batch_transfer_sync_write(self.sid, loc, rem, bad_lens),
                         errors.INVALID_ARGUMENT)
        self.assertEqual(self.p.batch_transfer_async_write(self.sid, loc, bad, lens), 0)
        self.assertEqual(errors.last_error_code(), errors.INVALID_ARGUMENT)
        self.assertIsInstance(ferry.last_error(), ferry.FerryError)
        self.assertEqual(bytes(self.dst), b"\0" * SIZE)  # nothing written

    @requires_numpy
    def test_float_arrays_raise_type_error(self):
        loc, rem, lens = self.lists()
        for args in ((np.array(loc, dtype=np.float64), rem, lens),
                     (loc, np.array(rem, dtype=np.float64), lens),
                     (loc, rem, np.array(lens, dtype=np.float32))):
            with self.assertRaises(TypeError):
                self.p.batch_transfer_sync_write(self.sid, *args)
            with self.assertRaises(TypeError):
                self.p.batch_transfer_async_write(self.sid, *args)
        self.assertEqual(bytes(self.dst), b"\0" * SIZE)

    def test_wrong_entries_in_lists(self):
        loc, rem, lens = self.lists()
        with self.assertRaises(TypeError):
            self.p.batch_transfer_sync_write(self.sid, loc, rem[:-1] + [float(rem[-1])], lens)
        with self.assertRaises(TypeError):
            self.p.batch_transfer_async_write(self.sid, loc, rem, lens[:-1] + ["64"])
        with self.assertRaises(TypeError):
            self.p.batch_transfer_sync_write(self.sid, loc, rem[:3] + [True] + rem[4:], lens)
        neg = rem[:]
        neg[2] = -1
        self.assertEqual(self.p.batch_transfer_sync_write(self.sid, loc, neg, lens),
                         errors.INVALID_ARGUMENT)
        self.assertEqual(self.p.batch_transfer_sync_write(self.sid, loc, rem, lens[:-1]),
                         errors.INVALID_ARGUMENT)
        self.assertEqual(self.p.batch_transfer_async_write(self.sid, loc, rem[:-1], lens), 0)
        self.assertEqual(bytes(self.dst), b"\0" * SIZE)

    def test_library_refusal_from_the_fast_path(self):
        # All ints, so the vector path runs; the library refuses an unregistered range.
        loc, rem, lens = self.lists()
        rem[4] = self.dst_addr + SIZE + 4096
        self.assertEqual(self.p.batch_transfer_sync_write(self.sid, loc, rem, lens),
                         errors.ADDRESS_NOT_REGISTERED)
        self.assertNotEqual(errors.last_error_detail(), "")

    def test_buffer_objects_still_work(self):
        # Local buffers given as objects take the per-entry path (pinned).
        bufs = [bytearray(b"%02d" % i * 32) for i in range(4)]
        for b in bufs:
            self.p.engine.register(b)
        try:
            rem = [self.dst_addr + i * PIECE for i in range(4)]
            self.assertEqual(self.p.batch_transfer_sync_write(self.sid, bufs, rem, [PIECE] * 4), 0,
                             errors.last_error_detail())
            self.assertEqual(self.dst[:4 * PIECE], b"".join(bufs))
        finally:
            for b in bufs:
                self.p.engine.deregister(b)


@requires_engine
class TestBatchRegistration(unittest.TestCase):
    def setUp(self):
        with EnvPatch(FERRY_TRANSPORT=None, FERRY_METADATA=None):
            self.te = TransferEngine()
            assert self.te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        self.bufs = [(ctypes.c_char * 4096)() for _ in range(64)]
        self.addrs = [ctypes.addressof(b) for b in self.bufs]

    def tearDown(self):
        self.te.close()

    def check(self, addrs, caps):
        before = self.te.engine.region_count
        self.assertEqual(self.te.batch_register_memory(addrs, caps), 0,
                         errors.last_error_detail())
        self.assertEqual(self.te.engine.region_count, before + 64)
        self.assertEqual(self.te.engine.region_info(self.addrs[9] + 10).len, 4096)
        self.assertEqual(self.te.batch_unregister_memory(addrs), 0, errors.last_error_detail())
        self.assertEqual(self.te.engine.region_count, before)

    def test_lists(self):
        self.check(self.addrs, [4096] * 64)

    def test_array_and_generator(self):
        self.check(array.array("Q", self.addrs), (4096 for _ in range(64)))

    @requires_numpy
    def test_numpy(self):
        self.check(np.array(self.addrs, np.uint64), np.full(64, 4096, dtype=np.int64))

    def test_all_or_nothing(self):
        before = self.te.engine.region_count
        caps = [4096] * 64
        caps[10] = 8192  # overlaps the next buffer, if adjacent; else fine: make it certain
        addrs = self.addrs[:]
        addrs[11] = addrs[10] + 100
        self.assertEqual(self.te.batch_register_memory(addrs, caps), errors.ADDRESS_OVERLAPPED)
        self.assertEqual(self.te.engine.region_count, before)
        with self.assertRaises(TypeError):
            self.te.batch_register_memory(self.addrs, np.ones(64) if np else [4096.0] * 64)


if __name__ == "__main__":
    unittest.main()
