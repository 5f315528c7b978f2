# SPDX-License-Identifier: Apache-2.0
"""Buffer objects -> (address, length, pin), without an engine."""

import array
import ctypes
import mmap
import unittest

from _support import HAVE_NUMPY, requires_numpy

import ferry
from ferry import _buffers

if HAVE_NUMPY:
    import numpy as np


class TestResolve(unittest.TestCase):
    def test_int_needs_length(self):
        self.assertEqual(_buffers.resolve(0x1000, 64)[:2], (0x1000, 64))
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(0x1000)
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(-1, 10)
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(1 << 64, 10)
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(0x1000, -5)
        for bad in (None, True, "abc", 1.5, object()):
            with self.assertRaises(ferry.InvalidArgument, msg=repr(bad)):
                _buffers.resolve(bad, 10)

    def test_bytearray_pinned_while_held(self):
        ba = bytearray(100)
        addr, n, pin = _buffers.resolve(ba)
        self.assertEqual(n, 100)
        self.assertEqual(addr, ctypes.addressof((ctypes.c_char * 100).from_buffer(ba)))
        with self.assertRaises(BufferError):
            ba.extend(b"x")  # an export is held: no resize under a transfer
        pin.release()
        ba.extend(b"x")
        self.assertEqual(len(ba), 101)

    def test_length_checked_against_object(self):
        ba = bytearray(100)
        self.assertEqual(_buffers.resolve(ba, 40)[1], 40)
        with self.assertRaises(ferry.InvalidArgument) as cm:
            _buffers.resolve(ba, 101)
        self.assertIn("101", cm.exception.detail)
        self.assertEqual(cm.exception.code, ferry.errors.INVALID_ARGUMENT)

    def test_mmap(self):
        mm = mmap.mmap(-1, 8192)
        addr, n, pin = _buffers.resolve(mm, writable=True)
        self.assertEqual(n, 8192)
        self.assertEqual(addr % mmap.PAGESIZE, 0)
        with self.assertRaises(BufferError):
            mm.close()
        pin.release()
        mm.close()

    def test_ctypes(self):
        buf = (ctypes.c_uint8 * 256)()
        self.assertEqual(_buffers.resolve(buf)[:2], (ctypes.addressof(buf), 256))

        class S(ctypes.Structure):
            _fields_ = [("a", ctypes.c_uint64), ("b", ctypes.c_uint32)]
        s = S()
        self.assertEqual(_buffers.resolve(s)[:2], (ctypes.addressof(s), ctypes.sizeof(S)))
        p = ctypes.cast(buf, ctypes.c_void_p)
        self.assertEqual(_buffers.resolve(p, 16)[:2], (ctypes.addressof(buf), 16))
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(p)  # a pointer has no size
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(ctypes.c_void_p(), 16)  # NULL

    def test_memoryview_and_array(self):
        ba = bytearray(range(50))
        mv = memoryview(ba)[10:20]
        addr, n, pin = _buffers.resolve(mv)
        self.assertEqual(n, 10)
        self.assertEqual(ctypes.string_at(addr, n), bytes(range(10, 20)))
        pin.release()
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(memoryview(ba)[::2])  # not contiguous
        arr = array.array("i", [1, 2, 3])
        self.assertEqual(_buffers.resolve(arr)[1], 3 * arr.itemsize)

    def test_bytes_source_only(self):
        b = b"hello world"
        addr, n, pin = _buffers.resolve(b)
        self.assertEqual(ctypes.string_at(addr, n), b)
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(b, writable=True)

    def test_torch_like(self):
        backing = (ctypes.c_float * 8)()

        class FakeTensor:
            def data_ptr(self):
                return ctypes.addressof(backing)

            def numel(self):
                return 8

            def element_size(self):
                return 4

            def is_contiguous(self):
                return True

        self.assertEqual(_buffers.resolve(FakeTensor())[:2], (ctypes.addressof(backing), 32))

        class Strided(FakeTensor):
            def is_contiguous(self):
                return False
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(Strided())

    def test_address_and_remote(self):
        buf = (ctypes.c_char * 8)()
        self.assertEqual(_buffers.address(buf), ctypes.addressof(buf))
        self.assertEqual(_buffers.address(1234), 1234)
        self.assertEqual(_buffers.remote_address(2 ** 64 - 1), 2 ** 64 - 1)
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.remote_address(2 ** 64)
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.remote_address("0x10")


@requires_numpy
class TestNumpy(unittest.TestCase):
    def test_array(self):
        a = np.arange(16, dtype=np.float32)
        addr, n, pin = _buffers.resolve(a)
        self.assertEqual((addr, n), (a.ctypes.data, 64))
        self.assertIs(pin.obj, a)

    def test_integer_scalars_are_addresses(self):
        self.assertEqual(_buffers.resolve(np.uint64(4096), 8)[:2], (4096, 8))
        self.assertEqual(_buffers.resolve(np.int64(4096), 8)[:2], (4096, 8))

    def test_non_contiguous_and_readonly(self):
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(np.zeros((4, 4))[:, 1])
        ro = np.zeros(4)
        ro.flags.writeable = False
        self.assertEqual(_buffers.resolve(ro)[1], 32)  # fine as a source
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(ro, writable=True)

    def test_length_and_slices(self):
        a = np.zeros(1024, dtype=np.uint8)
        addr, n, _ = _buffers.resolve(a[256:512])
        self.assertEqual((addr, n), (a.ctypes.data + 256, 256))
        with self.assertRaises(ferry.InvalidArgument):
            _buffers.resolve(a, 1025)


if __name__ == "__main__":
    unittest.main()
