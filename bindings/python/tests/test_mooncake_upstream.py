"""More of Mooncake's own Python call sequences against ferry.engine (installed
as mooncake.engine by the shim): the ones test_mooncake_sequences.py does not
already have. Each test names the upstream file (kvcache-ai/Mooncake,
mooncake-integration/tests/... or mooncake-wheel/tests/...) whose calls it
makes, in the same order with the same arguments and checks."""

import ctypes
import struct
import sys
import time
import types
import unittest

from _support import EnvPatch, requires_engine

import ferry
from ferry import errors

ferry.install_mooncake_shim()
from mooncake import engine  # noqa: E402

NO_FERRY_ENV = dict(FERRY_TRANSPORT=None, FERRY_METADATA=None, MC_FORCE_TCP=None)


def _pair(test, hostname="127.0.0.1", protocol="tcp"):
    """target, initiator initialized as the upstream tests do (never closed by
    them: dropped at the end, as there)."""
    target, initiator = engine.TransferEngine(), engine.TransferEngine()
    with EnvPatch(**NO_FERRY_ENV):
        for te in (target, initiator):
            test.assertEqual(te.initialize(hostname, "P2PHANDSHAKE", protocol, ""), 0,
                             errors.last_error_detail())
    test.addCleanup(initiator.close)
    test.addCleanup(target.close)
    return target, initiator


@requires_engine
class TestTentFirstBuffer(unittest.TestCase):
    def test_local_and_remote_buffer(self):
        # mooncake-integration/tests/test_tent_first_buffer.py
        target, initiator = _pair(self)
        name = f"127.0.0.1:{target.get_rpc_port()}"
        self.assertEqual(target.get_first_buffer_address(name), 0)
        target_buffer = ctypes.create_string_buffer(128)
        source_buffer = ctypes.create_string_buffer(b"first buffer regression", 128)
        target_addr = ctypes.addressof(target_buffer)
        source_addr = ctypes.addressof(source_buffer)
        self.assertEqual(target.register_memory(target_addr, 128), 0)
        self.addCleanup(lambda: target.unregister_memory(ctypes.addressof(target_buffer)))
        self.assertEqual(initiator.register_memory(source_addr, 128), 0)
        self.addCleanup(lambda: initiator.unregister_memory(ctypes.addressof(source_buffer)))
        self.assertEqual(target.get_first_buffer_address(name), target_addr)
        for _ in range(2):
            # the second query keeps the session the first write used
            self.assertEqual(initiator.get_first_buffer_address(name), target_addr)
            ctypes.memset(target_addr, 0, 128)
            self.assertEqual(initiator.transfer_sync_write(name, source_addr, target_addr, 128), 0)
            self.assertEqual(target_buffer.raw, source_buffer.raw)


@requires_engine
class TestAsyncBatchTransfer(unittest.TestCase):
    def test_multiple_batches_write_and_read(self):
        # mooncake-integration/tests/test_async_batch_transfer.py
        target, initiator = _pair(self)
        size = 4096
        payload = bytes(range(256)) * 16
        local = ctypes.create_string_buffer(payload, size)
        remote = ctypes.create_string_buffer(size)
        local_addr, remote_addr = ctypes.addressof(local), ctypes.addressof(remote)
        for te, buf in ((initiator, local), (target, remote)):
            self.assertEqual(te.register_memory(ctypes.addressof(buf), size), 0)
            self.addCleanup(lambda te=te, b=buf: te.unregister_memory(ctypes.addressof(b)))
        name = f"127.0.0.1:{target.get_rpc_port()}"
        for operation in ("write", "read"):
            with self.subTest(operation=operation):
                if operation == "read":
                    ctypes.memset(local_addr, 0, size)
                submit = getattr(initiator, f"batch_transfer_async_{operation}")
                batches = []
                for offset in (0, 2048):
                    batch = submit(name, [local_addr + offset, local_addr + offset + 1024],
                                   [remote_addr + offset, remote_addr + offset + 1024], [1024, 1024])
                    self.assertNotEqual(batch, 0)
                    batches.append(batch)
                self.assertEqual(initiator.get_batch_transfer_status(batches), 0)
                self.assertEqual(remote.raw, payload)
                self.assertEqual(local.raw, payload)
        for poll_single in (False, True):
            with self.subTest(poll_single=poll_single):
                ctypes.memset(remote_addr, 0, size)
                batch = initiator.transfer_submit_write(name, local_addr, remote_addr, size)
                self.assertNotEqual(batch, 0)
                if poll_single:
                    deadline = time.monotonic() + 5
                    status = 0
                    while status == 0 and time.monotonic() < deadline:
                        status = initiator.transfer_check_status(batch)
                        time.sleep(0.001)
                    self.assertEqual(status, 1)
                else:
                    self.assertEqual(initiator.get_batch_transfer_status([batch]), 0)
                self.assertEqual(remote.raw, payload)


@requires_engine
class TestTentInitializeForms(unittest.TestCase):
    def test_send_probe_empty_hostname(self):
        # mooncake-integration/tests/test_tent_send_probe.py: local_hostname ""
        # and the peer named "127.0.0.1:<rpc port>".
        target, initiator = _pair(self, hostname="")
        self.assertEqual(initiator.send_probe(f"127.0.0.1:{target.get_rpc_port()}"), 0)

    def test_empty_protocol_and_managed_buffers(self):
        # mooncake-integration/tests/test_tent_sync_canceled.py and
        # test_tent_sync_no_replay.py, without their TENT fault injection (a
        # TENT-only preload and HP TCP proxy): protocol "", managed buffers
        # freed with the length they were allocated with, transport_hint
        # passed positionally.
        target, initiator = _pair(self, hostname="", protocol="")
        target_name = f"127.0.0.1:{target.get_rpc_port()}"
        length, count = 4096, 2
        source = initiator.allocate_managed_buffer(length * count)
        destination = target.allocate_managed_buffer(length * count)
        self.assertNotEqual(source, 0)
        self.assertNotEqual(destination, 0)
        try:
            payload = bytes(range(256)) * (length * count // 256)
            # the reads bring the target's bytes, the writes take them back
            self.assertEqual(target.write_bytes_to_buffer(destination, payload, len(payload)), 0)
            for batch in (False, True):
                for opcode in ("read", "write"):
                    if batch:
                        result = getattr(initiator, f"batch_transfer_sync_{opcode}")(
                            target_name, [source + i * length for i in range(count)],
                            [destination + i * length for i in range(count)], [length] * count)
                    else:
                        result = getattr(initiator, f"transfer_sync_{opcode}")(
                            target_name, source, destination, length)
                    self.assertEqual(result, 0, (batch, opcode))
            self.assertEqual(target.read_bytes_from_buffer(destination, len(payload)), payload)
            self.assertEqual(initiator.read_bytes_from_buffer(source, len(payload)), payload)
            self.assertEqual(initiator.transfer_sync_write(target_name, source, destination, 4096,
                                                           "hp_tcp"), 0)
            self.assertEqual(initiator.batch_transfer_sync_write(target_name, [source], [destination],
                                                                 [4096], "hp_tcp"), 0)
        finally:
            self.assertEqual(initiator.free_managed_buffer(source, length * count), 0)
            self.assertEqual(target.free_managed_buffer(destination, length * count), 0)


class TestAllocateHostBuffer(unittest.TestCase):
    # mooncake-wheel/tests/test_allocate_host_buffer.py (module-level functions)
    def test_alloc_free_roundtrip(self):
        size = 4 * 1024 * 1024
        ptr = engine.allocate_host_buffer(size)
        self.assertNotEqual(ptr, 0)
        engine.free_host_buffer(ptr)

    def test_zero_size_returns_zero(self):
        self.assertEqual(engine.allocate_host_buffer(0), 0)

    def test_free_null_is_noop(self):
        engine.free_host_buffer(0)

    def test_from_the_mooncake_module(self):
        from mooncake.engine import allocate_host_buffer, free_host_buffer
        ptr = allocate_host_buffer(4096)
        ctypes.memset(ptr, 7, 4096)  # usable memory, zeroed at first
        self.assertEqual(ctypes.string_at(ptr, 4096), b"\x07" * 4096)
        self.assertEqual(free_host_buffer(ptr), 0)

    def test_unknown_pointer_is_not_freed(self):
        # Mooncake frees whatever it is given (a crash for a pointer it did not
        # allocate); Ferry frees only its own allocations, once.
        buf = ctypes.create_string_buffer(64)
        self.assertEqual(engine.free_host_buffer(ctypes.addressof(buf)), errors.ADDRESS_NOT_REGISTERED)
        ptr = engine.allocate_host_buffer(4096)
        self.assertEqual(engine.free_host_buffer(ptr), 0)
        self.assertEqual(engine.free_host_buffer(ptr), errors.ADDRESS_NOT_REGISTERED)
        self.assertIn("%#x" % ptr, errors.last_error_detail())

    def test_negative_size(self):
        self.assertEqual(engine.allocate_host_buffer(-1), 0)
        with self.assertRaises(TypeError):
            engine.allocate_host_buffer("4096")


@requires_engine
class TestHostBufferStillRegistered(unittest.TestCase):
    def test_registered_host_buffer_is_kept(self):
        # Freeing memory a live engine still exposes to peers would let their
        # writes land in unmapped (or reused) memory: refused, the memory stays.
        te = engine.TransferEngine()
        with EnvPatch(**NO_FERRY_ENV):
            self.assertEqual(te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        self.addCleanup(te.close)
        ptr = engine.allocate_host_buffer(8192)
        self.assertEqual(te.register_memory(ptr + 4096, 4096), 0)
        self.assertEqual(engine.free_host_buffer(ptr), errors.ADDRESS_OVERLAPPED)
        self.assertIn("registered", errors.last_error_detail())
        self.assertEqual(te.write_bytes_to_buffer(ptr + 4096, b"still mapped", 12), 0)
        self.assertEqual(te.unregister_memory(ptr + 4096), 0)
        self.assertEqual(engine.free_host_buffer(ptr), 0)


if __name__ == "__main__":
    unittest.main()
