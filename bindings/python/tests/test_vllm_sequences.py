# SPDX-License-Identifier: Apache-2.0
"""vLLM's own call sequences against the binding, in vLLM's order and with
the return checks vLLM makes (our code, written after vLLM's v1 Mooncake KV
connector, kv_connector/v1/mooncake/mooncake_connector.py, and its v0 pipe,
kv_transfer/kv_pipe/mooncake_pipe.py).

Connector (MooncakeConnectorWorker): initialize(get_ip(), "P2PHANDSHAKE",
protocol from kv_connector_extra_config (default "rdma"), device_name (default
"")), `!= 0` raises; the session peers use is "host:get_rpc_port()";
register_kv_caches registers each KV tensor's untyped storage once with
batch_register_memory (`!= 0` raises), while the transfer regions are views
inside it (per-head slices for non-block-contiguous layouts); the producer's
_send_blocks runs batch_transfer_sync_write(remote_session, src, dst, lens)
on a thread pool of num_workers (10) threads, coalescing contiguous block
runs into one descriptor, and treats `ret_value == 0` as sent and anything
else as failed (reported to the decoder, which recomputes).

Pipe (MooncakeTransferEngine of the v0 MooncakePipe): initialize(host:port,
metadata_server, protocol (default "tcp"), device_name) with its return
ignored; send_bytes: allocate_managed_buffer (`<= 0` raises),
write_bytes_to_buffer (return ignored), the address to the peer, and
free_managed_buffer from a cleaner thread once the peer ACKs; recv_bytes:
allocate_managed_buffer, transfer_sync_read(remote_url, dst, src, length)
(`< 0` raises), read_bytes_from_buffer, ACK, free_managed_buffer."""

import concurrent.futures
import ctypes
import queue
import socket
import threading
import unittest

from _support import HAVE_NUMPY, EnvPatch, requires_engine

from ferry import errors
from ferry.engine import TransferEngine

HOST = "127.0.0.1"
NUM_BLOCKS = 64
HEADS = 2
HEAD_BLOCK = 512            # bytes of one block of one head
BLOCK = HEADS * HEAD_BLOCK  # bytes of one block of one layer
LAYERS = 3


def fill(buf, seed):
    n = len(buf)
    pattern = bytes((i * 7 + seed) & 0xFF for i in range(251))
    ctypes.memmove(buf, (pattern * (n // len(pattern) + 1))[:n], n)


class KVCaches:
    """One storage per layer ([NUM_BLOCKS, HEADS, HEAD_BLOCK] bytes), as
    vLLM's kv_caches dict: the storage is what gets registered."""

    def __init__(self, seed=None):
        self.storages = [(ctypes.c_char * (NUM_BLOCKS * BLOCK))() for _ in range(LAYERS)]
        if seed is not None:
            for i, s in enumerate(self.storages):
                fill(s, seed + i)

    def ptrs(self):
        return [ctypes.addressof(s) for s in self.storages]

    def lens(self):
        return [ctypes.sizeof(s) for s in self.storages]

    def block(self, layer, block_id):
        off = block_id * BLOCK
        return bytes(self.storages[layer][off:off + BLOCK])


class VLLMWorker:
    """The engine calls of MooncakeConnectorWorker, with its return checks."""

    def __init__(self, protocol="rdma", device_name="", num_workers=10):
        self.engine = TransferEngine()
        self.hostname = HOST
        ret_value = self.engine.initialize(self.hostname, "P2PHANDSHAKE", protocol, device_name)
        if ret_value != 0:
            raise RuntimeError("Mooncake Transfer Engine initialization failed.")
        self.rpc_port = self.engine.get_rpc_port()
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=num_workers)
        self.kv = None

    def register_kv_caches(self, kv):
        seen, ptrs, lens = set(), [], []
        for p, n in zip(kv.ptrs(), kv.lens()):
            if p not in seen:
                seen.add(p)
                ptrs.append(p)
                lens.append(n)
        ret_value = self.engine.batch_register_memory(ptrs, lens)
        if ret_value != 0:
            raise RuntimeError("Mooncake batch memory registration failed.")
        self.kv = kv

    def send_blocks(self, remote_session, src_ptrs, dst_ptrs, lengths):
        ret_value = self.engine.batch_transfer_sync_write(remote_session, src_ptrs, dst_ptrs,
                                                          lengths)
        return ret_value

    def build_transfer_params(self, remote_bases, local_ids, remote_ids, per_head=False):
        """Coalesces contiguous runs (as group_concurrent_contiguous); per_head:
        one region per head slice (block stride BLOCK, length HEAD_BLOCK)."""
        runs, start = [], 0
        for i in range(1, len(local_ids) + 1):
            if (i == len(local_ids) or local_ids[i] != local_ids[i - 1] + 1
                    or remote_ids[i] != remote_ids[i - 1] + 1):
                runs.append((local_ids[start:i], remote_ids[start:i]))
                start = i
        src, dst, lens = [], [], []
        for layer, base in enumerate(self.kv.ptrs()):
            regions = ([(h * HEAD_BLOCK, HEAD_BLOCK) for h in range(HEADS)] if per_head
                       else [(0, BLOCK)])
            for off, xfer in regions:
                for lids, rids in runs:
                    if xfer == BLOCK:  # can_coalesce
                        src.append(base + off + lids[0] * BLOCK)
                        dst.append(remote_bases[layer] + off + rids[0] * BLOCK)
                        lens.append(xfer * len(lids))
                    else:
                        for lid, rid in zip(lids, rids):
                            src.append(base + off + lid * BLOCK)
                            dst.append(remote_bases[layer] + off + rid * BLOCK)
                            lens.append(xfer)
        return src, dst, lens

    def close(self):
        self.executor.shutdown(wait=True)
        self.engine.close()


@requires_engine
class TestVLLMConnector(unittest.TestCase):
    def setUp(self):
        self.d = VLLMWorker()
        self.p = VLLMWorker()
        self.d_kv, self.p_kv = KVCaches(), KVCaches(seed=11)
        self.d.register_kv_caches(self.d_kv)
        self.p.register_kv_caches(self.p_kv)
        # The decoder's MooncakeXferMetadata: remote_hostname, remote_port.
        self.remote_session = "%s:%d" % (self.d.hostname, self.d.rpc_port)

    def tearDown(self):
        self.p.close()
        self.d.close()

    def test_session_is_host_and_rpc_port(self):
        self.assertIsInstance(self.d.rpc_port, int)
        self.assertGreater(self.d.rpc_port, 0)
        self.assertEqual(self.d.engine.get_session_id(), self.remote_session)

    def check_blocks(self, local_ids, remote_ids):
        for layer in range(LAYERS):
            for lid, rid in zip(local_ids, remote_ids):
                self.assertEqual(self.d_kv.block(layer, rid), self.p_kv.block(layer, lid),
                                 "layer %d block %d -> %d" % (layer, lid, rid))

    def test_sender_thread_pool(self):
        # Many requests' sends at once from the sender pool, the first ones
        # before any session to the decoder exists.
        # Request r's blocks 3r..3r+2 go to request 19-r's slots on the decoder
        # (reversed for odd r: one descriptor per block, no coalescing).
        reqs = []
        for r in range(20):
            lids = [3 * r + k for k in range(3)]
            rids = [3 * (19 - r) + (2 - k if r % 2 else k) for k in range(3)]
            reqs.append((lids, rids))
        futs = []
        for lids, rids in reqs:
            params = self.p.build_transfer_params(self.d_kv.ptrs(), lids, rids, per_head=(lids[0] % 2 == 0))
            futs.append(self.p.executor.submit(self.p.send_blocks, self.remote_session, *params))
        for f in futs:
            self.assertEqual(f.result(timeout=60), 0, errors.last_error_detail())
        for lids, rids in reqs:
            self.check_blocks(lids, rids)

    def test_coalesced_run_lengths(self):
        lids, rids = list(range(8, 24)), list(range(30, 46))
        src, dst, lens = self.p.build_transfer_params(self.d_kv.ptrs(), lids, rids)
        self.assertEqual(lens, [16 * BLOCK] * LAYERS)  # one descriptor per layer
        self.assertEqual(self.p.send_blocks(self.remote_session, src, dst, lens), 0)
        self.check_blocks(lids, rids)

    def test_kv_both_sends_and_receives(self):
        # kv_both: one worker is producer and consumer; each side writes the other.
        back = "%s:%d" % (self.p.hostname, self.p.rpc_port)
        fill(self.d_kv.storages[0], 99)
        params = self.d.build_transfer_params(self.p_kv.ptrs(), [5], [40])
        fwd = self.p.build_transfer_params(self.d_kv.ptrs(), [1, 2], [50, 51])
        f1 = self.d.executor.submit(self.d.send_blocks, back, *params)
        f2 = self.p.executor.submit(self.p.send_blocks, self.remote_session, *fwd)
        self.assertEqual(f1.result(timeout=60), 0)
        self.assertEqual(f2.result(timeout=60), 0)
        self.assertEqual(self.p_kv.block(0, 40), self.d_kv.block(0, 5))
        self.check_blocks([1, 2], [50, 51])

    def test_remote_blocks_beyond_registration_fail_visibly(self):
        # A decoder whose metadata names blocks past its registered storage
        # (a layout mismatch): the send must not report 0.
        src, dst, lens = self.p.build_transfer_params(self.d_kv.ptrs(), [0, 1], [NUM_BLOCKS - 1,
                                                                               NUM_BLOCKS])
        ret = self.p.send_blocks(self.remote_session, src, dst, lens)
        self.assertNotEqual(ret, 0)
        self.assertLess(ret, 0)

    def test_local_blocks_not_registered_fail_visibly(self):
        stray = (ctypes.c_char * BLOCK)()
        ret = self.p.send_blocks(self.remote_session, [ctypes.addressof(stray)],
                                 [self.d_kv.ptrs()[0]], [BLOCK])
        self.assertNotEqual(ret, 0)

    def test_decoder_gone_fails_visibly(self):
        session = self.remote_session
        self.assertEqual(self.p.send_blocks(session, *self.p.build_transfer_params(
            self.d_kv.ptrs(), [3], [3])), 0)
        self.d.engine.close()
        ret = self.p.send_blocks(session, *self.p.build_transfer_params(self.d_kv.ptrs(), [4], [4]))
        self.assertNotEqual(ret, 0)

    @unittest.skipUnless(HAVE_NUMPY, "numpy is not installed for this interpreter")
    def test_numpy_integer_entries(self):
        # Older vLLM built its descriptors from numpy block-id arrays
        # (np.split groups without tolist()): np.int64 addresses and lengths.
        import numpy as np
        lids, rids = np.arange(10, 14, dtype=np.int64), np.arange(20, 24, dtype=np.int64)
        src = [self.p_kv.ptrs()[0] + lid * BLOCK for lid in lids]
        dst = [self.d_kv.ptrs()[0] + rid * BLOCK for rid in rids]
        lens = [np.int64(BLOCK)] * len(src)
        self.assertIsInstance(src[0], np.integer)
        self.assertEqual(self.p.send_blocks(self.remote_session, src, dst, lens), 0)
        for lid, rid in zip(lids.tolist(), rids.tolist()):
            self.assertEqual(self.d_kv.block(0, rid), self.p_kv.block(0, lid))


@requires_engine
class TestVLLMConnectorProtocols(unittest.TestCase):
    def test_mooncake_protocol_tcp(self):
        d, p = VLLMWorker(protocol="tcp"), VLLMWorker(protocol="tcp")
        try:
            dk, pk = KVCaches(), KVCaches(seed=3)
            d.register_kv_caches(dk)
            p.register_kv_caches(pk)
            session = "%s:%d" % (HOST, d.rpc_port)
            self.assertEqual(p.send_blocks(session, *p.build_transfer_params(dk.ptrs(), [7], [9])), 0)
            self.assertEqual(dk.block(2, 9), pk.block(2, 7))
        finally:
            p.close()
            d.close()

    def test_device_name_from_extra_config(self):
        # kv_connector_extra_config "device_name": an RDMA device filter, which
        # Ferry does not use; the engine still comes up.
        w = VLLMWorker(device_name="mlx5_0,mlx5_1")
        w.close()

    def test_ipv6_host_unbracketed_session(self):
        # get_ip() may return an IPv6 address; vLLM then names the decoder
        # f"{remote_hostname}:{remote_port}" without brackets ("::1:port").
        try:
            with socket.socket(socket.AF_INET6) as probe:
                probe.bind(("::1", 0))
        except OSError:
            self.skipTest("no IPv6 loopback here")
        d, p = TransferEngine(), TransferEngine()
        try:
            self.assertEqual(d.initialize("::1", "P2PHANDSHAKE", "rdma", ""), 0)
            self.assertEqual(p.initialize("::1", "P2PHANDSHAKE", "rdma", ""), 0)
            dk, pk = KVCaches(), KVCaches(seed=5)
            self.assertEqual(d.batch_register_memory(dk.ptrs(), dk.lens()), 0)
            self.assertEqual(p.batch_register_memory(pk.ptrs(), pk.lens()), 0)
            session = "%s:%d" % ("::1", d.get_rpc_port())
            self.assertEqual(p.batch_transfer_sync_write(session, [pk.ptrs()[1] + BLOCK],
                                                         [dk.ptrs()[1] + 2 * BLOCK], [BLOCK]), 0,
                             errors.last_error_detail())
            self.assertEqual(dk.block(1, 2), pk.block(1, 1))
        finally:
            p.close()
            d.close()

    def test_unknown_protocol_fails_initialize(self):
        with self.assertRaises(RuntimeError):
            VLLMWorker(protocol="no-such-protocol")


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class VLLMPipeEngine:
    """The v0 MooncakePipe's MooncakeTransferEngine (ZeroMQ replaced by queues)."""

    def __init__(self, local_url, remote_url, to_peer, from_peer, acks_out, acks_in,
                 protocol="tcp"):
        self.engine = TransferEngine()
        self.engine.initialize(local_url, "P2PHANDSHAKE", protocol, "")  # return ignored
        self.remote_url = remote_url
        self.to_peer, self.from_peer = to_peer, from_peer
        self.acks_out, self.acks_in = acks_out, acks_in
        self.buffer_cleaner = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    def allocate_managed_buffer(self, length):
        ret = self.engine.allocate_managed_buffer(length)
        if ret <= 0:
            raise Exception("Allocation Return Error")
        return ret

    def free_managed_buffer(self, buffer, length):
        return self.engine.free_managed_buffer(buffer, length)

    def transfer_sync(self, buffer, peer_buffer_address, length):
        ret = self.engine.transfer_sync_read(self.remote_url, buffer, peer_buffer_address, length)
        if ret < 0:
            raise Exception("Transfer Return Error")
        return ret

    def wait_for_ack(self, src_ptr, length):
        self.acks_in.get(timeout=60)
        self.free_managed_buffer(src_ptr, length)

    def send_bytes(self, user_data):
        length = len(user_data)
        src_ptr = self.allocate_managed_buffer(length)
        self.engine.write_bytes_to_buffer(src_ptr, user_data, length)  # return ignored
        self.to_peer.put((src_ptr, length))
        self.buffer_cleaner.submit(self.wait_for_ack, src_ptr, length)

    def recv_bytes(self):
        src_ptr, length = self.from_peer.get(timeout=60)
        dst_ptr = self.allocate_managed_buffer(length)
        self.transfer_sync(dst_ptr, src_ptr, length)
        ret = self.engine.read_bytes_from_buffer(dst_ptr, length)
        self.acks_out.put(b"ACK")
        self.free_managed_buffer(dst_ptr, length)
        return ret

    def close(self):
        self.buffer_cleaner.shutdown(wait=True)
        self.engine.close()


@requires_engine
class TestVLLMPipe(unittest.TestCase):
    def setUp(self):
        p_url, d_url = "%s:%d" % (HOST, free_port()), "%s:%d" % (HOST, free_port())
        data, acks = queue.Queue(), queue.Queue()
        self.prefill = VLLMPipeEngine(p_url, d_url, data, None, None, acks)
        self.decode = VLLMPipeEngine(d_url, p_url, None, data, acks, None)
        # The pipe names its peer by the configured URL: the port asked for is kept.
        self.assertEqual(self.prefill.engine.get_session_id(), p_url)
        self.assertEqual(self.decode.engine.get_session_id(), d_url)

    def tearDown(self):
        self.prefill.close()
        self.decode.close()

    def test_send_recv_bytes(self):
        messages = [bytes([i]) * (1 + i * 4099) for i in range(1, 12)]
        messages.append(bytes(range(256)) * (3 << 12))  # a few MiB
        sender = concurrent.futures.ThreadPoolExecutor(max_workers=1)  # transport_thread
        try:
            for m in messages:
                sender.submit(self.prefill.send_bytes, m)
            for m in messages:
                got = self.decode.recv_bytes()
                self.assertIsInstance(got, bytes)
                self.assertEqual(got, m)
        finally:
            sender.shutdown(wait=True)
        self.prefill.buffer_cleaner.shutdown(wait=True)
        self.assertEqual(self.prefill.engine._managed, {})  # every buffer freed after its ACK
        self.assertEqual(self.decode.engine._managed, {})

    def test_write_bytes_result_is_visible(self):
        # send_bytes ignores write_bytes_to_buffer's return: whatever it accepts
        # must be what the peer reads.
        for payload in (b"abc", bytearray(b"defg"), memoryview(b"hijkl")):
            self.prefill.send_bytes(payload)
            self.assertEqual(self.decode.recv_bytes(), bytes(payload))

    def test_read_failure_is_negative(self):
        dst = self.decode.allocate_managed_buffer(64)
        try:
            with self.assertRaises(Exception):
                self.decode.transfer_sync(dst, 0x1000, 64)  # no such remote buffer
            rc = self.decode.engine.read_bytes_from_buffer(dst + 4096, 64)  # past the buffer
            self.assertIsInstance(rc, int)
            self.assertLess(rc, 0)
        finally:
            self.assertEqual(self.decode.free_managed_buffer(dst, 64), 0)

    def test_port_in_use_is_not_silently_replaced(self):
        # The pipe never reads back the session id: it names the peer by its
        # configured URL. An engine that had to take another port than
        # local_url's is unreachable under that name: the peer's read fails
        # (ret < 0, the pipe raises) instead of reading something else.
        busy = socket.socket()
        busy.bind((HOST, 0))
        busy.listen(1)
        url = "%s:%d" % (HOST, busy.getsockname()[1])
        te = TransferEngine()
        try:
            with EnvPatch(FERRY_TIMEOUT_MS=1000):
                te.initialize(url, "P2PHANDSHAKE", "tcp", "")  # return ignored
                reader = TransferEngine()
                reader.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
            try:
                self.assertNotEqual(te.get_session_id(), url)
                src = te.allocate_managed_buffer(64)
                self.assertGreater(src, 0)
                dst = reader.allocate_managed_buffer(64)
                self.assertLess(reader.transfer_sync_read(url, dst, src, 64), 0)
            finally:
                reader.close()
        finally:
            te.close()
            busy.close()

@requires_engine
class TestVLLMPipeMetadataBackends(unittest.TestCase):
    """The pipe's deployments name a metadata server: initialize(url, "h:p", ...)
    (etcd, Mooncake's default) or initialize_ext(url, "h:p", ..., "etcd"|"redis").
    Runs where scripts/services.sh set FERRY_TEST_ETCD / FERRY_TEST_REDIS."""

    def run_pipe(self, server, backend):
        import os
        if not os.environ.get(server):
            self.skipTest("%s is not set (scripts/services.sh)" % server)
        where = os.environ[server]
        p_url, d_url = "%s:%d" % (HOST, free_port()), "%s:%d" % (HOST, free_port())
        data, acks = queue.Queue(), queue.Queue()
        prefill = VLLMPipeEngine.__new__(VLLMPipeEngine)
        decode = VLLMPipeEngine.__new__(VLLMPipeEngine)
        for pipe, url, remote, args in ((prefill, p_url, d_url, (data, None, None, acks)),
                                        (decode, d_url, p_url, (None, data, acks, None))):
            pipe.engine = TransferEngine()
            if backend is None:
                pipe.engine.initialize(url, where, "tcp", "")  # return ignored
            else:
                pipe.engine.initialize_ext(url, where, "tcp", "", backend)
            pipe.remote_url = remote
            pipe.to_peer, pipe.from_peer, pipe.acks_out, pipe.acks_in = args
            pipe.buffer_cleaner = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        try:
            for m in (b"first" * 1000, bytes(range(256)) * 999):
                prefill.send_bytes(m)
                self.assertEqual(decode.recv_bytes(), m)
        finally:
            prefill.close()
            decode.close()

    def test_etcd_default(self):
        self.run_pipe("FERRY_TEST_ETCD", None)

    def test_initialize_ext_etcd(self):
        self.run_pipe("FERRY_TEST_ETCD", "etcd")

    def test_initialize_ext_redis(self):
        self.run_pipe("FERRY_TEST_REDIS", "redis")

@requires_engine
class TestVLLMPipeMooncakeVllmAdaptor(unittest.TestCase):
    """vLLM 0.7's MooncakePipe: `import mooncake_vllm_adaptor as mva`,
    mva.mooncake_vllm_adaptor() and the camelCase methods of Mooncake's first
    Python binding; transferSync reads (its only opcode)."""

    def setUp(self):
        import sys
        self.saved = {k: sys.modules.get(k) for k in ("mooncake", "mooncake.engine",
                                                       "mooncake_vllm_adaptor")}
        for k in self.saved:
            sys.modules.pop(k, None)
        import ferry
        ferry.install_mooncake_shim()

    def tearDown(self):
        import sys
        for k, v in self.saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v

    def test_send_recv_bytes(self):
        import mooncake_vllm_adaptor as mva
        p_url, d_url = "%s:%d" % (HOST, free_port()), "%s:%d" % (HOST, free_port())
        prefill, decode = mva.mooncake_vllm_adaptor(), mva.mooncake_vllm_adaptor()
        prefill.initialize(p_url, "P2PHANDSHAKE", "tcp", "")  # return ignored
        decode.initialize(d_url, "P2PHANDSHAKE", "tcp", "")
        try:
            user_data = bytes(range(256)) * 40
            length = len(user_data)
            src_ptr = prefill.allocateManagedBuffer(length)
            self.assertGreater(src_ptr, 0)
            prefill.writeBytesToBuffer(src_ptr, user_data, length)
            dst_ptr = decode.allocateManagedBuffer(length)
            self.assertGreater(dst_ptr, 0)
            ret = decode.transferSync(p_url, dst_ptr, src_ptr, length)
            self.assertGreaterEqual(ret, 0)
            self.assertEqual(decode.readBytesFromBuffer(dst_ptr, length), user_data)
            self.assertEqual(decode.freeManagedBuffer(dst_ptr, length), 0)
            self.assertEqual(prefill.freeManagedBuffer(src_ptr, length), 0)
            # A refused read is negative (the pipe raises on ret < 0).
            dst_ptr = decode.allocateManagedBuffer(length)
            self.assertLess(decode.transferSync(p_url, dst_ptr, src_ptr, length), 0)
            decode.freeManagedBuffer(dst_ptr, length)
        finally:
            prefill.close()
            decode.close()


class VLLMECTransfer:
    """The engine calls of vLLM's EC (encoder cache) Mooncake connector's
    MooncakeTransfer (ec_connector/mooncake/transfer.py), with its checks:
    a lazily initialized engine, the staging / receive slab registered with
    batch_register_memory([ptr], [nbytes]), fallback sources (sibling views of
    one storage, exact bytes each) registered per flush with reference counts
    and released with batch_unregister_memory, writes per session."""

    def __init__(self, protocol="tcp"):
        self.engine = TransferEngine()
        if self.engine.initialize(HOST, "P2PHANDSHAKE", protocol, "") != 0:
            raise RuntimeError("Mooncake TransferEngine initialization failed.")
        self.lock = threading.Lock()
        self.sources = {}  # address -> [nbytes, users]

    def local_session(self):
        return "%s:%d" % (HOST, self.engine.get_rpc_port())

    def register_memory(self, ptr, nbytes):
        return self.engine.batch_register_memory([ptr], [nbytes])

    def acquire_sources(self, views):
        acquired, new_a, new_n = [], [], []
        with self.lock:
            for addr, nbytes in dict(views).items():
                ent = self.sources.get(addr)
                if ent is not None:
                    ent[1] += 1
                else:
                    self.sources[addr] = [nbytes, 1]
                    new_a.append(addr)
                    new_n.append(nbytes)
                acquired.append(addr)
            if new_a and self.engine.batch_register_memory(new_a, new_n) != 0:
                for addr in acquired:
                    self.sources[addr][1] -= 1
                    if self.sources[addr][1] == 0:
                        del self.sources[addr]
                raise RuntimeError("Mooncake EC source registration failed")
        return acquired

    def release_sources(self, addrs):
        with self.lock:
            unused = []
            for addr in addrs:
                ent = self.sources.get(addr)
                if ent is None:
                    continue
                ent[1] -= 1
                if ent[1] == 0:
                    unused.append(addr)
            if not unused:
                return True
            if self.engine.batch_unregister_memory(unused) != 0:
                return False
            for addr in unused:
                del self.sources[addr]
            return True

    def write(self, session, sources, destinations, lengths):
        ret = self.engine.batch_transfer_sync_write(session, sources, destinations, lengths)
        if ret != 0:
            raise RuntimeError("Mooncake EC push to %s failed with status %s" % (session, ret))


@requires_engine
class TestVLLMECConnector(unittest.TestCase):
    SLAB = 1 << 20

    def setUp(self):
        self.producer, self.consumer = VLLMECTransfer(), VLLMECTransfer()
        self.recv = (ctypes.c_char * self.SLAB)()
        self.stage = (ctypes.c_char * self.SLAB)()
        self.assertEqual(self.consumer.register_memory(ctypes.addressof(self.recv), self.SLAB), 0)
        self.assertEqual(self.producer.register_memory(ctypes.addressof(self.stage), self.SLAB), 0)
        self.session = self.consumer.local_session()

    def tearDown(self):
        self.producer.engine.close()
        self.consumer.engine.close()

    def test_staged_push(self):
        base, dst = ctypes.addressof(self.stage), ctypes.addressof(self.recv)
        fill(self.stage, 21)
        self.producer.write(self.session, [base, base + 4096], [dst + 8192, dst], [4096, 1000])
        self.assertEqual(self.recv[8192:8192 + 4096], self.stage[0:4096])
        self.assertEqual(self.recv[0:1000], self.stage[4096:5096])

    def test_fallback_sibling_views_from_threads(self):
        # Two flushes at once, each registering sibling views of its own
        # encoder output storage, writing, then releasing them.
        outputs = [(ctypes.c_char * 12288)() for _ in range(2)]
        for i, o in enumerate(outputs):
            fill(o, 40 + i)
        dst = ctypes.addressof(self.recv)

        def flush(i):
            base = ctypes.addressof(outputs[i])
            views = [(base, 4096), (base + 4096, 8192)]  # adjacent, exact bytes each
            acquired = self.producer.acquire_sources(views)
            try:
                self.producer.write(self.session, [base, base + 4096],
                                    [dst + i * 16384, dst + i * 16384 + 4096], [4096, 8192])
            finally:
                self.assertTrue(self.producer.release_sources(acquired))

        for _ in range(3):
            with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
                for f in [pool.submit(flush, i) for i in range(2)]:
                    f.result(timeout=60)
        for i, o in enumerate(outputs):
            self.assertEqual(self.recv[i * 16384:i * 16384 + 12288], o[:])
        self.assertEqual(self.producer.sources, {})
        # Released: a push from them is refused, visibly.
        base = ctypes.addressof(outputs[0])
        with self.assertRaises(RuntimeError):
            self.producer.write(self.session, [base], [dst], [4096])


if __name__ == "__main__":
    unittest.main()
