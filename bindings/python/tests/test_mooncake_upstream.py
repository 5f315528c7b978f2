# SPDX-License-Identifier: Apache-2.0
"""More of Mooncake's own Python call sequences against ferry.engine (installed
as mooncake.engine by the shim): the ones test_mooncake_sequences.py does not
already have. Each test names the upstream file (kvcache-ai/Mooncake,
mooncake-integration/tests/... or mooncake-wheel/tests/...) whose calls it
makes, in the same order with the same arguments and checks."""

import ctypes
import select
import socket
import struct
import sys
import threading
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

def _every_sync_form(initiator, target_name, source, destination, length, count):
    """(batch, opcode, result) of each sync call form upstream tests make: single
    and batch (count pieces of length), read then write."""
    for batch in (False, True):
        for opcode in ("read", "write"):
            if batch:
                result = getattr(initiator, f"batch_transfer_sync_{opcode}")(
                    target_name, [source + i * length for i in range(count)],
                    [destination + i * length for i in range(count)], [length] * count)
            else:
                result = getattr(initiator, f"transfer_sync_{opcode}")(
                    target_name, source, destination, length)
            yield batch, opcode, result

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
            for batch, opcode, result in _every_sync_form(initiator, target_name, source,
                                                          destination, length, count):
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

    def test_stalled_peer_fails_every_sync_form(self):
        # test_tent_sync_canceled.py's situation without TENT's injector: the
        # peer's name leads to a socket that accepts and never answers. Every
        # sync form (single and batch, read and write) must return a failure
        # the caller sees (the upstream test wants -1; Ferry's code is
        # TIMEOUT), within the transfer deadline, and the managed buffer frees.
        stalled_peer = socket.socket()
        self.addCleanup(stalled_peer.close)
        stalled_peer.bind(("127.0.0.1", 0))
        stalled_peer.listen(8)
        target_name = "127.0.0.1:%d" % stalled_peer.getsockname()[1]
        initiator = engine.TransferEngine()
        self.addCleanup(initiator.close)
        with EnvPatch(FERRY_TIMEOUT_MS="300", **NO_FERRY_ENV):
            self.assertEqual(initiator.initialize("", "P2PHANDSHAKE", "", ""), 0)
        length, count = 4096, 2
        source = initiator.allocate_managed_buffer(length * count)
        self.assertNotEqual(source, 0)
        destination = 0x10000  # the peer's: never reached
        for batch, opcode, result in _every_sync_form(initiator, target_name, source, destination,
                                                      length, count):
            self.assertEqual(result, errors.TIMEOUT, (batch, opcode))
            self.assertIn(target_name, errors.last_error_detail())
        self.assertEqual(initiator.free_managed_buffer(source, length * count), 0)


class _DropFirstAckProxy:
    """Forwards every connection to a Ferry engine's port, and closes the
    first connection that carries `payload` instead of passing on the
    target's next answer: the write was placed, its acknowledgement is lost
    (test_tent_sync_no_replay.py's DropWriteAckProxy, without TENT's wire
    format). Counts how often the payload went through."""

    def __init__(self, target_port, payload):
        self.payload, self.target_port = payload, target_port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.sent = bytearray()
        self.dropped = False
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def writes(self):
        with self.lock:
            return bytes(self.sent).count(self.payload)

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            target = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            t = threading.Thread(target=self._pump, args=(client, target), daemon=True)
            self.threads.append(t)
            t.start()

    def _pump(self, client, target):
        with client, target:
            try:
                while True:
                    ready, _, _ = select.select([client, target], [], [], 10)
                    if not ready:
                        return
                    for sock in ready:
                        data = sock.recv(65536)
                        if not data:
                            return
                        if sock is client:
                            with self.lock:
                                self.sent += data
                            target.sendall(data)
                            continue
                        with self.lock:
                            drop = not self.dropped and self.payload in bytes(self.sent)
                            self.dropped = self.dropped or drop
                        if drop:
                            return  # the answer to the placed write never arrives
                        client.sendall(data)
            except OSError:
                return

    def close(self):
        self.listener.close()


@requires_engine
class TestLostWriteAck(unittest.TestCase):
    """test_tent_sync_no_replay.py's question: a write placed by the target
    whose acknowledgement is lost. Mooncake's TENT path reports -1 and never
    sends it again; its classic path resubmits, writing the bytes twice.
    Ferry fences the broken connection and the fence's answer says what the
    target placed (exactly-once placement, issue 20): a write that landed
    whole is reported complete and never sent again, with the default
    retries and with FERRY_RETRIES=0 alike (before: the default resent it,
    two writes; retries=0 reported PEER_CLOSED for bytes that had landed)."""

    def _check(self, batched, retries):
        payload = bytes((i * 7 + 3) % 251 for i in range(4096))
        env = dict(NO_FERRY_ENV, FERRY_RETRIES=retries)
        target, initiator = engine.TransferEngine(), engine.TransferEngine()
        with EnvPatch(**env):
            for te in (target, initiator):
                self.assertEqual(te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        self.addCleanup(initiator.close)
        self.addCleanup(target.close)
        proxy = _DropFirstAckProxy(target.get_rpc_port(), payload)
        self.addCleanup(proxy.close)
        source = ctypes.create_string_buffer(payload, 4096)
        destination = ctypes.create_string_buffer(4096)
        self.assertEqual(initiator.register_memory(ctypes.addressof(source), 4096), 0)
        self.assertEqual(target.register_memory(ctypes.addressof(destination), 4096), 0)
        name = f"127.0.0.1:{proxy.port}"
        if batched:
            result = initiator.batch_transfer_sync_write(name, [ctypes.addressof(source)],
                                                         [ctypes.addressof(destination)], [4096],
                                                         "hp_tcp")
        else:
            result = initiator.transfer_sync_write(name, ctypes.addressof(source),
                                                   ctypes.addressof(destination), 4096, "hp_tcp")
        self.assertTrue(proxy.dropped, "the proxy never saw the write")
        self.assertEqual(destination.raw, source.raw)
        return result, proxy.writes()

    def test_default_reports_success_and_sends_once(self):
        for batched in (False, True):
            with self.subTest(batched=batched):
                result, writes = self._check(batched, 1)
                self.assertEqual(result, 0, errors.last_error_detail())
                self.assertEqual(writes, 1, "a placed write was sent again")

    def test_no_retries_reports_the_placed_write_complete(self):
        for batched in (False, True):
            with self.subTest(batched=batched):
                result, writes = self._check(batched, 0)
                self.assertEqual(result, 0, errors.last_error_detail())
                self.assertEqual(writes, 1, "a placed write was sent again")


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


class _FakeDtype:
    def __init__(self, name, size, fmt):
        self.name, self.size, self.fmt = name, size, fmt

    def __str__(self):
        return "torch." + self.name


class Tensor:
    """The little of torch.Tensor that transfer_tensor_sync_* use (torch is not
    installed here): contiguous storage in a ctypes array, optionally a strided
    view (transposed 2-D) to stand for a non-contiguous tensor."""

    def __init__(self, values, dtype, shape, transposed=False):
        self.dtype, self.shape = dtype, tuple(shape)
        self._store = (ctypes.c_char * max(len(values) * dtype.size, 1))()
        struct.pack_into("=%d%s" % (len(values), dtype.fmt), self._store, 0, *values)
        self._transposed = transposed

    def data_ptr(self):
        return ctypes.addressof(self._store)

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def element_size(self):
        return self.dtype.size

    def _raw(self):
        return list(struct.unpack_from("=%d%s" % (self.numel(), self.dtype.fmt), self._store))

    def tolist_flat(self):
        vals = self._raw()
        if not self._transposed:
            return vals
        rows, cols = self.shape  # stored as cols x rows
        return [vals[c * rows + r] for r in range(rows) for c in range(cols)]

    def is_contiguous(self):
        return not self._transposed

    def contiguous(self):
        return Tensor(self.tolist_flat(), self.dtype, self.shape)

    def reshape(self, shape):
        return Tensor(self._raw(), self.dtype, shape)


def _fake_torch():
    m = types.ModuleType("torch")
    for name, size, fmt in (("float32", 4, "f"), ("float64", 8, "d"), ("int8", 1, "b"),
                            ("uint8", 1, "B"), ("int16", 2, "h"), ("uint16", 2, "H"),
                            ("int32", 4, "i"), ("uint32", 4, "I"), ("int64", 8, "q"),
                            ("uint64", 8, "Q"), ("bool", 1, "?"), ("float16", 2, "e")):
        setattr(m, name, _FakeDtype(name, size, fmt))
    m.complex64 = _FakeDtype("complex64", 8, "q")

    def frombuffer(buf, dtype):
        n = len(buf) // dtype.size
        return Tensor(struct.unpack_from("=%d%s" % (n, dtype.fmt), buf), dtype, (n,))

    m.frombuffer = frombuffer
    m.empty = lambda shape, dtype: Tensor([], dtype, shape)
    m.Tensor = Tensor
    return m


@requires_engine
class TestTransferTensor(unittest.TestCase):
    """mooncake-wheel/tests/test_transfer_tensor.py: two engines named
    "localhost:<rpc port>", a managed buffer of 24 + tensor bytes on the
    receiver, transfer_tensor_sync_write then transfer_tensor_sync_read. With a
    stand-in for torch when it is not installed."""

    @classmethod
    def setUpClass(cls):
        cls.saved = sys.modules.get("torch")
        try:
            import torch  # noqa: F401
            cls.torch = torch
        except ImportError:
            cls.torch = sys.modules["torch"] = _fake_torch()
        cls.sender_engine, cls.receiver_engine = engine.TransferEngine(), engine.TransferEngine()
        with EnvPatch(**NO_FERRY_ENV):
            for te in (cls.sender_engine, cls.receiver_engine):
                assert te.initialize("localhost", "P2PHANDSHAKE", "tcp", "") == 0
        cls.receiver_hostname = f"localhost:{cls.receiver_engine.get_rpc_port()}"

    @classmethod
    def tearDownClass(cls):
        cls.sender_engine.close()
        cls.receiver_engine.close()
        if cls.saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = cls.saved

    def _tensor(self, values, dtype, shape=None, transposed=False):
        t = self.torch
        if isinstance(t, types.ModuleType) and t.__dict__.get("frombuffer") is not None \
                and t.Tensor is Tensor:
            return Tensor(values, getattr(t, dtype), shape or (len(values),), transposed)
        x = t.tensor(values, dtype=getattr(t, dtype)).reshape(shape or (len(values),))
        return x.t() if transposed else x

    @staticmethod
    def _flat(x):
        return x.tolist_flat() if isinstance(x, Tensor) else x.flatten().tolist()

    def _roundtrip(self, tensor, nbytes):
        total_size = 24 + nbytes
        receiver_buffer = self.receiver_engine.allocate_managed_buffer(total_size)
        self.assertNotEqual(receiver_buffer, 0)
        try:
            result = self.sender_engine.transfer_tensor_sync_write(self.receiver_hostname, tensor,
                                                                   receiver_buffer)
            self.assertEqual(result, 0, errors.last_error_detail())
            got = self.sender_engine.transfer_tensor_sync_read(self.receiver_hostname,
                                                               receiver_buffer, total_size)
            self.assertIsNotNone(got, errors.last_error_detail())
            self.assertEqual(str(got.dtype), str(tensor.dtype))
            self.assertEqual(tuple(got.shape), tuple(tensor.shape))
            self.assertEqual(self._flat(got), self._flat(tensor))
            return receiver_buffer
        finally:
            self.receiver_engine.free_managed_buffer(receiver_buffer, total_size)

    def test_transfer_tensor_dtypes(self):
        for values, dtype, size in (([1.0, 2.0, 3.0, 4.0], "float32", 4), ([1, 2, 3, 4], "int32", 4),
                                    ([True, False, False, True], "bool", 1),
                                    ([float(i) / 7 for i in range(1000)], "float64", 8),
                                    ([-3, 5], "int8", 1)):
            with self.subTest(dtype=dtype):
                self._roundtrip(self._tensor(values, dtype), len(values) * size)

    def test_transfer_tensor_multidimensional(self):
        self._roundtrip(self._tensor([float(i) for i in range(12)], "float32", (3, 4)), 48)

    def test_non_contiguous_tensor_sends_its_elements(self):
        # Mooncake sends the bytes at data_ptr(): a transposed tensor's storage
        # order, not its elements; Ferry sends tensor.contiguous().
        t = self._tensor([float(i) for i in range(6)], "float32", (3, 2), transposed=True)
        self._roundtrip(t, 24)

    def test_refusals_are_visible(self):
        total_size = 24 + 16
        buf = self.receiver_engine.allocate_managed_buffer(total_size)
        self.addCleanup(self.receiver_engine.free_managed_buffer, buf, total_size)
        send = self.sender_engine.transfer_tensor_sync_write
        self.assertEqual(send(self.receiver_hostname, b"not a tensor", buf), errors.INVALID_ARGUMENT)
        if self.torch.Tensor is Tensor:
            self.assertEqual(send(self.receiver_hostname, Tensor([0], self.torch.complex64, (1,)),
                                  buf), errors.INVALID_ARGUMENT)
            self.assertIn("dtype", errors.last_error_detail())
            five = Tensor([1] * 32, self.torch.int8, (2, 2, 2, 2, 2))
            self.assertEqual(send(self.receiver_hostname, five, buf), errors.INVALID_ARGUMENT)
        # a peer buffer too small for header + data: refused by the peer, nothing written
        big = self._tensor([1.0] * 8, "float32")
        self.assertEqual(send(self.receiver_hostname, big, buf), errors.OUT_OF_BOUNDS)
        # a total_size that does not match the header: None, not a misread tensor
        self.assertEqual(send(self.receiver_hostname, self._tensor([1, 2, 3, 4], "int32"), buf), 0)
        read = self.sender_engine.transfer_tensor_sync_read
        self.assertIsNone(read(self.receiver_hostname, buf, total_size - 4))
        self.assertIn("bytes", errors.last_error_detail())
        self.assertIsNone(read(self.receiver_hostname, buf, 8))
        self.assertIsNone(read(self.receiver_hostname, buf + 4096, total_size))
        self.assertEqual(errors.last_error_code(), errors.ADDRESS_NOT_REGISTERED)
        self.assertIsNotNone(read(self.receiver_hostname, buf, total_size))
        # the tensor's memory was registered for the call only
        self.assertEqual(self.sender_engine.engine.region_count, 0)

    def test_cuda_tensor_refused_without_cuda_support(self):
        # A CUDA tensor given to a library that cannot move device memory is
        # refused as register_memory refuses it (the driver's answer simulated),
        # nothing sent, nothing left registered.
        import ferry.engine as fe
        if fe.SUPPORT_CUDA:
            self.skipTest("this library moves device memory itself")
        t = self._tensor([1.0, 2.0], "float32")
        total_size = 24 + 8
        buf = self.receiver_engine.allocate_managed_buffer(total_size)
        self.addCleanup(self.receiver_engine.free_managed_buffer, buf, total_size)
        saved, saved_driver = fe._device_ordinal, fe._cuda_driver
        fe._device_ordinal = lambda a: 0 if a == t.data_ptr() else None
        fe._cuda_driver = lambda: object()
        try:
            self.assertEqual(self.sender_engine.transfer_tensor_sync_write(
                self.receiver_hostname, t, buf), errors.NOT_IMPLEMENTED)
            self.assertIn("CUDA device 0", errors.last_error_detail())
        finally:
            fe._device_ordinal, fe._cuda_driver = saved, saved_driver
        self.assertEqual(self.sender_engine.engine.region_count, 0)
        self.assertEqual(self.receiver_engine.read_bytes_from_buffer(buf, total_size),
                         bytes(total_size))


@requires_engine
class TestTargetScript(unittest.TestCase):
    def test_old_class_name(self):
        # mooncake-wheel/tests/transfer_engine_target.py: the class under its
        # first name, initialized with a fixed host:port (then left running).
        import mooncake
        from mooncake.engine import mooncake_vllm_adaptor
        self.assertIs(mooncake_vllm_adaptor, engine.TransferEngine)
        if getattr(mooncake, "__file__", None) is None:  # the shim's package, no real Mooncake
            self.assertIs(mooncake.mooncake_vllm_adaptor, engine.TransferEngine)
        target = mooncake_vllm_adaptor()
        with EnvPatch(**NO_FERRY_ENV):
            self.assertEqual(target.initialize("127.0.0.1:12345", "P2PHANDSHAKE", "tcp", ""), 0)
        target.close()

    def test_target_script_fallback_buffer(self):
        # transfer_engine_target.py (current form): the target asks for its own
        # first buffer under the name it was given, allocates 64 MiB when there
        # is none; an initiator then finds that buffer by the same name.
        target_server_name = "127.0.0.1:12345"
        target = engine.TransferEngine()
        self.addCleanup(target.close)
        with EnvPatch(**NO_FERRY_ENV):
            self.assertEqual(target.initialize(target_server_name, "P2PHANDSHAKE", "tcp", ""), 0)
        if target.get_rpc_port() != 12345:  # the port was busy: Mooncake's free-port naming
            target_server_name = f"127.0.0.1:{target.get_rpc_port()}"
        buffer_addr = target.get_first_buffer_address(target_server_name)
        self.assertEqual(buffer_addr, 0)
        buffer_addr = target.allocate_managed_buffer(64 * 1024 * 1024)
        self.assertNotEqual(buffer_addr, 0)
        # Ferry registers the managed buffer itself; the real Mooncake (3b5a594, seen by
        # differential.py) carves it out of a larger pool it registered, whose start is
        # the first buffer: at or below the buffer handed out, never 0.
        first = target.get_first_buffer_address(target_server_name)
        self.assertNotEqual(first, 0)
        self.assertLessEqual(first, buffer_addr)
        initiator = engine.TransferEngine()
        self.addCleanup(initiator.close)
        with EnvPatch(**NO_FERRY_ENV):
            self.assertEqual(initiator.initialize("127.0.0.1:12347", "P2PHANDSHAKE", "tcp", ""), 0)
        self.assertEqual(initiator.get_first_buffer_address(target_server_name), first)


if __name__ == "__main__":
    unittest.main()
