# SPDX-License-Identifier: Apache-2.0
"""SGLang's own call sequences against a decode process (as test_pd_pair),
in SGLang's order and with its handling of return codes (our code, written
after SGLang's disaggregation/mooncake conn.py, conn_async.py, the encoder
server and receiver, and the MooncakeTransferEngine wrapper): the embedding
receiver's per-request buffers at a reused address, the encoder's /send from
two decoder ranks sharing one embedding, the KV sender's thread pool, the
last chunk's KV/state/aux, the async manager's submit-then-poll, a decode
restarted on the same port (with and without the probe loop), zero-length
entries, host-name session ids, and careless callers. Several once failed
silently or crashed (issue 14; the sibling /send before the repeated
registration was counted)."""

import concurrent.futures
import ctypes
import threading
import time
import unittest

from _support import HAVE_NUMPY, EnvPatch, requires_engine
from test_pd_pair import KV, PAGE, SLACK_S, TIMEOUT_MS, Decode, LocalKV, pattern, prefill_engine, sha

import ferry
from ferry import errors
from ferry.engine import TransferEngine, TransferNotify, TransferOpcode

EMB = 256 * 1024  # one request's embedding buffer


class SGLangWrapper:
    """What SGLang's MooncakeTransferEngine wrapper does with the engine
    (our own code, same calls and the same return-code handling): register
    and deregister swallow the code (a debug log there), transfer_sync and
    batch_transfer_sync return it, an exception counting as -1."""

    def __init__(self, te):
        self.engine = te
        self.register_codes = []  # what SGLang would only have logged

    def register(self, ptr, length):
        try:
            rc = self.engine.register_memory(ptr, length)
        except Exception:
            rc = -1
        self.register_codes.append(rc)

    def deregister(self, ptr):
        try:
            rc = self.engine.unregister_memory(ptr)
        except Exception:
            rc = -1
        self.register_codes.append(rc)

    def batch_register(self, ptrs, lengths):
        try:
            return self.engine.batch_register_memory(ptrs, lengths)
        except Exception:
            return -1

    def batch_deregister(self, ptrs):
        try:
            return self.engine.batch_unregister_memory(ptrs)
        except Exception:
            return -1

    def transfer_sync(self, session_id, buffer, peer_buffer_address, length):
        try:
            return self.engine.transfer_sync_write(session_id, buffer, peer_buffer_address, length)
        except Exception:
            return -1

    def batch_transfer_sync(self, session_id, buffers, peer_buffer_addresses, lengths):
        try:
            return self.engine.batch_transfer_sync_write(session_id, buffers,
                                                         peer_buffer_addresses, lengths)
        except Exception:
            return -1


@requires_engine
class TestSGLangSequences(unittest.TestCase):
    decode_protocol = "tcp"
    prefill_protocol = "rdma"  # SGLang asks for rdma; Ferry picks its transport

    @classmethod
    def setUpClass(cls):
        cls.decode = Decode(cls.decode_protocol)
        cls.te = prefill_engine(cls.prefill_protocol)
        cls.kv = LocalKV()
        assert cls.te.register_memory(cls.kv.addr, cls.kv.size) == 0

    @classmethod
    def tearDownClass(cls):
        cls.decode.close()
        cls.te.unregister_memory(cls.kv.addr)
        cls.te.close()

    def test_embedding_receiver_registers_per_request(self):
        # SGLang's encoder does not check transfer_sync's return value: a write
        # refused once (STALE_SEGMENT) left a zero-filled embedding. Each
        # request's buffer is registered, written once, deregistered; the
        # allocator hands the same address back.
        sid = self.decode.session_id
        first = None
        for request in range(12):
            reg = self.decode.ask(cmd="scratch_reg", size=EMB)
            self.assertEqual(reg["rc"], 0)
            first = first or reg["addr"]
            self.assertEqual(reg["addr"], first)  # the reused address
            data = pattern(EMB, 100 + request)
            self.kv.write(0, data)
            if request % 3 == 2:  # SGLang's async path
                bid = self.te.batch_transfer_async_write(sid, [self.kv.addr], [reg["addr"]], [EMB])
                self.assertGreater(bid, 0, errors.last_error_detail())
                rc = self.te.get_batch_transfer_status([bid])
            else:
                rc = self.te.transfer_sync(sid, self.kv.addr, reg["addr"], EMB, TransferOpcode.Write,
                                           TransferNotify("emb", "req-%d" % request))
            self.assertEqual(rc, 0, "request %d: %s" % (request, errors.last_error_detail()))
            self.assertEqual(self.decode.ask(cmd="scratch_digest", n=EMB)["sha256"], sha(data))
            self.assertEqual(self.decode.ask(cmd="scratch_dereg")["rc"], 0)
            # Deregistered: a late write is refused, nothing lands.
            self.kv.write(0, pattern(EMB, 999))
            rc = self.te.transfer_sync_write(sid, self.kv.addr, reg["addr"], EMB)
            self.assertEqual(rc, errors.ADDRESS_NOT_REGISTERED)
            self.assertEqual(self.decode.ask(cmd="scratch_digest", n=EMB)["sha256"], sha(data))
        self.decode.ask(cmd="notifies")

    def test_zero_length_entries(self):
        # A KV batch whose aux or last page is empty: complete as on Mooncake.
        sid, raddr = self.decode.session_id, self.decode.kv_addr
        self.kv.write(0, pattern(4 * PAGE, 7))
        bufs = [self.kv.addr + i * PAGE for i in range(4)]
        peers = [raddr + i * PAGE for i in range(4)]
        lens = [PAGE, 0, PAGE, 0]
        self.assertEqual(self.te.batch_transfer_sync_write(sid, bufs, peers, lens), 0,
                         errors.last_error_detail())
        self.assertEqual(self.decode.digests([(0, PAGE), (2 * PAGE, PAGE)]),
                         [sha(self.kv.read(0, PAGE)), sha(self.kv.read(2 * PAGE, PAGE))])
        bid = self.te.batch_transfer_async_write(sid, bufs, peers, [0, 0, 0, 0])
        self.assertGreater(bid, 0)
        self.assertEqual(self.te.get_batch_transfer_status([bid]), 0)
        self.assertEqual(self.te.transfer_sync_read(sid, self.kv.addr, raddr, 0), 0)

    def test_careless_callers(self):
        sid, raddr = self.decode.session_id, self.decode.kv_addr
        with self.assertRaises(TypeError):
            self.te.transfer_sync(sid, self.kv.addr, raddr, 64, TransferOpcode.Write, "KV_DONE")
        with self.assertRaises(TypeError):
            self.te.transfer_sync_write(sid, self.kv.addr, str(raddr), 64)
        self.assertEqual(self.te.write_bytes_to_buffer(0, b"x" * 8, 8), errors.ADDRESS_NOT_REGISTERED)
        self.assertEqual(self.te.read_bytes_from_buffer(0, 8), errors.ADDRESS_NOT_REGISTERED)
        self.assertEqual(self.te.read_bytes_from_buffer(1, 16), errors.ADDRESS_NOT_REGISTERED)
        # The peer's address is not ours: the helpers touch only our own
        # registrations. Another process's address can coincide with one of
        # ours (seen once in CI: 8 zero bytes of our own buffer came back);
        # then it is ours, and the check says nothing.
        if self.te._eng().registered_overlap(raddr, 8) is None:
            self.assertEqual(self.te.read_bytes_from_buffer(raddr, 8), errors.ADDRESS_NOT_REGISTERED)
        self.assertEqual(self.te.write_bytes_to_buffer(self.kv.addr, b"ok", 2), 0)
        # An async submit to a peer nobody answers for: 0, the reason kept.
        self.assertEqual(self.te.batch_transfer_async_write("127.0.0.1:1", [self.kv.addr], [raddr],
                                                            [64]), 0)
        self.assertIsNotNone(ferry.last_error())
        self.assertIn("127.0.0.1:1", errors.last_error_detail())
        strict = TransferEngine(raise_on_error=True, engine=self.te.engine)
        with self.assertRaises(ferry.FerryError):
            strict.batch_transfer_async_write("127.0.0.1:1", [self.kv.addr], [raddr], [64])
        # The engine is fine afterwards.
        self.assertEqual(self.te.transfer_sync_write(sid, self.kv.addr, raddr, 64), 0)

    def test_encoder_sibling_sends_share_one_embedding(self):
        # SGLang's encoder server, /send from two decoder TP ranks for one
        # request (encoder/server.py, versions that ignore transfer_sync's
        # result): each call registers the embedding when the shared
        # registration is missing, transfer_syncs from a worker thread
        # (asyncio.to_thread) and deregisters. Interleaved as threads may:
        # B registers while A holds the region (a duplicate registration), A
        # finishes and deregisters, then B transfers. B's write was refused
        # (the region gone: ADDRESS_NOT_REGISTERED), its code ignored: the
        # second rank got no embedding. Found failing before the fix.
        sid, raddr = self.decode.session_id, self.decode.kv_addr
        wrapper = SGLangWrapper(self.te)
        emb = LocalKV(EMB)  # the embedding tensor, not registered by itself
        data = pattern(EMB, 31)
        emb.write(0, data)
        dst = [raddr + 2 * PAGE, raddr + 2 * PAGE + EMB]  # each decode rank's buffer
        a_registered, a_done = threading.Event(), threading.Event()
        results = {}

        def send(rank):
            if rank == 1:
                a_registered.wait(10)
            wrapper.register(emb.addr, EMB)
            if rank == 0:
                a_registered.set()
            else:
                a_done.wait(10)
            results[rank] = wrapper.transfer_sync(sid, emb.addr, dst[rank], EMB)  # ignored by SGLang
            wrapper.deregister(emb.addr)
            if rank == 0:
                a_done.set()

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(send, [0, 1]))
        self.assertEqual(self.decode.digests([(dst[0] - raddr, EMB), (dst[1] - raddr, EMB)]),
                         [sha(data), sha(data)], "results %r" % results)
        self.assertEqual(results, {0: 0, 1: 0})
        self.assertEqual(wrapper.register_codes, [0] * 4)  # nothing SGLang would only have logged
        # Balanced: the embedding is no longer registered afterwards.
        self.assertEqual(self.te.transfer_sync_write(sid, emb.addr, dst[0], EMB),
                         errors.ADDRESS_NOT_REGISTERED)
        self.assertEqual(self.te.unregister_memory(emb.addr), errors.ADDRESS_NOT_REGISTERED)

    def test_duplicate_registration_counts(self):
        # The same range registered twice (a tied weight's storage listed under
        # two names, SGLang's register_memory_region_v1; sibling /send calls)
        # stays registered until the last unregister; a range that only
        # overlaps stays refused, and batch (un)registration counts the same way.
        buf = LocalKV(4 * PAGE)
        try:
            self.assertEqual(self.te.register_memory(buf.addr, 2 * PAGE), 0)
            self.assertEqual(self.te.register_memory(buf.addr, 2 * PAGE), 0)
            self.assertEqual(self.te.register_memory(buf.addr, PAGE), errors.ADDRESS_OVERLAPPED)
            self.assertEqual(self.te.register_memory(buf.addr + PAGE, 2 * PAGE),
                             errors.ADDRESS_OVERLAPPED)
            # Batch: one entry a duplicate, one new; a refused batch takes no count.
            self.assertEqual(self.te.batch_register_memory([buf.addr, buf.addr + PAGE],
                                                           [2 * PAGE, PAGE]),
                             errors.ADDRESS_OVERLAPPED)
            self.assertEqual(self.te.batch_register_memory([buf.addr, buf.addr + 2 * PAGE],
                                                           [2 * PAGE, PAGE]), 0)
            self.assertEqual(self.te.engine.region_info(buf.addr).len, 2 * PAGE)
            self.assertEqual(self.te.unregister_memory(buf.addr), 0)
            self.assertEqual(self.te.batch_unregister_memory([buf.addr, buf.addr + 2 * PAGE]), 0)
            self.assertEqual(self.te.engine.region_info(buf.addr).len, 2 * PAGE)  # one count left
            self.assertEqual(self.te.unregister_memory(buf.addr), 0)
            for a in (buf.addr, buf.addr + 2 * PAGE):
                self.assertEqual(self.te.unregister_memory(a), errors.ADDRESS_NOT_REGISTERED)
            if HAVE_NUMPY:  # SGLang's pointer lists may be numpy arrays: the vector path
                import numpy as np
                self.assertEqual(self.te.register_memory(buf.addr, PAGE), 0)
                addrs = np.array([buf.addr, buf.addr + PAGE, buf.addr + 2 * PAGE], dtype=np.uint64)
                self.assertEqual(self.te.batch_register_memory(addrs, np.full(3, PAGE, np.int64)), 0)
                self.assertEqual(self.te.batch_unregister_memory(addrs), 0)
                self.assertEqual(self.te.engine.region_info(buf.addr).len, PAGE)
                self.assertEqual(self.te.unregister_memory(buf.addr), 0)
                for a in addrs.tolist():
                    self.assertEqual(self.te.unregister_memory(a), errors.ADDRESS_NOT_REGISTERED)
            # Only ranges registered through register_memory / batch_register_memory
            # count: a managed buffer registered again is refused, as in Mooncake.
            addr = self.te.allocate_managed_buffer(PAGE)
            self.assertEqual(self.te.register_memory(addr, PAGE), errors.ADDRESS_OVERLAPPED)
            self.assertEqual(self.te.free_managed_buffer(addr, PAGE), 0)
            # A count does not outlive its range when the range goes another way.
            self.assertEqual(self.te.register_memory(buf.addr, PAGE), 0)
            self.assertEqual(self.te.register_memory(buf.addr, PAGE), 0)
            self.te.engine.deregister(buf.addr)
            self.assertEqual(self.te.unregister_memory(buf.addr), errors.ADDRESS_NOT_REGISTERED)
            self.assertEqual(self.te.register_memory(buf.addr, PAGE), 0)
            self.assertEqual(self.te.unregister_memory(buf.addr), 0)
            self.assertEqual(self.te.unregister_memory(buf.addr), errors.ADDRESS_NOT_REGISTERED)
        finally:
            for a in (buf.addr, buf.addr + 2 * PAGE):
                while self.te.unregister_memory(a) == 0:
                    pass

    def test_kv_slice_sends_from_thread_pool(self):
        # send_kvcache_slice (prefill and decode with different attention TP):
        # per layer, K and V, one batch_transfer_sync per layer submitted to a
        # ThreadPoolExecutor, one entry per token slot (a head slice of it),
        # addresses from numpy .tolist(), a status != 0 failing the request.
        # Then send_aux and the state (maybe_send_extra) on the last chunk,
        # whose codes the transfer worker reads only for aux.
        sid, raddr = self.decode.session_id, self.decode.kv_addr
        engine = SGLangWrapper(self.te)
        layers, page_size, pages = 4, 16, 8
        src_item, dst_item = 2048, 1024  # prefill page holds 2 heads' worth, decode 1
        slot_src, slot_dst = src_item // page_size, dst_item // page_size
        head_bytes = slot_dst  # one head's slice of a token slot
        kv_span = layers * 2 * 64 * src_item  # per tensor: 64 pages
        self.assertLessEqual(kv_span, self.kv.size)
        self.kv.write(0, pattern(kv_span, 41))
        src_k = [i * 64 * src_item for i in range(layers)]
        src_v = [(layers + i) * 64 * src_item for i in range(layers)]
        dst_k = [raddr + i * 64 * dst_item for i in range(layers)]
        dst_v = [raddr + (layers + i) * 64 * dst_item for i in range(layers)]
        prefill_pages = [5, 9, 10, 11, 30, 31, 40, 63][:pages]
        decode_pages = [1, 2, 3, 7, 8, 20, 50, 60][:pages]
        src_head_offset = slot_dst  # this decode rank takes the second head

        def slices(src_off, dst_layer):
            src, dst = [], []
            for p, d in zip(prefill_pages, decode_pages):
                for t in range(page_size):
                    src.append(self.kv.addr + src_off + p * src_item + t * slot_src + src_head_offset)
                    dst.append(dst_layer + d * dst_item + t * slot_dst)
            return src, dst

        def process_layer(src_off, dst_layer):
            src, dst = slices(src_off, dst_layer)
            if HAVE_NUMPY:
                import numpy as np
                src, dst = np.array(src, dtype=np.int64).tolist(), np.array(dst, dtype=np.int64).tolist()
            return engine.batch_transfer_sync(sid, src, dst, [head_bytes] * len(src))

        with concurrent.futures.ThreadPoolExecutor(4) as executor:
            futures = [executor.submit(process_layer, src_k[i], dst_k[i]) for i in range(layers)]
            futures += [executor.submit(process_layer, src_v[i], dst_v[i]) for i in range(layers)]
            statuses = [f.result() for f in concurrent.futures.as_completed(futures)]
        self.assertEqual(statuses, [0] * (2 * layers), errors.last_error_detail())
        expect, ranges = [], []
        for src_off, dst_layer in zip(src_k + src_v, dst_k + dst_v):
            src, dst = slices(src_off, dst_layer)
            for s, d in zip(src, dst):
                expect.append(sha(ctypes.string_at(s, head_bytes)))
                ranges.append((d - raddr, head_bytes))
        self.assertEqual(self.decode.digests(ranges), expect)

    def test_last_chunk_aux_and_state_after_kv(self):
        # The transfer worker's last chunk: send_kvcache (one batch over all
        # layers), then maybe_send_extra (mamba state: one entry per state
        # tensor, code ignored) and send_aux (one entry per aux buffer, code
        # read). The prefill's aux and state buffers are registered with
        # batch_register at start-up, each list on its own, as SGLang does.
        sid, raddr = self.decode.session_id, self.decode.kv_addr
        engine = SGLangWrapper(self.te)
        aux = LocalKV(3 * 4096)
        state = LocalKV(2 * 8192)
        self.assertEqual(engine.batch_register([aux.addr, aux.addr + 4096, aux.addr + 8192],
                                               [4096, 4096, 4096]), 0)
        self.assertEqual(engine.batch_register([state.addr, state.addr + 8192], [8192, 8192]), 0)
        try:
            aux.write(0, pattern(3 * 4096, 51))
            state.write(0, pattern(2 * 8192, 52))
            self.kv.write(0, pattern(4 * PAGE, 53))
            blocks = [(self.kv.addr + i * PAGE, raddr + (7 - i) * PAGE, PAGE) for i in range(4)]
            src, dst, lens = zip(*blocks)
            self.assertEqual(engine.batch_transfer_sync(sid, list(src), list(dst), list(lens)), 0)
            state_item, state_index, dst_state = 2048, 2, raddr + 16 * PAGE
            blocks = [(state.addr + i * 8192 + state_item * state_index,
                       dst_state + i * 8192 + state_item * 1, state_item) for i in range(2)]
            src, dst, lens = zip(*blocks)
            engine.batch_transfer_sync(sid, list(src), list(dst), list(lens))  # ignored there
            aux_item, aux_index, dst_aux = 512, 3, raddr + 20 * PAGE
            blocks = [(aux.addr + i * 4096 + aux_item * aux_index,
                       dst_aux + i * 4096 + aux_item * 5, aux_item) for i in range(3)]
            src, dst, lens = zip(*blocks)
            self.assertEqual(engine.batch_transfer_sync(sid, list(src), list(dst), list(lens)), 0)
            got = self.decode.digests([((7 - i) * PAGE, PAGE) for i in range(4)]
                                      + [(16 * PAGE + i * 8192 + state_item, state_item)
                                         for i in range(2)]
                                      + [(20 * PAGE + i * 4096 + aux_item * 5, aux_item)
                                         for i in range(3)])
            want = ([sha(self.kv.read(i * PAGE, PAGE)) for i in range(4)]
                    + [sha(ctypes.string_at(state.addr + i * 8192 + state_item * state_index,
                                            state_item)) for i in range(2)]
                    + [sha(ctypes.string_at(aux.addr + i * 4096 + aux_item * aux_index, aux_item))
                       for i in range(3)])
            self.assertEqual(got, want)
        finally:
            self.assertEqual(engine.batch_deregister([aux.addr, aux.addr + 4096, aux.addr + 8192]), 0)
            self.assertEqual(engine.batch_deregister([state.addr, state.addr + 8192]), 0)

    def test_layerwise_async_submit_then_poll_from_another_thread(self):
        # SGLang's MooncakeAsyncKVManager (conn_async.py): a submitter thread
        # calls transfer_submit_write once per contiguous block of each layer
        # as the layer is ready; the transfer thread, once every layer's ids
        # are in, polls each id with `while status == 0` and asserts == 1.
        # A write the decode refuses must come back as -1 (never 0 forever).
        sid, raddr = self.decode.session_id, self.decode.kv_addr
        layers, item = 6, 4096
        self.kv.write(0, pattern(layers * 16 * item, 71))
        blocks = [(1, 9, 3), (5, 2, 1), (12, 20, 4)]  # (src index, dst index, length in items)
        bids = {}
        submitted = threading.Event()

        def submitter():
            for layer in range(layers):
                src_ptr, dst_ptr = self.kv.addr + layer * 16 * item, raddr + layer * 32 * item
                bids[layer] = [self.te.transfer_submit_write(sid, src_ptr + s * item,
                                                             dst_ptr + d * item, n * item)
                               for s, d, n in blocks]
            bids["bad"] = [self.te.transfer_submit_write(sid, self.kv.addr, raddr + KV, item)]
            submitted.set()

        def poll(bid):
            status = self.te.transfer_check_status(bid)
            end = time.monotonic() + TIMEOUT_MS / 1000 + SLACK_S
            while status == 0 and time.monotonic() < end:
                status = self.te.transfer_check_status(bid)
                time.sleep(1e-3)
            return status

        t = threading.Thread(target=submitter)
        t.start()
        self.assertTrue(submitted.wait(30))
        t.join()
        self.assertTrue(all(b > 0 for ids in bids.values() for b in ids), bids)
        self.assertEqual([poll(b) for layer in range(layers) for b in bids[layer]],
                         [1] * (layers * len(blocks)))
        self.assertEqual(poll(bids["bad"][0]), -1)
        self.assertEqual(errors.last_error_code(), errors.ADDRESS_NOT_REGISTERED)
        ranges, want = [], []
        for layer in range(layers):
            for s, d, n in blocks:
                ranges.append((layer * 32 * item + d * item, n * item))
                want.append(sha(self.kv.read(layer * 16 * item + s * item, n * item)))
        self.assertEqual(self.decode.digests(ranges), want)


@requires_engine
class TestSGLangSequencesShm(TestSGLangSequences):
    """The same over the same-host transport (cross-memory attach), whose
    target checks the registry as tcp's does."""
    decode_protocol = "shm"
    prefill_protocol = "shm"

    def test_transport_is_shm(self):
        sid = self.decode.session_id
        self.assertEqual(self.te.transfer_sync_write(sid, self.kv.addr, self.decode.kv_addr, 64), 0)
        info = self.te.engine.session_info(sid)
        if info.transport != "shm":
            self.skipTest("shm not chosen here: %s" % info.transport_reason)


@requires_engine
class TestDecodeRestartWithoutProbe(unittest.TestCase):
    """A decode restarted on the same port: the call that meets it fails with
    PEER_RESTARTED and writes nothing; the next call (new addresses) works,
    sync and async, with no send_probe (SGLang's probe is off by default)."""

    def test_restart_then_next_call_works(self):
        # (The async path also recovers through the binding's Mooncake-like
        # session cache; the sync path needs the library's own re-open.)
        decode = Decode("tcp")
        te = prefill_engine("tcp")
        kv = LocalKV(KV)
        try:
            self.assertEqual(te.register_memory(kv.addr, kv.size), 0)
            sid, old_addr = decode.session_id, decode.kv_addr
            self.assertEqual(te.transfer_sync_write(sid, kv.addr, old_addr, PAGE), 0)
            decode.kill()
            decode.close()
            try:
                decode = Decode("tcp", hostname=sid)
            except RuntimeError as exc:
                self.skipTest("could not restart on the same port: %s" % exc)
            rc = te.batch_transfer_sync_write(sid, [kv.addr], [old_addr], [PAGE])
            self.assertEqual(rc, errors.PEER_RESTARTED, errors.last_error_detail())
            self.assertEqual(decode.digests([(0, PAGE)]), [sha(bytes(PAGE))])  # nothing landed
            kv.write(0, pattern(2 * PAGE, 5))
            rc = te.batch_transfer_sync_write(sid, [kv.addr + PAGE], [decode.kv_addr + PAGE], [PAGE])
            self.assertEqual(rc, 0, errors.last_error_detail())
            self.assertEqual(decode.digests([(PAGE, PAGE)]), [sha(kv.read(PAGE, PAGE))])
            bid = te.batch_transfer_async_write(sid, [kv.addr], [decode.kv_addr], [PAGE])
            self.assertGreater(bid, 0, errors.last_error_detail())
            self.assertEqual(te.get_batch_transfer_status([bid]), 0, errors.last_error_detail())
            self.assertEqual(decode.digests([(0, PAGE)]), [sha(kv.read(0, PAGE))])
        finally:
            decode.kill()
            decode.close()
            te.close()

    def test_thread_pool_and_probe_loop_across_a_restart(self):
        # SGLang's prefill: executor threads send layers to one decode session
        # (batch_transfer_sync, status != 0 marks the session failed) while
        # the failed-session probe loop (SGLANG_ENABLE_FAILED_SESSION_PROBE)
        # calls send_probe on it from its own thread. The decode dies and a
        # new one takes its port: every call returns (no hang, no crash),
        # the new decode's memory gets no write at the old addresses unless
        # the new process registered them, and once the new decode
        # re-registers, every thread's calls with its addresses work.
        decode = Decode("tcp")
        te = prefill_engine("tcp")
        kv = LocalKV(KV)
        stop = threading.Event()
        target = {"addr": decode.kv_addr}
        results, probes = [], []

        def layer_sender(layer):
            while not stop.is_set():
                base = target["addr"]
                results.append((base, te.batch_transfer_sync_write(
                    sid, [kv.addr + layer * PAGE], [base + layer * PAGE], [PAGE]), layer,
                    errors.last_error_detail()))

        def probe_loop():
            while not stop.is_set():
                probes.append(te.send_probe(sid))
                stop.wait(0.02)

        try:
            self.assertEqual(te.register_memory(kv.addr, kv.size), 0)
            kv.write(0, pattern(8 * PAGE, 61))
            sid = decode.session_id
            pool = concurrent.futures.ThreadPoolExecutor(5)
            futures = [pool.submit(layer_sender, i) for i in range(4)] + [pool.submit(probe_loop)]
            deadline = time.monotonic() + 20
            while not any(r[1] == 0 for r in results) and time.monotonic() < deadline:
                time.sleep(0.01)
            decode.kill()
            decode.close()
            try:
                decode = Decode("tcp", hostname=sid)
            except RuntimeError as exc:
                stop.set()
                pool.shutdown()
                self.skipTest("could not restart on the same port: %s" % exc)
            target["addr"] = decode.kv_addr  # the new decode re-registered
            n = len(results)
            deadline = time.monotonic() + 3 * (TIMEOUT_MS / 1000 + SLACK_S)
            while time.monotonic() < deadline:
                done = {r[2] for r in results[n:] if r[0] == decode.kv_addr and r[1] == 0}
                if len(done) == 4:
                    break
                time.sleep(0.05)
            stop.set()
            for f in futures:
                f.result(timeout=3 * (TIMEOUT_MS / 1000 + SLACK_S))  # none hung or raised
            pool.shutdown()
            for layer in range(4):
                mine = [r for r in results[n:] if r[2] == layer]
                self.assertTrue([r for r in mine if r[0] == decode.kv_addr and r[1] == 0],
                                "layer %d: %r" % (layer, mine[-5:]))
            self.assertTrue(all(r[1] <= 0 for r in results))
            self.assertTrue(all(rc <= 0 for rc in probes))
            # The last writes with the new addresses hold the prefill's bytes.
            self.assertEqual(decode.digests([(i * PAGE, PAGE) for i in range(4)]),
                             [sha(kv.read(i * PAGE, PAGE)) for i in range(4)])
        finally:
            stop.set()
            decode.kill()
            decode.close()
            te.close()


@requires_engine
class TestSGLangSessionIdForms(unittest.TestCase):
    """SGLang names a peer f"{maybe_wrap_ipv6_address(host)}:{get_rpc_port()}"
    with the host it passed to initialize: a host name works as an IP does,
    and the name a peer dials need not be spelled as the target spelled it
    (IPv6 forms: test_mooncake_sequences.test_ipv6_session_id_like_sglang)."""

    def test_hostname_forms(self):
        for target_host, dial in (("localhost", "localhost"), ("127.0.0.1", "localhost"),
                                  ("localhost", "127.0.0.1")):
            with self.subTest(target=target_host, dial=dial):
                d = TransferEngine()
                with EnvPatch(FERRY_TRANSPORT=None, FERRY_METADATA=None):
                    rc = d.initialize(target_host, "P2PHANDSHAKE", "rdma", "")
                self.assertEqual(rc, 0, errors.last_error_detail())
                p = prefill_engine("rdma")
                try:
                    a, b = LocalKV(PAGE), LocalKV(PAGE)
                    self.assertEqual(d.register_memory(a.addr, PAGE), 0)
                    self.assertEqual(p.register_memory(b.addr, PAGE), 0)
                    b.write(0, pattern(PAGE, 81))
                    sid = "%s:%d" % (dial, d.get_rpc_port())
                    self.assertEqual(p.batch_transfer_sync_write(sid, [b.addr], [a.addr], [PAGE]), 0,
                                     errors.last_error_detail())
                    self.assertEqual(a.read(0, PAGE), b.read(0, PAGE))
                    self.assertEqual(p.send_probe(sid), 0)
                finally:
                    d.close()
                    p.close()


if __name__ == "__main__":
    unittest.main()
