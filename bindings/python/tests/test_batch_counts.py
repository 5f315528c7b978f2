# SPDX-License-Identifier: Apache-2.0
"""Batch arguments are refused, never cut: lists of different lengths fail
(Mooncake-compatible calls return Mooncake's failure value and log to the
"ferry" logger; Ferry's own API raises ValueError), and an int too large for
the C field it fills (2**64 + 1 pieces, a length of 2**64 + 5) is refused
rather than taken for its low 64 bits."""

import ctypes
import unittest

from ferry import core
from ferry.engine import TransferEngine

SIZE = 1 << 16


class BatchCounts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.initiator = TransferEngine()
        cls.target = TransferEngine()
        for te in (cls.initiator, cls.target):
            assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        cls.peer = "127.0.0.1:%d" % cls.target.get_rpc_port()
        cls.src = ctypes.create_string_buffer(b"\x5a" * SIZE, SIZE)
        cls.dst = ctypes.create_string_buffer(SIZE)
        cls.a = ctypes.addressof(cls.src)
        cls.r = ctypes.addressof(cls.dst)
        assert cls.initiator.register_memory(cls.a, SIZE) == 0
        assert cls.target.register_memory(cls.r, SIZE) == 0

    @classmethod
    def tearDownClass(cls):
        for te in (cls.initiator, cls.target):
            te.close()

    def untouched(self):
        self.assertEqual(self.dst.raw, bytes(SIZE))

    def refused_and_logged(self, call, failure):
        with self.assertLogs("ferry", "ERROR") as logs:
            self.assertEqual(call(), failure)
        self.assertTrue(any("differ in count" in line for line in logs.output), logs.output)
        self.untouched()

    def test_mooncake_batch_calls(self):
        te, a, r, peer = self.initiator, self.a, self.r, self.peer
        self.refused_and_logged(lambda: te.batch_transfer_sync_write(
            peer, [a, a + 4096], [r], [4096, 4096]), -1)
        self.refused_and_logged(lambda: te.batch_transfer_sync_read(
            peer, [a], [r, r + 4096], [4096]), -1)
        self.refused_and_logged(lambda: te.batch_transfer_sync_write(
            peer, [a, a + 4096], [r, r + 4096], [4096]), -1)
        self.refused_and_logged(lambda: te.batch_transfer_async_write(
            peer, [a, a + 4096], [r], [4096, 4096]), 0)
        self.refused_and_logged(lambda: te.batch_transfer_write_on_cuda(
            peer, [a, a + 4096], [r], [4096, 4096]), -1)

    def test_mooncake_batch_register(self):
        te = self.target
        buf = ctypes.create_string_buffer(3 * 4096)
        b = ctypes.addressof(buf)
        with self.assertLogs("ferry", "ERROR") as logs:
            self.assertEqual(te.batch_register_memory([b, b + 4096], [4096]), -1)
        self.assertTrue(any("differ in count" in line for line in logs.output), logs.output)
        # Nothing was registered: a write there is refused.
        self.assertNotEqual(self.initiator.transfer_sync_write(self.peer, self.a, b, 64), 0)

    def test_ferry_api_raises_value_error(self):
        eng = self.initiator.engine
        with self.assertRaises(ValueError):
            eng.write_batch(self.peer, [self.a, self.a + 4096], [self.r], [4096, 4096])
        with self.assertRaises(ValueError):
            eng.register_batch([self.a, self.a + 4096], [4096])
        self.untouched()

    def test_ints_wider_than_64_bits_are_refused(self):
        eng = self.initiator.engine
        with self.assertRaises(ValueError):  # was taken as 1 piece
            self.initiator.raise_on_error = True
            try:
                self.initiator.transfer_strided_sync(self.peer, 1, self.a, 64, self.r, 64, 64, n=(1 << 64) + 1)
            finally:
                self.initiator.raise_on_error = False
        with self.assertRaises(ValueError):
            self.initiator.raise_on_error = True
            try:
                self.initiator.transfer_strided_sync(self.peer, 1, self.a, -64, self.r, 64, 64, n=1)
            finally:
                self.initiator.raise_on_error = False
        with self.assertRaises(ValueError):  # a length of 2**64 + 5 was taken as 5
            eng.write_batch(self.peer, [self.a], [self.r], [(1 << 64) + 5])
        self.untouched()
        self.assertIsInstance(eng, core.Engine)


if __name__ == "__main__":
    unittest.main()
