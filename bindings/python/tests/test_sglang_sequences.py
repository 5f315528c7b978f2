"""SGLang's own call sequences against a decode process (as test_pd_pair):
the embedding receiver's per-request buffers at a reused address, a decode
restarted on the same port with no probe, zero-length entries, and careless
callers. Each once failed silently or crashed (issue 14)."""

import ctypes
import unittest

from _support import requires_engine
from test_pd_pair import KV, PAGE, Decode, LocalKV, pattern, prefill_engine, sha

import ferry
from ferry import errors
from ferry.engine import TransferEngine, TransferNotify, TransferOpcode

EMB = 256 * 1024  # one request's embedding buffer


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
        # The peer's address is not ours: the helpers touch only our own registrations.
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


if __name__ == "__main__":
    unittest.main()
