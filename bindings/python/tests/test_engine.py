# SPDX-License-Identifier: Apache-2.0
"""ferry.Engine and ferry.TransferEngine against a second engine in this process."""

import ctypes
import mmap
import os
import random
import threading
import time
import unittest

from _support import HAVE_NUMPY, EnvPatch, requires_engine, requires_numpy

import ferry
from ferry import errors
from ferry.engine import TransferEngine, TransferNotify, TransferOpcode

if HAVE_NUMPY:
    import numpy as np

MiB = 1 << 20


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
FAST = dict(timeout_ms=5000, connect_timeout_ms=2000)


def pattern(n, seed):
    return random.Random(seed).randbytes(n)


def wait_for(pred, timeout=5.0, step=0.01):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


class FakeDevice:
    """Fake device memory (the C tests' kind): a PROT_NONE mapping of a memfd,
    declared to libferry with a read-write alias of the same pages."""

    def __init__(self, length):
        try:
            ferry._lib.lib().ferry_memkind_fake_add
        except AttributeError:
            raise unittest.SkipTest("this libferry.so does not export the fake device hooks "
                                    "(internal symbols hidden); test_memkind covers them in C")
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.libc = libc
        self.len = length
        fd = os.memfd_create("ferry-fake-device")
        try:
            os.ftruncate(fd, length)
            self.base = libc.mmap(None, length, mmap.PROT_NONE if hasattr(mmap, "PROT_NONE") else 0,
                                  mmap.MAP_SHARED, fd, 0)
            self.alias = libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED,
                                   fd, 0)
        finally:
            os.close(fd)
        if self.base in (None, ctypes.c_void_p(-1).value) or self.alias in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        add = ferry._lib.lib().ferry_memkind_fake_add
        add.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        add.restype = ctypes.c_int
        assert add(self.base, length, self.alias) == 0

    def fill(self, off, data):
        ctypes.memmove(self.alias + off, data, len(data))

    def alias_bytes(self, off, n):
        return ctypes.string_at(self.alias + off, n)

    def close(self):
        rm = ferry._lib.lib().ferry_memkind_fake_remove
        rm.argtypes = [ctypes.c_void_p]
        rm.restype = None
        rm(self.base)
        self.libc.munmap(self.base, self.len)
        self.libc.munmap(self.alias, self.len)


@requires_engine
class TestEngine(unittest.TestCase):
    """The strict API: two engines on loopback, one process."""

    @classmethod
    def setUpClass(cls):
        cls.a = ferry.Engine(host="127.0.0.1", port=0, transport="tcp", **FAST)
        cls.b = ferry.Engine(host="127.0.0.1", port=0, transport="tcp", **FAST)
        cls.a_buf = bytearray(2 * MiB)
        cls.b_buf = mmap.mmap(-1, 2 * MiB)
        cls.a_addr = cls.a.register(cls.a_buf)
        cls.b_addr = cls.b.register(cls.b_buf)

    @classmethod
    def tearDownClass(cls):
        cls.a.close()
        cls.b.close()

    def test_cancel_one_request(self):
        batch = self.a.batch(2)
        batch.submit(self.b.name, [(ferry.WRITE, self.a_addr, self.b_addr, MiB),
                                   (ferry.WRITE, self.a_addr + MiB, self.b_addr + MiB, MiB)])
        batch.cancel_request(0)  # returns once nothing of it can land any more
        self.assertIn(batch.status(0).state, (ferry.STATUS_CANCELLED, ferry.STATUS_COMPLETED))
        with self.assertRaises(ferry.FerryError) as cm:
            batch.cancel_request(5)
        self.assertEqual(cm.exception.code, errors.NOT_FOUND)
        try:
            batch.wait(5000)
        except ferry.CancelError:
            pass
        self.assertTrue(batch.status(1).ok)
        batch.free()

    def test_identity(self):
        self.assertEqual(self.a.name, "127.0.0.1:%d" % self.a.port)
        self.assertGreater(self.a.port, 0)
        self.assertNotEqual(self.a.epoch, self.b.epoch)
        self.assertNotEqual(self.a.handle, 0)
        self.assertEqual(self.a.config["transport"], "tcp")
        self.assertIn("127.0.0.1", repr(self.a))

    def test_write_then_read_back(self):
        data = pattern(MiB, 1)
        self.a_buf[:MiB] = data
        self.a.write(self.b.name, self.a_addr, self.b_addr, MiB)
        self.assertEqual(self.b_buf[:MiB], data)
        self.a_buf[:MiB] = bytes(MiB)
        self.a.read(self.b.name, self.a_addr, self.b_addr, MiB)
        self.assertEqual(bytes(self.a_buf[:MiB]), data)

    def test_objects_as_local_buffers(self):
        # A sub-range of a registered region given as a memoryview.
        view = memoryview(self.a_buf)[4096:8192]
        view[:] = pattern(4096, 2)
        self.a.write(self.b.name, view, self.b_addr + 8192)
        self.assertEqual(self.b_buf[8192:12288], bytes(view))
        view.release()

    def test_batch_sync(self):
        pages = [(i * 65536, (15 - i) * 65536) for i in range(16)]
        self.a_buf[:MiB] = pattern(MiB, 3)
        self.a.write_batch(self.b.name, [self.a_addr + s for s, _ in pages],
                           [self.b_addr + d for _, d in pages], [65536] * 16)
        for s, d in pages:
            self.assertEqual(self.b_buf[d:d + 65536], bytes(self.a_buf[s:s + 65536]))
        self.a.write_batch(self.b.name, [], [], [])  # empty: nothing to do

    def _small_pieces(self, n=1000, block=2048):
        """n pieces of block bytes, piece i into slot (7 i + 3) mod n."""
        self.a_buf[:n * block] = pattern(n * block, 4)
        slots = [(i * 7 + 3) % n for i in range(n)]
        return ([self.a_addr + i * block for i in range(n)], [self.b_addr + s * block for s in slots],
                [block] * n, slots)

    def _check_small(self, slots, block=2048):
        for i, s in enumerate(slots):
            self.assertEqual(self.b_buf[s * block:(s + 1) * block], bytes(self.a_buf[i * block:(i + 1) * block]))

    def test_batch_of_small_pieces_from_int_lists(self):
        # Lists of ints take the fast conversion (no per-entry Python work).
        locals_, remotes, lens, slots = self._small_pieces()
        self.b_buf[:len(slots) * 2048] = bytes(len(slots) * 2048)
        self.a.write_batch(self.b.name, locals_, remotes, lens)
        self._check_small(slots)
        # A bad entry still gets its own message (the slow path explains it).
        with self.assertRaises(ferry.FerryError) as cm:
            self.a.write_batch(self.b.name, locals_[:2], [remotes[0], -5], lens[:2])
        self.assertIn("peer address 1", str(cm.exception))

    @requires_numpy
    def test_batch_of_small_pieces_from_numpy(self):
        locals_, remotes, lens, slots = self._small_pieces()
        self.b_buf[:len(slots) * 2048] = bytes(len(slots) * 2048)
        self.a.write_batch(self.b.name, np.array(locals_, dtype=np.uint64), np.array(remotes, dtype=np.uint64),
                           np.array(lens, dtype=np.uint64))
        self._check_small(slots)
        self.b_buf[:len(slots) * 2048] = bytes(len(slots) * 2048)
        self.a.write_batch(self.b.name, np.array(locals_), np.array(remotes), np.array(lens))  # int64
        self._check_small(slots)
        with self.assertRaises(ferry.FerryError) as cm:
            self.a.write_batch(self.b.name, np.array(locals_[:2]), np.array([remotes[0], -5]), np.array(lens[:2]))
        self.assertIn("peer address 1", str(cm.exception))

    def test_async_batch_and_status(self):
        self.a_buf[:MiB] = pattern(MiB, 4)
        with self.a.batch(8) as b:
            first = b.submit(self.b.name, [(ferry.WRITE, self.a_addr + i * 131072,
                                            self.b_addr + i * 131072, 131072) for i in range(8)])
            self.assertEqual(first, 0)
            self.assertEqual(len(b), 8)
            self.assertTrue(wait_for(b.done, 10))
            st = b.statuses()
            self.assertTrue(all(s.ok and s.bytes == 131072 for s in st), st)
            self.assertEqual(st[0].state_name, "COMPLETED")
            b.wait(1000)
        self.assertEqual(self.b_buf[:MiB], bytes(self.a_buf[:MiB]))
        with self.assertRaises(errors.NotFound):
            b.status(0)  # freed on exit

    def test_batch_capacity(self):
        with self.a.batch(2) as b:
            with self.assertRaises(ferry.TooManyRequests):
                b.submit(self.b.name, [(ferry.WRITE, self.a_addr, self.b_addr, 64)] * 3)

    def test_unregistered_remote(self):
        with self.assertRaises(ferry.AddressNotRegistered) as cm:
            self.a.write(self.b.name, self.a_addr, self.b_addr + 64 * MiB, 4096)
        e = cm.exception
        self.assertEqual(e.code, -3)
        self.assertFalse(e.retryable)
        self.assertIn(self.b.name, e.detail)
        self.assertEqual(errors.last_error_detail(), e.detail)

    def test_unregistered_local(self):
        other = bytearray(4096)
        with self.assertRaises(ferry.AddressNotRegistered) as cm:
            self.a.write(self.b.name, other, self.b_addr)
        self.assertIn("local", cm.exception.detail)

    def test_out_of_bounds(self):
        with self.assertRaises(ferry.OutOfBounds) as cm:
            self.a.write(self.b.name, self.a_addr, self.b_addr + 2 * MiB - 100, 4096)
        self.assertEqual(cm.exception.code, errors.OUT_OF_BOUNDS)

    def test_bad_arguments(self):
        with self.assertRaises(ferry.InvalidArgument):
            self.a.transfer(self.b.name, 7, self.a_addr, self.b_addr, 64)
        with self.assertRaises(ferry.InvalidArgument):
            self.a.write("", self.a_addr, self.b_addr, 64)
        with self.assertRaises(ferry.InvalidArgument):
            self.a.write_batch(self.b.name, [self.a_addr], [self.b_addr, 0], [64])
        with self.assertRaises(ferry.InvalidArgument):
            self.a.write(self.b.name, bytearray(10), self.b_addr, 11)  # longer than the object

    def test_register_errors(self):
        with self.assertRaises(ferry.AddressOverlapped):
            self.a.register(self.a_addr + 4096, 4096)
        with self.assertRaises(ferry.AddressNotRegistered):
            self.a.deregister(self.a_addr + 12345)
        extra = bytearray(8192)
        addr = self.a.register(extra)
        with self.assertRaises(BufferError):
            extra.extend(b"x")  # pinned while registered
        self.a.deregister(extra)
        extra.extend(b"x")
        self.assertFalse(self.a.is_registered(addr))

    def test_register_batch_all_or_nothing(self):
        bufs = [bytearray(4096) for _ in range(3)]
        n0 = self.a.region_count
        addrs = self.a.register_batch(bufs)
        self.assertEqual(self.a.region_count, n0 + 3)
        self.a.deregister_batch(addrs)
        self.assertEqual(self.a.region_count, n0)
        with self.assertRaises(ferry.AddressOverlapped):
            self.a.register_batch([bufs[0], self.a_addr], [4096, 4096])
        self.assertEqual(self.a.region_count, n0)
        bufs[0].extend(b"x")  # its pin was released with the failure

    def test_segments_and_session(self):
        segs = self.a.segments(self.b.name)
        self.assertIn(self.b_addr, [s.addr for s in segs])
        self.assertEqual([s.addr for s in segs], sorted(s.addr for s in segs))
        info = self.a.session_info(self.b.name)
        self.assertEqual(info.epoch, self.b.epoch)
        self.assertEqual(info.transport, "tcp")
        self.assertEqual(info.pid, os.getpid())
        self.a.close_session(self.b.name)
        self.a.open_session(self.b.name)

    def test_ping_and_metrics(self):
        self.assertGreaterEqual(self.a.ping(self.b.name), 0)
        with self.assertRaises(ferry.FerryConnectionError):
            self.a.ping("127.0.0.1:1")
        self.a.write(self.b.name, self.a_addr, self.b_addr, 4096)
        mine = [m for m in self.a.metrics() if m.peer == self.b.name]
        self.assertEqual(len(mine), 1, self.a.metrics())
        self.assertGreaterEqual(mine[0].requests[ferry.WRITE], 1)
        self.assertGreaterEqual(mine[0].bytes[ferry.WRITE], 4096)
        self.assertEqual(mine[0].transport, "tcp")
        self.assertGreaterEqual(self.a.transport_metrics("tcp").requests[ferry.WRITE], 1)
        text = self.a.metrics_prometheus()
        self.assertIn("ferry", text)
        self.assertIn(self.b.name, text)
        self.assertEqual(self.a.metrics_port, 0)

    def test_unreachable_peer(self):
        t0 = time.monotonic()
        with self.assertRaises(ferry.FerryConnectionError) as cm:
            self.a.write("127.0.0.1:1", self.a_addr, self.b_addr, 64)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertTrue(cm.exception.retryable)

    def test_notify(self):
        self.a.notify(self.b.name, b"raw bytes")
        self.a.notify(self.b.name, "named", name="prefill-7")
        got = wait_for(lambda: self.b.notifications() or None, 5)
        got = list(got or [])
        while len(got) < 2:
            more = wait_for(lambda: self.b.notifications() or None, 5)
            if not more:
                break
            got += more
        self.assertEqual([(n.peer, n.msg, n.name) for n in got],
                         [(self.a.name, b"raw bytes", None), (self.a.name, b"named", "prefill-7")])
        with self.assertRaises(ferry.InvalidArgument):
            self.a.notify(self.b.name, b"x" * (64 * 1024 + 1))

    def test_threads(self):
        # Calls release the GIL and are thread-safe: concurrent writes to disjoint pages.
        errs = []

        def worker(i):
            try:
                for _ in range(5):
                    self.a.write(self.b.name, self.a_addr + i * 65536, self.b_addr + i * 65536,
                                 65536)
            except Exception as exc:  # pragma: no cover - reported below
                errs.append(exc)
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errs, [])


@requires_engine
class TestEngineLifetime(unittest.TestCase):
    def test_close_is_idempotent_and_final(self):
        e = ferry.Engine(host="127.0.0.1", **FAST)
        buf = bytearray(4096)
        e.register(buf)
        e.close()
        e.close()
        buf.extend(b"x")  # registration pins released
        with self.assertRaises(ferry.ContextError):
            e.register(bytearray(10))

    def test_env_config_and_overrides(self):
        with EnvPatch(FERRY_TIMEOUT_MS="1234", FERRY_TRANSPORT="tcp"):
            with ferry.Engine(host="127.0.0.1") as e:
                self.assertEqual(e.config["timeout_ms"], 1234)
            with ferry.Engine(host="127.0.0.1", timeout_ms=777) as e:
                self.assertEqual(e.config["timeout_ms"], 777)
            with ferry.Engine(host="127.0.0.1", env=False) as e:
                self.assertEqual(e.config["timeout_ms"], 30000)
        with EnvPatch(FERRY_TIMEOUT_MS="soon"):
            with self.assertRaises(ferry.InvalidArgument) as cm:
                ferry.Engine(host="127.0.0.1")
            self.assertIn("FERRY_TIMEOUT_MS", cm.exception.detail)
        with self.assertRaises(TypeError):
            ferry.Engine(host="127.0.0.1", no_such_field=1)

    def test_metrics_endpoint(self):
        try:
            e = ferry.Engine(host="127.0.0.1", metrics_port=-1)
        except (ferry.FerryNotImplemented, ferry.DeviceNotFound) as exc:
            self.skipTest("no metrics endpoint in this build: %s" % exc)
        with e:
            port = e.metrics_port
            if port == 0:
                self.skipTest("no metrics endpoint in this build")
            import urllib.request
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
                self.assertIn("ferry", r.read().decode())

    def test_port_in_use(self):
        with ferry.Engine(host="127.0.0.1") as e:
            with self.assertRaises(ferry.FerryError) as cm:
                ferry.Engine(host="127.0.0.1", port=e.port)
            self.assertLess(cm.exception.code, 0)

    def test_batch_dropped_while_running_is_cancelled(self):
        with ferry.Engine(host="127.0.0.1", **FAST) as a, \
                ferry.Engine(host="127.0.0.1", **FAST) as b:
            src = bytearray(4 * MiB)
            dst = bytearray(4 * MiB)
            a.register(src)
            rb = b.register(dst)
            batch = a.batch(4)
            batch.submit(b.name, [(ferry.WRITE, src, rb, 4 * MiB)])
            # Engine close with a live batch: cancelled, freed, no hang.
        self.assertTrue(batch._freed)


@requires_engine
class TestTransferEngineLocal(unittest.TestCase):
    """The Mooncake API in one process (the two-process version is test_pd_pair)."""

    @classmethod
    def setUpClass(cls):
        with EnvPatch(FERRY_TIMEOUT_MS="5000", FERRY_CONNECT_TIMEOUT_MS="2000",
                      FERRY_TRANSPORT=None, FERRY_METADATA=None):
            cls.p = TransferEngine()
            cls.d = TransferEngine()
            assert cls.p.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
            assert cls.d.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
        cls.src = (ctypes.c_char * MiB)()
        cls.dst = (ctypes.c_char * MiB)()
        cls.src_addr = ctypes.addressof(cls.src)
        cls.dst_addr = ctypes.addressof(cls.dst)
        assert cls.p.register_memory(cls.src_addr, MiB) == 0
        assert cls.d.register_memory(cls.dst_addr, MiB) == 0

    @classmethod
    def tearDownClass(cls):
        cls.p.close()
        cls.d.close()

    def test_ids(self):
        port = self.d.get_rpc_port()
        self.assertGreater(port, 0)
        self.assertEqual(self.d.get_session_id(), "127.0.0.1:%d" % port)
        self.assertEqual(self.p.get_first_buffer_address(self.d.get_session_id()), self.dst_addr)
        self.assertNotEqual(self.p.get_engine_ptr(), 0)
        self.assertIsInstance(self.p.get_engine(), ferry.Engine)

    def test_first_buffer_is_the_first_registered(self):
        """Mooncake's buffers[0]: the earliest registration still there, not the lowest address
        (a caller writes at first + offset within the buffer it registered first)."""
        te = TransferEngine()
        with EnvPatch(FERRY_TIMEOUT_MS="5000", FERRY_TRANSPORT=None, FERRY_METADATA=None):
            self.assertEqual(te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        mem = (ctypes.c_char * (3 * MiB))()
        low, mid, high = (ctypes.addressof(mem) + k * MiB for k in range(3))
        try:
            name = te.get_session_id()
            self.assertEqual(self.p.get_first_buffer_address(name), 0)
            self.assertEqual(te.register_memory(mid, MiB), 0)
            self.assertEqual(te.register_memory(low, MiB), 0)
            self.assertEqual(te.register_memory(high, MiB), 0)
            self.assertEqual(self.p.get_first_buffer_address(name), mid)
            self.assertEqual(te.unregister_memory(mid), 0)
            self.assertEqual(self.p.get_first_buffer_address(name), low)
            self.assertEqual(te.register_memory(mid, MiB), 0)  # again: now the last one
            self.assertEqual(self.p.get_first_buffer_address(name), low)
            self.assertEqual(te.get_first_buffer_address(name), low)  # its own segment too
        finally:
            te.close()

    def test_rdma_fell_back(self):
        self.assertIn(self.d.engine.config["transport"], ("auto", "rdma"))
        for proto in ("rdma", "shm"):
            te = TransferEngine()
            with EnvPatch(FERRY_TRANSPORT=None):
                with self.assertLogs("ferry", "WARNING") if self._lacks(proto) else _nothing():
                    self.assertEqual(te.initialize("127.0.0.1", "P2PHANDSHAKE", proto, ""), 0)
            te.close()
            strict = TransferEngine(transport_fallback=False)
            with EnvPatch(FERRY_TRANSPORT=None):
                rc = strict.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "")
            if rc == 0:  # this build has the transport: nothing to fall back from
                strict.close()
            else:
                self.assertLess(rc, 0)
                self.assertIn(proto, errors.last_error_detail())

    @staticmethod
    def _lacks(transport):
        try:
            ferry.Engine(host="127.0.0.1", transport=transport).close()
            return False
        except ferry.FerryError:
            return True

    def test_explicit_port(self):
        probe = ferry.Engine(host="127.0.0.1")
        port = probe.port
        probe.close()
        te = TransferEngine()
        self.assertEqual(te.initialize("127.0.0.1:%d" % port, "P2PHANDSHAKE", "tcp", ""), 0)
        self.assertEqual(te.get_rpc_port(), port)
        self.assertEqual(te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""),
                         errors.INVALID_ARGUMENT)  # twice
        te.close()

    def test_sync_write_read(self):
        sid = self.d.get_session_id()
        self.src[:4096] = pattern(4096, 10)
        self.assertEqual(self.p.transfer_sync_write(sid, self.src_addr, self.dst_addr, 4096), 0)
        self.assertEqual(self.dst[:4096], self.src[:4096])
        self.dst[:4096] = pattern(4096, 11)
        self.assertEqual(self.p.transfer_sync_read(sid, self.src_addr, self.dst_addr, 4096), 0)
        self.assertEqual(self.src[:4096], self.dst[:4096])
        self.assertEqual(self.p.transfer_sync(sid, self.src_addr, self.dst_addr, 64,
                                              TransferOpcode.Write), 0)

    def test_error_codes(self):
        sid = self.d.get_session_id()
        self.assertEqual(self.p.transfer_sync_write(sid, self.src_addr, self.dst_addr + 4 * MiB, 64),
                         -3)
        self.assertIn("ADDRESS_NOT_REGISTERED", errors.last_error_detail())
        self.assertEqual(errors.last_error_code(), -3)
        self.assertEqual(self.p.transfer_sync_write(sid, self.src_addr, self.dst_addr, 64), 0)
        self.assertEqual((errors.last_error_code(), errors.last_error_detail()), (0, ""))
        self.assertEqual(self.p.transfer_sync_write(sid, self.src_addr, self.dst_addr + MiB - 10, 64),
                         errors.OUT_OF_BOUNDS)
        unreg = (ctypes.c_char * 64)()
        self.assertEqual(self.p.transfer_sync_write(sid, ctypes.addressof(unreg), self.dst_addr, 64),
                         -3)
        self.assertEqual(self.p.batch_transfer_sync_write(sid, [self.src_addr], [], [64]), -1)
        self.assertEqual(self.p.register_memory(self.src_addr, 64), errors.ADDRESS_OVERLAPPED)
        self.assertEqual(self.p.unregister_memory(self.src_addr + 1), -3)
        strict = TransferEngine(raise_on_error=True, engine=self.p.engine)  # strict front
        with self.assertRaises(ferry.OutOfBounds) as cm:
            strict.transfer_sync_write(sid, self.src_addr, self.dst_addr + MiB - 10, 64)
        self.assertIn(sid, cm.exception.detail)

    def test_async_and_status(self):
        sid = self.d.get_session_id()
        self.src[:] = pattern(MiB, 12)
        bufs = [self.src_addr + i * 65536 for i in range(16)]
        peers = [self.dst_addr + i * 65536 for i in range(16)]
        bid = self.p.batch_transfer_async_write(sid, bufs, peers, [65536] * 16)
        self.assertGreater(bid, 0)
        st = self.p.get_batch_status(bid)
        self.assertEqual(len(st), 16)
        self.assertEqual(self.p.get_batch_transfer_status([bid]), 0)
        self.assertEqual(self.dst[:], self.src[:])
        # Consumed; asking again gives the same outcome (any thread may ask, see
        # test_async_batch_threads); a never returned id is NOT_FOUND.
        self.assertEqual(self.p.get_batch_transfer_status([bid]), 0)
        self.assertEqual(self.p.get_batch_transfer_status([bid + 1000]), errors.NOT_FOUND)
        # Polling with transfer_check_status.
        bid = self.p.transfer_submit_write(sid, self.src_addr, self.dst_addr, 65536)
        self.assertGreater(bid, 0)
        self.assertEqual(wait_for(lambda: self.p.transfer_check_status(bid) or None, 10), 1)
        # Consumed: asked again, the same 1; an unknown id is Mooncake's "failed"
        # (-1), so a polling loop ends; the detail says why.
        self.assertEqual(self.p.transfer_check_status(bid), 1)
        self.assertEqual(self.p.transfer_check_status(bid + 1000), -1)
        self.assertEqual(errors.last_error_code(), errors.NOT_FOUND)
        # Reads, and a failing batch among good ones.
        rid = self.p.batch_transfer_async_read(sid, bufs[:2], peers[:2], [65536] * 2)
        bad = self.p.batch_transfer_async_write(sid, [self.src_addr], [self.dst_addr + 8 * MiB],
                                                [64])
        self.assertGreater(rid, 0)
        if bad > 0:  # failure found at submit or later: either is fine
            self.assertEqual(self.p.get_batch_transfer_status([rid, bad]), -3)
        else:
            self.assertEqual(bad, 0)  # Mooncake: a failed submit returns 0
            self.assertEqual(errors.last_error_code(), -3)
            self.assertEqual(self.p.get_batch_transfer_status([rid]), 0)
        empty = self.p.batch_transfer_async_write(sid, [], [], [])
        self.assertEqual(self.p.get_batch_transfer_status([empty]), 0)

    def test_zero_length_requests_complete(self):
        # Mooncake's convention: zero bytes are complete as they are, alone or
        # in a batch (the other entries still move).
        sid = self.d.get_session_id()
        self.assertEqual(self.p.transfer_sync_write(sid, self.src_addr, self.dst_addr, 0), 0)
        self.assertEqual(self.p.transfer_sync_read(sid, self.src_addr, self.dst_addr, 0), 0)
        self.src[:128] = pattern(128, 30)
        self.assertEqual(self.p.batch_transfer_sync_write(
            sid, [self.src_addr, self.src_addr + 64, self.src_addr], [self.dst_addr, 0, self.dst_addr + 64],
            [64, 0, 64]), 0, errors.last_error_detail())
        self.assertEqual(self.dst[:64], self.src[:64])
        self.assertEqual(self.dst[64:128], self.src[:64])
        self.assertEqual(self.p.batch_transfer_sync_read(sid, [self.src_addr], [self.dst_addr], [0]), 0)
        bid = self.p.batch_transfer_async_write(sid, [self.src_addr, self.src_addr],
                                                [self.dst_addr, self.dst_addr], [0, 64])
        self.assertGreater(bid, 0, errors.last_error_detail())
        self.assertEqual(self.p.get_batch_transfer_status([bid]), 0)
        bid = self.p.batch_transfer_async_read(sid, [self.src_addr], [self.dst_addr], [0])
        self.assertGreater(bid, 0)
        self.assertEqual(self.p.transfer_check_status(bid), 1)
        bid = self.p.transfer_submit_write(sid, self.src_addr, self.dst_addr, 0)
        self.assertEqual(self.p.get_batch_transfer_status([bid]), 0)
        # With a notify: the notification still goes.
        self.d.get_notifies()
        self.assertEqual(self.p.transfer_sync(sid, self.src_addr, self.dst_addr, 0,
                                              TransferOpcode.Write, TransferNotify("z", "empty")), 0)
        self.assertEqual(wait_for(self.d.get_notifies), [TransferNotify("z", "empty")])
        # The C API keeps refusing a zero length (INVALID_ARGUMENT), on purpose.
        with self.assertRaises(ferry.InvalidArgument):
            self.p.engine.write(sid, self.src_addr, self.dst_addr, 0)

    def test_failed_async_submit_returns_zero(self):
        # Mooncake's test_async_submit_to_unknown_peer_returns_zero: 0, the detail kept.
        errors.clear_last_error()
        bid = self.p.batch_transfer_async_write("127.0.0.1:1", [self.src_addr], [self.dst_addr], [64])
        self.assertEqual(bid, 0)
        self.assertLess(errors.last_error_code(), 0)
        self.assertIn("127.0.0.1:1", errors.last_error_detail())
        self.assertIsInstance(ferry.last_error(), ferry.FerryError)
        self.assertEqual(self.p.transfer_submit_write("127.0.0.1:1", self.src_addr, self.dst_addr, 64), 0)
        self.assertEqual(self.p.batch_transfer_async_write(self.d.get_session_id(), [self.src_addr],
                                                           [self.dst_addr], [64, 64]), 0)
        self.assertEqual(errors.last_error_code(), errors.INVALID_ARGUMENT)
        strict = TransferEngine(raise_on_error=True, engine=self.p.engine)
        with self.assertRaises(ferry.FerryError) as cm:
            strict.batch_transfer_async_write("127.0.0.1:1", [self.src_addr], [self.dst_addr], [64])
        self.assertIn("127.0.0.1:1", cm.exception.detail)

    def test_wrong_types_raise_type_error(self):
        # Mooncake's pybind11 signatures refuse these with TypeError; so does Ferry,
        # before anything runs (never AttributeError, never a crash).
        sid = self.d.get_session_id()
        calls = [
            lambda: self.p.transfer_sync(sid, self.src_addr, self.dst_addr, 64, TransferOpcode.Write,
                                         "not a TransferNotify"),
            lambda: self.p.batch_transfer_sync(sid, [self.src_addr], [self.dst_addr], [64],
                                               TransferOpcode.Write, b"x"),
            lambda: self.p.transfer_sync_write(sid, self.src_addr, "0x1000", 64),
            lambda: self.p.transfer_sync_write(sid, self.src_addr, self.dst_addr, "64"),
            lambda: self.p.transfer_sync_write(sid, self.src_addr, self.dst_addr, 64.0),
            lambda: self.p.transfer_sync_write(12345, self.src_addr, self.dst_addr, 64),
            lambda: self.p.transfer_sync(sid, self.src_addr, self.dst_addr, 64, "write"),
            lambda: self.p.batch_transfer_sync_write(sid, [self.src_addr], [self.dst_addr], ["64"]),
            lambda: self.p.batch_transfer_async_write(sid, [self.src_addr], [None], [64]),
            lambda: self.p.batch_transfer_sync_write(sid, 5, [self.dst_addr], [64]),
            lambda: self.p.send_notify(sid, TransferNotify("a", "b"), 3),
            lambda: self.p.send_notify(sid, 42),
        ]
        for i, call in enumerate(calls):
            with self.assertRaises(TypeError, msg="call %d" % i):
                call()
        # A buffer object Ferry cannot use is a code, as any bad argument.
        self.assertEqual(self.p.transfer_sync_write(sid, object(), self.dst_addr, 64),
                         errors.INVALID_ARGUMENT)

    def test_raw_memory_helpers_check_the_registration(self):
        # Once SIGSEGV (write to 0) and uninitialised bytes (read at 0): now
        # the address must lie in memory registered with this engine.
        d = self.d
        m = d.allocate_managed_buffer(4096)
        self.assertNotEqual(m, 0)
        self.assertEqual(d.write_bytes_to_buffer(m + 10, b"hello", 5), 0)
        self.assertEqual(d.read_bytes_from_buffer(m + 10, 5), b"hello")
        self.assertEqual(d.write_bytes_to_buffer(m, "text", 4), 0)
        self.assertEqual(d.read_bytes_from_buffer(m, 4), b"text")
        self.assertEqual(d.read_bytes_from_buffer(m, 0), b"")
        self.assertEqual(d.write_bytes_to_buffer(0, b"boom", 4), errors.ADDRESS_NOT_REGISTERED)
        self.assertIn("not registered", errors.last_error_detail())
        self.assertEqual(d.read_bytes_from_buffer(0, 8), errors.ADDRESS_NOT_REGISTERED)
        self.assertEqual(d.read_bytes_from_buffer(1, 16), errors.ADDRESS_NOT_REGISTERED)
        unreg = (ctypes.c_char * 64)()
        self.assertEqual(d.write_bytes_to_buffer(ctypes.addressof(unreg), b"x", 1), -3)
        self.assertEqual(unreg.raw, b"\0" * 64)
        # Memory registered with another engine is not this engine's.
        self.assertEqual(d.read_bytes_from_buffer(self.src_addr, 8), -3)
        self.assertEqual(d.write_bytes_to_buffer(m + 4094, b"abc", 3), errors.OUT_OF_BOUNDS)
        self.assertEqual(d.write_bytes_to_buffer(m, b"ab", 3), errors.INVALID_ARGUMENT)
        self.assertEqual(d.read_bytes_from_buffer(m, -1), errors.INVALID_ARGUMENT)
        strict = TransferEngine(raise_on_error=True, engine=d.engine)
        with self.assertRaises(ferry.AddressNotRegistered):
            strict.read_bytes_from_buffer(0, 8)
        self.assertEqual(d.free_managed_buffer(m, 4096), 0)
        self.assertEqual(d.read_bytes_from_buffer(m, 8), -3)  # freed: no longer readable
        self.assertEqual(d.engine.region_info(self.dst_addr + 5, 10).kind, "host")

    def test_cuda_pointer_refused_without_cuda_support(self):
        # A CUDA tensor's data_ptr() given to a library that cannot move device
        # memory: refused loudly (the driver, loaded at run time, says what it
        # is), nothing left registered. The driver's answer is simulated here.
        import ferry.engine as fe
        if fe.SUPPORT_CUDA:
            self.skipTest("this library moves device memory itself")
        buf = (ctypes.c_char * 4096)()
        addr = ctypes.addressof(buf)
        self.assertIsNone(fe._device_ordinal(addr))  # a host pointer (or no driver)
        te = TransferEngine(engine=self.d.engine)
        saved, saved_driver = fe._device_ordinal, fe._cuda_driver
        fe._device_ordinal = lambda a: 0 if a == addr else None
        fe._cuda_driver = lambda: object()  # a driver is loaded (asked once per call)
        try:
            self.assertEqual(te.register_memory(addr, 4096), errors.NOT_IMPLEMENTED)
            self.assertIn("CUDA device 0", errors.last_error_detail())
            self.assertIn("FERRY_WITH_CUDA", errors.last_error_detail())
            self.assertEqual(te.unregister_memory(addr), -3)  # not left registered
            other = (ctypes.c_char * 4096)()
            self.assertEqual(te.batch_register_memory([ctypes.addressof(other), addr], [4096, 4096]),
                             errors.NOT_IMPLEMENTED)
            self.assertEqual(te.unregister_memory(ctypes.addressof(other)), -3)
        finally:
            fe._device_ordinal, fe._cuda_driver = saved, saved_driver
        self.assertEqual(te.register_memory(addr, 4096), 0)
        self.assertEqual(te.unregister_memory(addr), 0)

    def test_fake_device_memory(self):
        # The C tests' fake device kind: PROT_NONE pages the CPU cannot touch,
        # reached only through the kind's copies (as GPU memory). Registration
        # tells it from host memory, the raw-memory helpers and the *_on_cuda
        # calls work with it, and nothing touches it directly (that would fault).
        dev = FakeDevice(1 << 16)
        try:
            d = self.d
            sid = d.get_session_id()
            self.assertEqual(self.p.register_memory(dev.base, dev.len), 0)
            try:
                info = self.p.engine.region_info(dev.base, 64)
                self.assertEqual((info.device, info.kind), (0, "fake:0"))
                # A location naming the other kind fails loudly, nothing left registered.
                other = TransferEngine(engine=self.d.engine)
                self.assertEqual(other.register_memory(dev.base, dev.len, "cpu:0"), errors.INVALID_ARGUMENT)
                self.assertIn("device memory", errors.last_error_detail())
                self.assertEqual(other.register_memory(dev.base, dev.len, "cuda:0"), 0)
                self.assertEqual(other.unregister_memory(dev.base), 0)
                host = (ctypes.c_char * 4096)()
                rc = other.register_memory(ctypes.addressof(host), 4096, "cuda:0")
                self.assertIn(rc, (errors.NOT_IMPLEMENTED, errors.INVALID_ARGUMENT))
                self.assertIn("host memory", errors.last_error_detail())
                self.assertEqual(other.unregister_memory(ctypes.addressof(host)), -3)  # not left behind
                self.assertEqual(other.register_memory(ctypes.addressof(host), 4096, "cpu:0"), 0)
                self.assertEqual(other.unregister_memory(ctypes.addressof(host)), 0)
                self.assertEqual(other.batch_register_memory([ctypes.addressof(host), dev.base],
                                                             [4096, dev.len], "cpu"),
                                 errors.INVALID_ARGUMENT)
                self.assertEqual(other.unregister_memory(ctypes.addressof(host)), -3)
                self.assertEqual(self.p.write_bytes_to_buffer(dev.base + 64, b"gpu bytes", 9), 0)
                self.assertEqual(dev.alias_bytes(64, 9), b"gpu bytes")
                self.assertEqual(self.p.read_bytes_from_buffer(dev.base + 64, 9), b"gpu bytes")
                dev.fill(0, pattern(4096, 40))
                self.assertEqual(self.p.transfer_write_on_cuda(sid, dev.base, self.dst_addr, 4096), 0,
                                 errors.last_error_detail())
                self.assertEqual(self.dst[:4096], pattern(4096, 40))
                self.dst[:4096] = pattern(4096, 41)
                self.assertEqual(self.p.batch_transfer_read_on_cuda(
                    sid, [dev.base + 8192, dev.base + 16384], [self.dst_addr, self.dst_addr + 2048],
                    [2048, 2048], 0), 0, errors.last_error_detail())
                self.assertEqual(dev.alias_bytes(8192, 2048), pattern(4096, 41)[:2048])
                self.assertEqual(dev.alias_bytes(16384, 2048), pattern(4096, 41)[2048:])
                self.assertEqual(self.p.transfer_read_on_cuda(sid, dev.base, self.dst_addr, 0), 0)
                self.assertEqual(self.p.batch_transfer_write_on_cuda(sid, [dev.base], [self.dst_addr],
                                                                     [64]), 0)
                # A stream with no CUDA in the process: a clear code, nothing sent.
                if not ferry.engine.SUPPORT_CUDA and ferry.engine._cudart() is None:
                    self.assertEqual(self.p.transfer_write_on_cuda(sid, dev.base, self.dst_addr, 64,
                                                                   stream_ptr=0x1234),
                                     errors.NOT_IMPLEMENTED)
                    self.assertIn("stream_ptr", errors.last_error_detail())
                # Failures are codes, as the other calls.
                self.assertEqual(self.p.transfer_write_on_cuda(sid, dev.base, self.dst_addr + 2 * MiB,
                                                               64), -3)
            finally:
                self.assertEqual(self.p.unregister_memory(dev.base), 0)
        finally:
            dev.close()

    def test_notifies(self):
        sid = self.d.get_session_id()
        self.d.get_notifies()  # drain
        self.src[:64] = b"k" * 64
        self.assertEqual(self.p.transfer_sync(sid, self.src_addr, self.dst_addr, 64,
                                              TransferOpcode.Write,
                                              TransferNotify("room-42", "kv done")), 0)
        self.assertEqual(self.p.send_notify(sid, "room-43", "aux done"), 0)
        got = []
        end = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < end:
            got += self.d.get_notifies()
            time.sleep(0.01)
        self.assertEqual(got, [TransferNotify("room-42", "kv done"),
                               TransferNotify("room-43", "aux done")])
        self.assertEqual(got[0].peer, self.p.get_session_id())
        self.assertEqual(self.dst[:64], b"k" * 64)  # the notify came after the data

    def test_lazy_receiver_gets_every_notify_in_one_call(self):
        """Issue 20 item 5: 1,000 transfers with a notify, none read until the end: every
        transfer returns 0 and one get_notifies returns them all (it used to stop at 256)."""
        sid = self.d.get_session_id()
        self.d.get_notifies()  # drain
        for i in range(1000):
            self.assertEqual(self.p.transfer_sync(sid, self.src_addr, self.dst_addr, 64,
                                                  TransferOpcode.Write,
                                                  TransferNotify("lazy", "n%d" % i)), 0)
        got = self.d.get_notifies()
        self.assertEqual(len(got), 1000)
        self.assertEqual([n.msg for n in got], ["n%d" % i for i in range(1000)])

    def test_a_dropped_notify_does_not_fail_its_placed_write(self):
        """Issue 20 item 5: a sender over its backlog at the receiver (64 KiB notifies fill
        its byte budget) still gets 0 from a transfer with a notify once the bytes landed,
        as in Mooncake; the bare notify says TOO_MANY_REQUESTS. An invalid notify is
        refused before anything moves."""
        with EnvPatch(FERRY_TIMEOUT_MS="5000", FERRY_TRANSPORT=None, FERRY_METADATA=None):
            p, d = TransferEngine(), TransferEngine()
            self.assertEqual(p.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
            self.assertEqual(d.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        src, dst = (ctypes.c_char * 4096)(), (ctypes.c_char * 4096)()
        try:
            self.assertEqual(p.register_memory(ctypes.addressof(src), 4096), 0)
            self.assertEqual(d.register_memory(ctypes.addressof(dst), 4096), 0)
            sid, big = d.get_session_id(), "x" * (64 * 1024 - 16)
            sent = 0
            while p.send_notify(sid, "flood", big) == 0:
                sent += 1
                self.assertLess(sent, 5000)
            self.assertEqual(p.send_notify(sid, "flood", big), errors.TOO_MANY_REQUESTS)
            src[:16] = b"placed-anyway..."
            self.assertEqual(p.transfer_sync(sid, ctypes.addressof(src), ctypes.addressof(dst), 16,
                                             TransferOpcode.Write, TransferNotify("n", big)), 0)
            self.assertEqual(dst[:16], b"placed-anyway...")
            self.assertEqual(p.transfer_sync(sid, ctypes.addressof(src), ctypes.addressof(dst), 16,
                                             TransferOpcode.Write,
                                             TransferNotify("n", "y" * (64 * 1024 + 1))),
                             errors.INVALID_ARGUMENT)
            self.assertEqual(len(d.get_notifies()), sent)
        finally:
            p.close()
            d.close()

    def test_batch_register_and_managed(self):
        bufs = [(ctypes.c_char * 8192)() for _ in range(4)]
        addrs = [ctypes.addressof(b) for b in bufs]
        self.assertEqual(self.d.batch_register_memory(addrs, [8192] * 4), 0)
        self.assertEqual(self.d.batch_unregister_memory(addrs), 0)
        self.assertEqual(self.d.batch_unregister_memory(addrs), -3)
        m = self.d.allocate_managed_buffer(1 << 16)
        self.assertNotEqual(m, 0)
        self.d.write_bytes_to_buffer(m, b"managed", 7)
        self.assertEqual(self.p.transfer_sync_read(self.d.get_session_id(), self.src_addr, m, 7), 0)
        self.assertEqual(self.src[:7], b"managed")
        self.assertEqual(self.d.free_managed_buffer(m, 1 << 16), 0)
        self.assertEqual(self.d.free_managed_buffer(m, 1 << 16), -3)

    def test_probe(self):
        self.assertEqual(self.p.send_probe(self.d.get_session_id()), 0)
        self.assertLess(self.p.send_probe("127.0.0.1:1"), 0)
        self.assertEqual(self.p.warmup_efa_segment(self.d.get_session_id()), 0)

    @requires_numpy
    def test_numpy_buffers(self):
        sid = self.d.get_session_id()
        a = np.arange(4096, dtype=np.uint32)
        b = np.zeros(4096, dtype=np.uint32)
        self.assertEqual(self.p.register_memory(a, a.nbytes), 0)
        self.assertEqual(self.d.register_memory(b, b.nbytes), 0)
        self.assertEqual(self.p.transfer_sync_write(sid, a, b.ctypes.data, a.nbytes), 0)
        self.assertTrue((a == b).all())
        self.assertEqual(self.p.batch_transfer_sync_write(sid, [a[:16], a[100:116]],
                                                          [b.ctypes.data + 4 * 2000,
                                                           b.ctypes.data + 4 * 3000],
                                                          [64, 64]), 0)
        self.assertTrue((b[2000:2016] == a[:16]).all())
        self.assertTrue((b[3000:3016] == a[100:116]).all())
        self.assertEqual(self.p.unregister_memory(a), 0)
        self.assertEqual(self.d.unregister_memory(b.ctypes.data), 0)


if __name__ == "__main__":
    unittest.main()
