# SPDX-License-Identifier: Apache-2.0
"""ferry.Batch: an async batch of one Engine (see ferry.core)."""

import ctypes
import threading

from . import _buffers, _lib, _vectors, errors
from ._types import READ, RequestStatus, _inval, _opcode, _peer_bytes
from .errors import check, fail


class Batch:
    """An async batch: submit requests, poll status, wait, cancel. Frees on exit.

    Requests are (opcode, local, remote, length) tuples (length may be None
    for a sized local object), numbered in submission order. Methods may be
    called from several threads; the batch is freed only once no call on it
    is running.
    """

    def __init__(self, engine, capacity):
        self.engine = engine
        self.capacity = int(capacity)
        if self.capacity <= 0:
            _inval("batch capacity must be positive, not %d" % self.capacity)
        self._pins = []
        self._count = 0
        self._freed = False
        self._closing = False
        self._users = 0
        self._cond = threading.Condition()
        self._submit_lock = threading.Lock()
        out = ctypes.c_void_p()
        e = engine._enter()
        try:
            check(_lib.fn("ferry_batch_alloc")(e, self.capacity, ctypes.byref(out)))
        finally:
            engine._leave()
        self._b = out.value
        engine._batches.add(self)

    # A call on the batch: engine alive, batch not freed or being freed.
    def _begin(self, engine_check=True):
        if engine_check:
            self.engine._enter()
        with self._cond:
            if self._freed or self._closing or self._b is None:
                if engine_check:
                    self.engine._leave()
                fail(errors.CODES["NOT_FOUND"], "NOT_FOUND (-411): the batch was freed")
            self._users += 1
            return self._b

    def _end(self, engine_check=True):
        with self._cond:
            self._users -= 1
            if self._users == 0:
                self._cond.notify_all()
        if engine_check:
            self.engine._leave()

    def __len__(self):
        return self._count

    @property
    def freed(self):
        return self._freed

    def submit(self, peer, requests, timeout_ms=0):
        """Submits requests to peer; returns the index of the first one."""
        p = _peer_bytes(peer)
        reqs = list(requests)
        pins = []
        arr = (_lib.Request * max(len(reqs), 1))()
        try:
            for i, rq in enumerate(reqs):
                if len(rq) == 3:
                    op, local, remote = rq
                    n = None
                else:
                    op, local, remote, n = rq
                op = _opcode(op)
                a, k, pin = _buffers.resolve(local, n, writable=(op == READ) and not
                                             _buffers._is_int(local), what="local buffer %d" % i)
                pins.append(pin)
                arr[i].opcode = op
                arr[i].local = a
                arr[i].remote = _buffers.remote_address(remote, "peer address %d" % i)
                arr[i].len = k
        except BaseException:
            for pin in pins:
                if pin is not None:
                    pin.release()
            raise
        return self._submit_array(p, arr, len(reqs), pins, timeout_ms)

    def _submit_vectors(self, peer, opcode, la, ra, ln, timeout_ms=0):
        """submit() for n requests of one opcode given as vectors from
        _vectors (raw addresses: nothing to pin); None when the request
        struct's layout does not allow it (use submit)."""
        arr = _vectors.requests(_lib.Request, _opcode(opcode), la, ra, ln)
        if arr is None:
            return None
        return self._submit_array(_peer_bytes(peer), arr, len(ln), [], timeout_ms)

    def _submit_array(self, p, arr, n, pins, timeout_ms):
        b = self._begin()
        try:
            with self._submit_lock:
                first = int(_lib.fn("ferry_batch_submit")(b, p, arr, n, int(timeout_ms)))
                if first >= 0:
                    self._pins.extend(pins)
                    self._count = max(self._count, first + n)
        finally:
            self._end()
        if first < 0:
            for pin in pins:
                if pin is not None:
                    pin.release()
            check(first)
        return first

    def status(self, idx):
        st = _lib.Status()
        b = self._begin()
        try:
            check(_lib.fn("ferry_batch_status")(b, int(idx), ctypes.byref(st)))
        finally:
            self._end()
        return RequestStatus(st.state, st.code, st.bytes)

    def statuses(self):
        return [self.status(i) for i in range(self._count)]

    def done(self):
        """True when every submitted request has ended (in any state)."""
        return all(s.done for s in self.statuses())

    def wait(self, timeout_ms=-1):
        """Waits until every request ended; raises the first failure (or TIMEOUT)."""
        b = self._begin()
        try:
            check(_lib.fn("ferry_batch_wait")(b, int(timeout_ms)))
        finally:
            self._end()

    def cancel(self):
        """Cancels every unfinished request; when it returns, none of their
        bytes can still land (CancelError CANCEL_UNCONFIRMED if the target
        could not confirm: do not reuse its pages)."""
        b = self._begin()
        try:
            check(_lib.fn("ferry_batch_cancel")(b))
        finally:
            self._end()

    def cancel_request(self, idx):
        """Cancels request idx alone, with the same guarantee; the others go on."""
        b = self._begin()
        try:
            check(_lib.fn("ferry_batch_cancel_request")(b, int(idx)))
        finally:
            self._end()

    def free(self):
        """Frees the batch (BatchBusy while requests are in flight)."""
        if self._freed:
            return
        b = self._begin()
        try:
            with self._cond:
                # Only this call may still be using it.
                while self._users > 1:
                    self._cond.wait()
                rc = _lib.fn("ferry_batch_free")(b)
                if rc >= 0:
                    self._freed = True
            check(rc)
        finally:
            self._end()
        self._after_free()

    def _after_free(self):
        self._freed = True
        self._b = None
        for pin in self._pins:
            if pin is not None:
                pin.release()
        self._pins = []
        self.engine._batches.discard(self)

    def _cancel_quiet(self):
        with self._cond:
            if self._freed or self._b is None:
                return
            b = self._b
            self._users += 1
        try:
            _lib.fn("ferry_batch_cancel")(b)
        finally:
            self._end(engine_check=False)

    def _shutdown(self):
        """Cancel whatever runs, wait for other calls on the batch to return,
        free (best effort: a batch that stays busy is leaked, never freed under
        running requests). Used by Engine.close, reaping and __del__."""
        with self._cond:
            if self._freed or self._closing or self._b is None:
                return
            self._closing = True
            b = self._b
        try:
            _lib.fn("ferry_batch_cancel")(b)
            budget = max(int(self.engine._cfg.timeout_ms), 1000) * 2
            with self._cond:
                self._cond.wait_for(lambda: self._users == 0, budget / 1000.0)
                if self._users:
                    return
            free = _lib.fn("ferry_batch_free")
            if free(b) < 0:
                _lib.fn("ferry_batch_wait")(b, budget)
                if free(b) < 0:
                    return
            self._after_free()
        finally:
            with self._cond:
                self._closing = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._freed or self.engine.closed:
            return
        try:
            self.free()
        except errors.BatchBusy:  # noqa: F821 - defined in errors
            self._shutdown()

    def __del__(self):
        try:
            if not self._freed and self._b is not None and not self.engine.closed:
                self._shutdown()
        except Exception:
            pass
