# SPDX-License-Identifier: Apache-2.0
"""TransferEngine's async batch ids asked about from several threads at once:
every thread gets the batch's real outcome, never -1 / NOT_FOUND because
another thread consumed the batch a moment before (the auditor's report:
transfer_check_status from two threads reported a completed batch failed)."""

import ctypes
import threading
import time
import types
import unittest

from _support import EnvPatch, requires_engine
from ferry import TransferEngine, core, errors
from ferry._async_batches import _AsyncBatch

MiB = 1 << 20
THREADS = 6
ROUNDS = 40


def _poll(te, bid, deadline_s=30.0):
    """The documented loop: until 1, -1 or -2; (value, code) with this thread's code."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        st = te.transfer_check_status(bid)
        if st != 0:
            return st, errors.last_error_code()
    return "hung", 0


@requires_engine
class TestAsyncBatchThreads(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with EnvPatch(FERRY_TIMEOUT_MS="5000", FERRY_CONNECT_TIMEOUT_MS="2000",
                      FERRY_TRANSPORT=None, FERRY_METADATA=None):
            cls.p = TransferEngine()
            cls.d = TransferEngine()
            assert cls.p.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
            assert cls.d.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        cls.src = (ctypes.c_char * MiB)()
        cls.dst = (ctypes.c_char * MiB)()
        cls.src_addr = ctypes.addressof(cls.src)
        cls.dst_addr = ctypes.addressof(cls.dst)
        assert cls.p.register_memory(cls.src_addr, MiB) == 0
        assert cls.d.register_memory(cls.dst_addr, MiB) == 0
        cls.sid = cls.d.get_session_id()

    @classmethod
    def tearDownClass(cls):
        cls.p.close()
        cls.d.close()

    def _submit(self, length=64 * 1024, bad=False):
        remote = self.dst_addr + (8 * MiB if bad else 0)
        bid = self.p.batch_transfer_async_write(self.sid, [self.src_addr] * 4,
                                                [remote + i * length for i in range(4)],
                                                [length] * 4)
        self.assertGreater(bid, 0, errors.last_error_detail())
        return bid

    def _race(self, bid, calls):
        """Runs every call(bid) in its own thread, released together; their results."""
        out = [None] * len(calls)
        gate = threading.Barrier(len(calls))

        def run(i):
            gate.wait()
            out[i] = calls[i](bid)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
            self.assertFalse(t.is_alive(), "a status call hung")
        return out

    def test_check_status_from_many_threads(self):
        for r in range(ROUNDS):
            bid = self._submit()
            got = self._race(bid, [lambda b: _poll(self.p, b)] * THREADS)
            self.assertEqual([g[0] for g in got], [1] * THREADS, "round %d: %r" % (r, got))
            # Asked again afterwards: still the same answer.
            self.assertEqual(self.p.transfer_check_status(bid), 1)

    def test_wait_racing_check_status(self):
        def wait(b):
            return self.p.get_batch_transfer_status([b]), errors.last_error_code()
        for r in range(ROUNDS):
            bid = self._submit(length=256 * 1024 if r % 2 else 4096)
            got = self._race(bid, [wait, wait] + [lambda b: _poll(self.p, b)] * (THREADS - 2))
            self.assertEqual(got[:2], [(0, 0)] * 2, "round %d: %r" % (r, got))
            self.assertEqual([g[0] for g in got[2:]], [1] * (THREADS - 2), "round %d: %r" % (r, got))

    def test_failed_batch_same_failure_everywhere(self):
        def wait(b):
            return self.p.get_batch_transfer_status([b]), errors.last_error_code()
        for r in range(ROUNDS // 4):
            bid = self._submit(length=4096, bad=True)
            got = self._race(bid, [wait] + [lambda b: _poll(self.p, b)] * (THREADS - 1))
            self.assertEqual(got[0], (errors.ADDRESS_NOT_REGISTERED,) * 2, "round %d: %r" % (r, got))
            self.assertEqual(got[1:], [(-1, errors.ADDRESS_NOT_REGISTERED)] * (THREADS - 1),
                             "round %d: %r" % (r, got))

    def test_a_timeout_is_minus_two_once_then_failed(self):
        # Mooncake keeps a timed-out batch (-2) and it ends failed (-1) later, so
        # some callers poll on past -2; Ferry's timeout is final, so a second -2
        # would keep them polling forever. (A batch stands in for one whose
        # request timed out: a real one to a stopped peer most often ends
        # CANCEL_UNCONFIRMED, the bytes it sent being in doubt.)
        class TimedOut:
            def statuses(self):
                return [types.SimpleNamespace(done=True, ok=False, code=errors.TIMEOUT,
                                              state=core.STATUS_TIMEOUT, state_name="TIMEOUT")]

            def _shutdown(self):
                pass

        te = self.p
        with te._lock:
            bid = next(te._batch_ids)
            te._batches[bid] = _AsyncBatch(TimedOut(), 1, 4096)
        self.assertEqual(te.transfer_check_status(bid), -2)
        self.assertEqual(errors.last_error_code(), errors.TIMEOUT)
        self.assertEqual(_poll(te, bid), (-1, errors.TIMEOUT))
        self.assertEqual(te.transfer_check_status(bid), -1)
        self.assertEqual(te.get_batch_transfer_status([bid]), errors.TIMEOUT)

    def test_outcomes_are_remembered_for_a_bounded_count(self):
        te = self.p
        saved = te._REMEMBERED_OUTCOMES
        te._REMEMBERED_OUTCOMES = 3
        try:
            ids = [te.batch_transfer_async_write(self.sid, [], [], []) for _ in range(5)]
            self.assertEqual([te.get_batch_transfer_status([b]) for b in ids], [0] * 5)
            self.assertEqual([te.transfer_check_status(b) for b in ids[2:]], [1] * 3)
            # The two oldest are forgotten: an unknown id, -1 with NOT_FOUND.
            self.assertEqual(te.transfer_check_status(ids[0]), -1)
            self.assertEqual(errors.last_error_code(), errors.NOT_FOUND)
            self.assertIn("last 3 batches", errors.last_error_detail())
            self.assertEqual(te.get_batch_transfer_status([ids[1]]), errors.NOT_FOUND)
        finally:
            te._REMEMBERED_OUTCOMES = saved

    def test_close_under_pollers(self):
        # The engine closed while threads poll and wait on its batches: each
        # call returns one of Mooncake's values or a code (never hangs or
        # raises), and the loops end.
        with EnvPatch(FERRY_TIMEOUT_MS="5000", FERRY_CONNECT_TIMEOUT_MS="2000",
                      FERRY_TRANSPORT=None, FERRY_METADATA=None):
            te = TransferEngine()
            assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert te.register_memory(self.src_addr, MiB) == 0
        ids = [te.batch_transfer_async_write(self.sid, [self.src_addr] * 4,
                                             [self.dst_addr + i * 256 * 1024 for i in range(4)],
                                             [256 * 1024] * 4) for _ in range(8)]
        self.assertTrue(all(b > 0 for b in ids), ids)
        results, errs = [], []
        gate = threading.Barrier(2 * THREADS + 1)

        def poll(bid):
            gate.wait()
            try:
                results.append(_poll(te, bid))
            except Exception as exc:  # pragma: no cover - the failure reported below
                errs.append(exc)

        def wait(bid):
            gate.wait()
            try:
                results.append((te.get_batch_transfer_status([bid]), 0))
            except Exception as exc:  # pragma: no cover
                errs.append(exc)
        threads = [threading.Thread(target=poll if i % 2 else wait, args=(ids[i % len(ids)],))
                   for i in range(2 * THREADS)]
        for t in threads:
            t.start()
        gate.wait()
        te.close()
        for t in threads:
            t.join(60)
            self.assertFalse(t.is_alive(), "a status call hung across close")
        self.assertEqual(errs, [])
        self.assertEqual(len(results), 2 * THREADS)
        for rc, _ in results:
            self.assertIn(rc, (0, 1, -1, errors.CONTEXT, errors.NOT_FOUND, errors.CANCELLED), results)


if __name__ == "__main__":
    unittest.main()
