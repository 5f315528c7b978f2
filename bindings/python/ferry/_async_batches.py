# SPDX-License-Identifier: Apache-2.0
"""TransferEngine's async batches (Mooncake's batch_transfer_async,
get_batch_transfer_status, transfer_check_status) and the scaled deadline
its large calls carry: a mixin of ferry.engine.TransferEngine, which keeps
the state (self._lock, self._batches, self._batch_ids) and the helpers
(_eng, _run, _run_peer, _session) these methods use."""

import collections

from . import _strided, _vectors, core, errors
from ._mooncake_args import _check_int_entries, _code, _lists, _nonempty, _opcode_arg, _peer
from .errors import FerryError, fail


class AsyncBatches:
    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint=""):
        """A batch id (> 0) for get_batch_transfer_status / transfer_check_status, or 0
        when the submit failed (as Mooncake): errors.last_error_detail() and
        ferry.last_error() say why; raise_on_error=True raises instead.
        Zero-length requests are complete as they are."""
        peer, op = _peer(target_hostname), _opcode_arg(opcode)
        return self._run_peer(peer, lambda: self._submit_async(
            self._eng(), peer, op, buffers, peer_buffer_addresses, lengths), on_error=0)

    def _submit_async(self, eng, peer, op, buffers, peer_buffer_addresses, lengths):
        """batch_transfer_async's body: the batch id, or a FerryError raised.
        Every request carries Mooncake's deadline for the batch (_deadline_ms)."""
        vecs = _vectors.triple(buffers, peer_buffer_addresses, lengths)
        if vecs is not None:
            bid = self._async_vectors(eng, peer, op, vecs)
            if bid is not None:
                return bid
        all_bufs, all_remotes, all_lens = _lists(buffers, peer_buffer_addresses, lengths)
        bufs, remotes, lens = _nonempty(all_bufs, all_remotes, all_lens)
        total = _total(lens)
        batch = None
        if len(bufs):
            self._session(eng, peer)
            batch = eng.batch(len(bufs))
            try:
                batch.submit(peer, [(op, b, r, n) for b, r, n in zip(bufs, remotes, lens)],
                             timeout_ms=self._deadline_ms(eng, total))
            except errors.InvalidArgument:  # noqa: F821
                batch._shutdown()
                _check_int_entries(remotes, lens)
                raise
            except BaseException:
                batch._shutdown()
                raise
        with self._lock:
            bid = next(self._batch_ids)
            self._batches[bid] = _AsyncBatch(batch, len(all_bufs), total)
        return bid

    def _sync_scaled(self, eng, peer, op, buffers, peer_buffer_addresses, lengths, total):
        """A sync transfer of total bytes with Mooncake's deadline: its transfer
        timeout plus 1 ns per byte, where Ferry's sync calls have the fixed
        timeout_ms. Runs as an async batch whose requests carry that deadline,
        then waits for it; raises the first failure."""
        batch = self._take(self._submit_async(eng, peer, op, buffers, peer_buffer_addresses,
                                              lengths)).batch
        if batch is None:
            return
        try:
            batch.wait(self._wait_budget_ms(total))
        finally:
            batch._shutdown()

    def batch_transfer_async_strided(self, target_hostname, opcode, local_base, local_stride, remote_base,
                                     remote_stride, piece_len, n=None, local_indices=None,
                                     remote_indices=None):
        """Ferry extension: transfer_strided_sync's pieces submitted as one
        async batch: a batch id (> 0) for get_batch_transfer_status, or 0 when
        the submit failed (as batch_transfer_async)."""
        peer, op = _peer(target_hostname), _opcode_arg(opcode)
        if n is None:
            given = remote_indices if remote_indices is not None else local_indices
            n = len(given) if given is not None else 0

        def go():
            eng = self._eng()
            batch = None
            if n:
                self._session(eng, peer)
                batch = eng.batch(n)
                try:
                    _strided.submit(batch, core._peer_bytes(peer), op, local_base, local_stride, remote_base,
                                    remote_stride, piece_len, n, local_indices, remote_indices)
                except BaseException:
                    batch._shutdown()
                    raise
            with self._lock:
                bid = next(self._batch_ids)
                self._batches[bid] = _AsyncBatch(batch, n, n * piece_len)
            return bid
        return self._run_peer(peer, go, on_error=0)

    def _async_vectors(self, eng, peer, op, vecs):
        """batch_transfer_async's body for all-int arguments converted to C
        vectors (see _vectors): the batch id, or None when the request struct
        does not allow it (the per-entry path then runs)."""
        la, ra, ln = _vectors.nonzero(*vecs)
        total = _vectors.total(ln)
        batch = None
        if len(ln):
            self._session(eng, peer)
            batch = eng.batch(len(ln))
            try:
                if batch._submit_vectors(peer, op, la, ra, ln,
                                         timeout_ms=self._deadline_ms(eng, total)) is None:
                    batch._shutdown()
                    return None
            except BaseException:
                batch._shutdown()
                raise
        with self._lock:
            bid = next(self._batch_ids)
            self._batches[bid] = _AsyncBatch(batch, len(vecs[2]), total)
        return bid

    def _take(self, bid):
        """The batch of bid, consumed: removed from the live ones with no outcome
        remembered (the caller runs it to its end itself, as _sync_scaled)."""
        with self._lock:
            ent = self._batches.pop(bid, None)
        if ent is None:
            _unknown(bid, self._REMEMBERED_OUTCOMES)
        return ent

    # How many ended batches keep their outcome (see _consume): a thread that
    # asks about a batch another thread just consumed gets the same answer,
    # not NOT_FOUND. Ids are never reused, so an old outcome cannot alias.
    _REMEMBERED_OUTCOMES = 4096

    def _entry(self, bid):
        """The live or recently ended batch of bid (NOT_FOUND when neither)."""
        with self._lock:
            ent = self._batches.get(bid)
            if ent is None:
                ent = self._ended_batches().get(bid)
        if ent is None:
            _unknown(bid, self._REMEMBERED_OUTCOMES)
        return ent

    def _ended_batches(self):
        # Created lazily: the state lives in the engine, which predates it.
        ended = getattr(self, "_ended", None)
        if ended is None:
            ended = self._ended = collections.OrderedDict()
        return ended

    def _consume(self, bid, ent, code, detail):
        """Ends ent with its outcome (0 completed, else a Ferry code) unless
        another thread ended it first; True when this call did (it then frees
        the batch). Both happen under the lock, so every caller that ends up
        holding ent reads the one outcome that was recorded."""
        with self._lock:
            if ent.outcome is not None:
                return False
            ent.outcome = (code, detail)
            if self._batches.get(bid) is ent:
                del self._batches[bid]
            ended = self._ended_batches()
            ended[bid] = ent
            while len(ended) > self._REMEMBERED_OUTCOMES:
                ended.popitem(last=False)
        return True

    def _end_batch(self, bid, ent, code, detail):
        """_consume, then free the batch when this call consumed it; the
        outcome recorded (this call's or the thread's that was first)."""
        if self._consume(bid, ent, code, detail) and ent.batch is not None:
            ent.batch._shutdown()
        return ent.outcome

    # Mooncake's deadline for a transfer call: its transfer timeout plus 1 ns
    # per byte (1 GB/s), so a large call is not cut at the fixed timeout
    # (transfer_engine_py.cpp: transfer_timeout_nsec_ + total_length). Sync
    # calls of at least _SCALED_SYNC_FROM bytes run as a batch carrying that
    # deadline (below it the difference is under a second).
    _BYTES_PER_MS = 1000000
    _SCALED_SYNC_FROM = 1 << 30

    def _deadline_ms(self, eng, total):
        return min(int(eng._cfg.timeout_ms) + int(total) // self._BYTES_PER_MS, 2 ** 31 - 1 - 1000)

    def _wait_budget_ms(self, total):
        # The requests' deadline, plus a second for their reports.
        return self._deadline_ms(self._eng(), total) + 1000

    def get_batch_transfer_status(self, batch_ids):
        """Waits for the batches: 0 when all completed, else the first failure's code;
        every listed batch is consumed either way (Mooncake semantics). A batch
        another thread consumed a moment ago gives the outcome it had there."""
        def go():
            ents = []
            first_err = None
            for bid in list(batch_ids):
                try:
                    ents.append((bid, self._entry(bid)))
                except FerryError as exc:
                    first_err = first_err or exc
            for bid, ent in ents:
                code, detail = self._wait_outcome(bid, ent, cancel=first_err is not None)
                if code and first_err is None:
                    first_err = FerryError.from_code(code, detail)
            if first_err is not None:
                errors._record(first_err.code, first_err.detail)
                raise first_err
            return 0
        return self._run(go)

    def _wait_outcome(self, bid, ent, cancel):
        """get_batch_transfer_status for one batch: its outcome, once ended.
        cancel: an earlier batch of the call failed, so this one is cancelled
        (like Mooncake freeing it), its outcome read after the cancel."""
        if ent.outcome is not None:
            return ent.outcome
        if ent.batch is None:
            return self._end_batch(bid, ent, 0, None)
        try:
            if cancel:
                ent.batch._cancel_quiet()
                out = self._status_outcome(bid, ent)
                code, detail = out if out is not None else (
                    _code("CANCELLED"), "CANCELLED (%d): batch %d cancelled: an earlier batch of the "
                    "same get_batch_transfer_status call failed" % (_code("CANCELLED"), bid))
            else:
                ent.batch.wait(self._wait_budget_ms(ent.total))
                code, detail = 0, None
        except FerryError as exc:
            # Also what a wait reads when another thread consumed and freed
            # the batch meanwhile: _end_batch then gives that thread's outcome.
            code, detail = exc.code, exc.detail
        return self._end_batch(bid, ent, code, detail)

    def transfer_check_status(self, batch_id):
        """Non-blocking, Mooncake's values exactly: 1 completed, 0 still running,
        -1 failed, -2 timed out (errors.last_error_code() / last_error_detail()
        give the Ferry code and the story). Callers poll until the value is 1,
        -1 or -2 (Mooncake's documented loop, SGLang's async worker): any other
        value would keep them polling forever. A batch that ended is consumed;
        asking again (from any thread) gives the same value while it is among
        the last _REMEMBERED_OUTCOMES ended, except that a timeout is -2 once
        and -1 (failed) after: Mooncake keeps a timed-out batch and it ends
        failed later, so some callers poll on past -2, and would forever here
        (Ferry's timeout is final). An id unknown, forgotten, or the 0 of a
        failed submit is -1 (failed), so such a loop ends."""
        rc = self._run(self._check_status, batch_id)
        if rc in (0, 1) or self.raise_on_error:
            return rc
        if rc != _code("TIMEOUT"):
            return -1
        return -2 if self._first_timeout_report(batch_id) else -1

    def _first_timeout_report(self, batch_id):
        """True the first time a timed-out batch is reported (then -2), False after (-1)."""
        with self._lock:
            ent = self._batches.get(batch_id) or self._ended_batches().get(batch_id)
            if ent is None:
                return True
            first, ent.timeout_reported = not ent.timeout_reported, True
            return first

    def _check_status(self, batch_id):
        ent = self._entry(batch_id)  # raises NOT_FOUND
        if ent.outcome is None:
            if ent.batch is None:
                self._end_batch(batch_id, ent, 0, None)
            else:
                try:
                    out = self._status_outcome(batch_id, ent)
                except FerryError:
                    if ent.outcome is None:
                        raise
                    out = None  # consumed and freed by another thread: its outcome
                if out is not None:
                    self._end_batch(batch_id, ent, *out)
        if ent.outcome is None:
            return 0
        code, detail = ent.outcome
        if code == 0:
            return 1
        fail(code, detail)

    def _status_outcome(self, batch_id, ent):
        """The outcome of ent's batch from its statuses: None while a request
        runs, (0, None) when all completed, else the code and story of the
        first request that ended CANCEL_UNCONFIRMED (its pages are not safe to
        reuse: never hidden behind another request's code) or else of the
        first failure. A failed batch is reported once every request ended,
        as ferry_batch_wait does: a caller that frees pages on failure must
        not free those of a request still running."""
        sts = ent.batch.statuses()
        if not all(s.done for s in sts):
            return None
        unconfirmed = _code("CANCEL_UNCONFIRMED")
        bad = next((s for s in sts if not s.ok and s.code == unconfirmed), None)
        if bad is None:
            bad = next((s for s in sts if not s.ok), None)
        if bad is None:
            return 0, None
        code = bad.code or (_code("TIMEOUT") if bad.state == core.STATUS_TIMEOUT else
                            _code("CANCELLED") if bad.state == core.STATUS_CANCELLED else
                            _code("INTERNAL"))
        return code, "%s (%d): request of batch %d ended %s" % (
            errors.name(code), code, batch_id, bad.state_name)

    def get_batch_status(self, batch_id):
        """Ferry extension: per-request RequestStatus list, without consuming the batch."""
        def go():
            with self._lock:
                ent = self._batches.get(batch_id)
            if ent is None:
                _unknown(batch_id, self._REMEMBERED_OUTCOMES)
            return ent.batch.statuses() if ent.batch is not None else []
        try:
            return go()
        except FerryError:
            if self.raise_on_error:
                raise
            return None


class _AsyncBatch:
    """A batch id's state: its core.Batch (None when it had no request), request
    count and bytes, and its outcome once ended ((0, None) or (code, detail))."""
    __slots__ = ("batch", "count", "total", "outcome", "timeout_reported")

    def __init__(self, batch, count, total):
        self.batch, self.count, self.total, self.outcome = batch, count, total, None
        self.timeout_reported = False


def _unknown(bid, remembered):
    fail(_code("NOT_FOUND"), "NOT_FOUND (-411): no batch %r (never returned by "
         "batch_transfer_async_*, or ended longer ago than the last %d batches)"
         % (bid, remembered))


def _total(lens):
    """The sum of a batch's lengths (0 when they are not all numbers: the
    submit then refuses them with a clear error)."""
    try:
        return int(sum(lens))
    except (TypeError, ValueError):
        return 0
