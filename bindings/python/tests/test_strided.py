# SPDX-License-Identifier: Apache-2.0
"""Strided batches from Python (TransferEngine.transfer_strided_sync,
ferry/_strided.py): index lists and numpy arrays move the right bytes,
bounds are refused with the piece named, and detect() recognizes
arithmetic address vectors."""

import array
import mmap
import random
import unittest

from _support import EnvPatch, requires_engine, requires_numpy

from ferry import _strided, errors
from ferry.engine import TransferEngine, TransferOpcode

try:
    import numpy as np
except ImportError:
    np = None

PIECE = 512
PIECES = 300
SIZE = PIECE * PIECES
SMALL = 16     # bytes a piece of the many-windows case
MANY = 50000   # its pieces: 13 windows


class TestDetect(unittest.TestCase):
    def test_lists(self):
        la = array.array("Q", [100, 200, 300])
        ra = array.array("Q", [4096, 4096 + 512, 4096 + 1024])
        ln = array.array("Q", [64] * 3)
        self.assertEqual(_strided.detect(la, ra, ln), (100, 100, 4096, 512, 64))
        self.assertIsNone(_strided.detect(la, array.array("Q", [1, 5, 6]), ln))
        self.assertIsNone(_strided.detect(la, ra, array.array("Q", [64, 64, 1])))
        self.assertIsNone(_strided.detect(array.array("Q", [1]), array.array("Q", [1]), array.array("Q", [1])))

    @requires_numpy
    def test_numpy(self):
        la = np.arange(10, dtype=np.uint64) * 64 + 1000
        ra = np.arange(10, dtype=np.uint64) * 128 + 8192
        ln = np.full(10, 64, dtype=np.uint64)
        self.assertEqual(_strided.detect(la, ra, ln), (1000, 64, 8192, 128, 64))
        ra[3] += 1
        self.assertIsNone(_strided.detect(la, ra, ln))


@requires_engine
class TestStridedTransfer(unittest.TestCase):
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
        # Many small pieces: several windows (4,096 pieces each).
        cls.small_src = mmap.mmap(-1, MANY * SMALL)
        cls.small_dst = mmap.mmap(-1, MANY * SMALL * 2)
        cls.small_src_addr = cls.p.engine.register(cls.small_src)
        cls.small_dst_addr = cls.d.engine.register(cls.small_dst)

    @classmethod
    def tearDownClass(cls):
        cls.p.close()
        cls.d.close()

    def setUp(self):
        self.src[:] = random.Random(self.id()).randbytes(SIZE)
        self.dst[:] = b"\0" * SIZE
        self.slots = random.Random(3).sample(range(PIECES), PIECES)

    def write(self, remote_indices, local_indices=None, n=None):
        return self.p.transfer_strided_sync(self.sid, TransferOpcode.Write, self.src_addr, PIECE,
                                            self.dst_addr, PIECE, PIECE, n=n,
                                            local_indices=local_indices, remote_indices=remote_indices)

    def check(self, slots):
        for i, slot in enumerate(slots):
            self.assertEqual(self.dst[slot * PIECE:(slot + 1) * PIECE], self.src[i * PIECE:(i + 1) * PIECE])

    def test_list_indices(self):
        self.assertEqual(self.write(self.slots), 0, errors.last_error_detail())
        self.check(self.slots)

    @requires_numpy
    def test_numpy_indices_and_read(self):
        idx = np.array(self.slots, dtype=np.int64)
        self.assertEqual(self.write(idx), 0, errors.last_error_detail())
        self.check(self.slots)
        # read back into reversed local pages
        copy = bytes(self.src)
        self.src[:] = b"\0" * SIZE
        back = np.arange(PIECES - 1, -1, -1, dtype=np.uint64)
        rc = self.p.transfer_strided_sync(self.sid, TransferOpcode.Read, self.src_addr, PIECE, self.dst_addr,
                                          PIECE, PIECE, local_indices=back, remote_indices=idx)
        self.assertEqual(rc, 0, errors.last_error_detail())
        for i in range(PIECES):
            j = PIECES - 1 - i
            self.assertEqual(self.src[j * PIECE:(j + 1) * PIECE], copy[i * PIECE:(i + 1) * PIECE])

    def test_no_indices(self):
        self.assertEqual(self.write(None, n=10), 0, errors.last_error_detail())
        self.assertEqual(self.dst[:10 * PIECE], self.src[:10 * PIECE])

    def test_async(self):
        bid = self.p.batch_transfer_async_strided(self.sid, TransferOpcode.Write, self.src_addr, PIECE,
                                                  self.dst_addr, PIECE, PIECE, remote_indices=self.slots)
        self.assertGreater(bid, 0, errors.last_error_detail())
        self.assertEqual(self.p.get_batch_transfer_status([bid]), 0, errors.last_error_detail())
        self.check(self.slots)
        bid = self.p.batch_transfer_async_strided(self.sid, TransferOpcode.Write, self.src_addr, PIECE,
                                                  self.dst_addr, PIECE, PIECE, remote_indices=[0, PIECES])
        self.assertEqual(bid, 0)
        self.assertIn("remote index %d" % PIECES, errors.last_error_detail())

    def test_many_windows(self):
        """50,000 pieces of 16 B to scattered slots of 32 B, sync from a list
        and async from an array: the library runs them window by window."""
        self.small_src[:] = random.Random(5).randbytes(MANY * SMALL)
        for async_ in (False, True):
            self.small_dst[:] = b"\0" * (MANY * SMALL * 2)
            slots = random.Random(7).sample(range(MANY), MANY)
            args = (self.sid, TransferOpcode.Write, self.small_src_addr, SMALL, self.small_dst_addr, 2 * SMALL,
                    SMALL)
            if async_:
                bid = self.p.batch_transfer_async_strided(*args, remote_indices=array.array("Q", slots))
                self.assertGreater(bid, 0, errors.last_error_detail())
                self.assertEqual(self.p.get_batch_transfer_status([bid]), 0, errors.last_error_detail())
            else:
                self.assertEqual(self.p.transfer_strided_sync(*args, remote_indices=slots), 0,
                                 errors.last_error_detail())
            for i, slot in enumerate(slots):
                at = slot * 2 * SMALL
                self.assertEqual(self.small_dst[at:at + SMALL], self.small_src[i * SMALL:(i + 1) * SMALL])
                self.assertEqual(self.small_dst[at + SMALL:at + 2 * SMALL], b"\0" * SMALL)

    def test_out_of_bounds(self):
        rc = self.write([0, 1, PIECES])
        self.assertLess(rc, 0)
        self.assertIn("strided piece 2 of 3 (remote index %d" % PIECES, errors.last_error_detail())
        self.assertEqual(self.dst[:], b"\0" * SIZE)  # refused before any byte moved
        rc = self.write([0, 1], local_indices=[0, PIECES])
        self.assertLess(rc, 0)
        self.assertIn("local index %d" % PIECES, errors.last_error_detail())
        self.assertEqual(self.dst[:], b"\0" * SIZE)  # refused before any byte moved
        rc = self.write([0, -1])
        self.assertEqual(rc, errors.INVALID_ARGUMENT)


if __name__ == "__main__":
    unittest.main()
