"""TransferEngine's async batches (Mooncake's batch_transfer_async,
get_batch_transfer_status, transfer_check_status) and the scaled deadline
its large calls carry: a mixin of ferry.engine.TransferEngine, which keeps
the state (self._lock, self._batches, self._batch_ids) and the helpers
(_eng, _run, _run_peer, _session) these methods use."""

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
            self._batches[bid] = (batch, len(all_bufs), total)
        return bid

    def _sync_scaled(self, eng, peer, op, buffers, peer_buffer_addresses, lengths, total):
        """A sync transfer of total bytes with Mooncake's deadline: its transfer
        timeout plus 1 ns per byte, where Ferry's sync calls have the fixed
        timeout_ms. Runs as an async batch whose requests carry that deadline,
        then waits for it; raises the first failure."""
        batch = self._take(self._submit_async(eng, peer, op, buffers, peer_buffer_addresses,
                                              lengths))[0]
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
                self._batches[bid] = (batch, n, n * piece_len)
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
            self._batches[bid] = (batch, len(vecs[2]), total)
        return bid

    def _take(self, bid):
        with self._lock:
            ent = self._batches.pop(bid, None)
        if ent is None:
            fail(_code("NOT_FOUND"), "NOT_FOUND (-411): no batch %r (already reaped, or never "
                 "returned by batch_transfer_async_*)" % (bid,))
        return ent

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
        every listed batch is consumed either way (Mooncake semantics)."""
        def go():
            ids = list(batch_ids)
            ents = []
            first_err = None
            for bid in ids:
                try:
                    ents.append(self._take(bid))
                except FerryError as exc:
                    first_err = first_err or exc
            for batch, _, total in ents:
                if batch is None:
                    continue
                if first_err is not None:
                    batch._shutdown()  # cancel what still runs, like Mooncake freeing it
                    continue
                try:
                    batch.wait(self._wait_budget_ms(total))
                except FerryError as exc:
                    first_err = exc
                batch._shutdown()
            if first_err is not None:
                errors._record(first_err.code, first_err.detail)
                raise first_err
            return 0
        return self._run(go)

    def transfer_check_status(self, batch_id):
        """Non-blocking, Mooncake's values exactly: 1 completed, 0 still running,
        -1 failed, -2 timed out (errors.last_error_code() / last_error_detail()
        give the Ferry code and the story). Callers poll until the value is 1,
        -1 or -2 (Mooncake's documented loop, SGLang's async worker): any other
        value would keep them polling forever. A batch that ended is consumed;
        an id that is unknown, already consumed, or the 0 of a failed submit is
        -1 (failed), so such a loop ends."""
        rc = self._run(self._check_status, batch_id)
        if rc in (0, 1) or self.raise_on_error:
            return rc
        return -2 if rc == _code("TIMEOUT") else -1

    def _check_status(self, batch_id):
        with self._lock:
            ent = self._batches.get(batch_id)
        if ent is None:
            self._take(batch_id)  # raises NOT_FOUND
        batch = ent[0]
        if batch is None:
            self._take(batch_id)
            return 1
        sts = batch.statuses()
        bad = next((s for s in sts if s.done and not s.ok), None)
        if bad is None and not all(s.ok for s in sts):
            return 0
        self._take(batch_id)
        batch._shutdown()
        if bad is None:
            return 1
        code = bad.code or (_code("TIMEOUT") if bad.state == core.STATUS_TIMEOUT else
                            _code("CANCELLED") if bad.state == core.STATUS_CANCELLED else
                            _code("INTERNAL"))
        fail(code, "%s (%d): request of batch %d ended %s" % (
            errors.name(code), code, batch_id, bad.state_name))

    def get_batch_status(self, batch_id):
        """Ferry extension: per-request RequestStatus list, without consuming the batch."""
        def go():
            with self._lock:
                ent = self._batches.get(batch_id)
            if ent is None:
                self._take(batch_id)
            return ent[0].statuses() if ent[0] is not None else []
        try:
            return go()
        except FerryError:
            if self.raise_on_error:
                raise
            return None


def _total(lens):
    """The sum of a batch's lengths (0 when they are not all numbers: the
    submit then refuses them with a clear error)."""
    try:
        return int(sum(lens))
    except (TypeError, ValueError):
        return 0
