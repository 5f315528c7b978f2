# SPDX-License-Identifier: Apache-2.0
"""The strict, pythonic API: ferry.Engine raises FerryError subclasses.

    with ferry.Engine(host="127.0.0.1") as eng:
        eng.register(kv)                       # remote-accessible by default
        eng.write(peer, kv, remote_addr, 4096)
        with eng.batch(16) as b:
            b.submit(peer, [(ferry.WRITE, buf, raddr, n), ...])
            b.wait()

Buffers are ints (addresses, e.g. tensor.data_ptr()) or objects: bytearray,
mmap, memoryview, ctypes arrays, numpy arrays, torch tensors (see _buffers).
A registered object is pinned (kept alive, not resizable) until deregistered.

Engine is here; Batch is in _batch, the constants, records and shared argument
checks in _types (all importable from ferry.core as before).
"""

import ctypes
import itertools
import operator
import threading
import weakref

from . import _buffers, _lib, _vectors, errors
from ._batch import Batch
# The names ferry.core has always offered; they live in _types now.
from ._types import (CONFIG_FIELDS, MEM_LOCAL, MEM_REMOTE, MEM_REMOTE_READ,  # noqa: F401
                     MEM_REMOTE_WRITE, READ, STATUS_CANCELLED, STATUS_COMPLETED, STATUS_FAILED,
                     STATUS_NAMES, STATUS_PENDING, STATUS_TIMEOUT, STATUS_WAITING, WRITE,
                     Notification, PeerInfo, PeerMetrics, RegionInfo, RequestStatus, Segment,
                     _STRING_FIELDS, _call, _decode_notify, _encode_notify, _inval, _opcode,
                     _peer_bytes, device_memory_supported, version)
from .errors import check, fail

__all__ = [
    "Engine", "Batch", "Segment", "PeerInfo", "PeerMetrics", "RequestStatus", "Notification",
    "READ", "WRITE", "MEM_LOCAL", "MEM_REMOTE_READ", "MEM_REMOTE_WRITE", "MEM_REMOTE",
    "STATUS_WAITING", "STATUS_PENDING", "STATUS_COMPLETED", "STATUS_FAILED",
    "STATUS_CANCELLED", "STATUS_TIMEOUT", "STATUS_NAMES", "CONFIG_FIELDS", "version",
]

# Every Engine not yet garbage-collected (ferry.engine's free_host_buffer asks
# them whether memory about to be unmapped is still registered).
_LIVE = weakref.WeakSet()


def registered_anywhere(addr, length):
    """(engine name, region start, region length) of a live Engine's region
    overlapping [addr, addr+length), or None."""
    for eng in list(_LIVE):
        hit = eng.registered_overlap(addr, length)
        if hit is not None:
            return (eng.name,) + hit
    return None


class _Closed:
    pass


class Engine:
    """One Ferry engine (listening on host:port). Methods raise FerryError.

    Engine(host=None, port=None, *, env=True, **config): config keys are the
    fields of ferry_config_t (transport, timeout_ms, secret, ...). With env
    (default) the FERRY_* environment variables apply first and the keyword
    arguments override them.
    """

    def __init__(self, host=None, port=None, *, env=True, **config):
        self._e = None
        self._lock = threading.Condition()
        self._active = 0
        self._closed = False
        self._regions = {}   # addr -> (len, pin)
        self._batches = weakref.WeakSet()
        self._keep = []      # strings the config points at
        cfg = _lib.new_struct(_lib.Config)
        _call("ferry_config_init", ctypes.byref(cfg))
        if env:
            check(_call("ferry_config_from_env", ctypes.byref(cfg)))
        if host is not None:
            config["host"] = host
        if port is not None:
            config["port"] = port
        for k, v in config.items():
            if k not in CONFIG_FIELDS:
                raise TypeError("Engine() got an unknown config field %r (fields: %s)"
                                % (k, ", ".join(CONFIG_FIELDS)))
            if v is None:
                continue
            if k in _STRING_FIELDS:
                b = v.encode() if isinstance(v, str) else bytes(v)
                self._keep.append(b)
                setattr(cfg, k, b)
            else:
                if isinstance(v, bool):
                    v = int(v)
                setattr(cfg, k, v)
        self._cfg = cfg
        out = ctypes.c_void_p()
        check(_call("ferry_engine_create", ctypes.byref(cfg), ctypes.byref(out)))
        self._e = out.value
        self._name = _lib.fn("ferry_engine_name")(self._e).decode()
        self._port = int(_lib.fn("ferry_engine_port")(self._e))
        self._epoch = int(_lib.fn("ferry_engine_epoch")(self._e))
        _LIVE.add(self)

    # ---------------------------------------------------------- lifetime
    def _enter(self):
        with self._lock:
            if self._closed or self._e is None:
                fail(errors.CODES["CONTEXT"],
                     "CONTEXT (-202): the engine is closed")
            self._active += 1
            return self._e

    def _leave(self):
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._lock.notify_all()

    def close(self):
        """Cancels and frees open batches, waits for calls in flight (they end by
        their deadlines), then destroys the engine. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        batches = list(self._batches)
        for b in batches:
            b._cancel_quiet()  # ends waits on them
        with self._lock:
            while self._active:
                self._lock.wait()
        for b in batches:
            b._shutdown()
        with self._lock:
            e, self._e = self._e, None
        if e is not None:
            _lib.fn("ferry_engine_destroy")(e)
        for _, pin in self._regions.values():
            if pin is not None:
                pin.release()
        self._regions.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_e", None) is not None:
                self.close()
        except Exception:
            pass

    @property
    def closed(self):
        return self._closed

    # ------------------------------------------------------------- identity
    @property
    def name(self):
        """'host:port', the name peers use for this engine (Mooncake's session id)."""
        return self._name

    @property
    def port(self):
        return self._port

    @property
    def epoch(self):
        return self._epoch

    @property
    def handle(self):
        """The ferry_engine_t* as an int (0 once closed)."""
        return self._e or 0

    @property
    def config(self):
        """The configuration the engine was created with, as a dict."""
        out = {}
        for f in CONFIG_FIELDS:
            v = getattr(self._cfg, f)
            out[f] = v.decode() if isinstance(v, bytes) else v
        return out

    # --------------------------------------------------------- registration
    def register(self, buf, length=None, flags=MEM_REMOTE):
        """Registers buf ([addr, addr+length)); returns its address."""
        addr, n, pin = _buffers.resolve(buf, length, writable=bool(flags & MEM_REMOTE_WRITE)
                                        and not _buffers._is_int(buf))
        e = self._enter()
        try:
            check(_lib.fn("ferry_register")(e, addr, n, flags))
        except BaseException:
            if pin is not None:
                pin.release()
            raise
        finally:
            self._leave()
        with self._lock:
            self._regions[addr] = (n, pin)
        return addr

    def deregister(self, buf):
        """Deregisters the region starting at buf's address."""
        addr = _buffers.address(buf)
        e = self._enter()
        try:
            check(_lib.fn("ferry_deregister")(e, addr))
        finally:
            self._leave()
        self._drop_region(addr)

    def _drop_region(self, addr):
        with self._lock:
            ent = self._regions.pop(addr, None)
        if ent is not None and ent[1] is not None:
            ent[1].release()

    def _drop_regions(self, addrs):
        with self._lock:
            ents = [self._regions.pop(a, None) for a in addrs]
        for ent in ents:
            if ent is not None and ent[1] is not None:
                ent[1].release()

    def register_batch(self, bufs, lengths=None, flags=MEM_REMOTE):
        """All or nothing; returns the addresses."""
        vecs = _vectors.pair(bufs, lengths) if lengths is not None else None
        if vecs is not None:  # all ints: C vectors, nothing to resolve or pin
            return self._register_vectors(*vecs, flags)
        bufs = list(bufs)
        if lengths is None:
            lengths = [None] * len(bufs)
        lengths = list(lengths)
        if len(lengths) != len(bufs):
            _inval("%d buffers but %d lengths" % (len(bufs), len(lengths)))
        resolved = []
        try:
            for b, n in zip(bufs, lengths):
                resolved.append(_buffers.resolve(
                    b, n, writable=bool(flags & MEM_REMOTE_WRITE) and not _buffers._is_int(b)))
        except BaseException:
            for _, _, p in resolved:
                if p is not None:
                    p.release()
            raise
        k = len(resolved)
        addrs = (ctypes.c_void_p * max(k, 1))(*[r[0] for r in resolved])
        lens = (ctypes.c_size_t * max(k, 1))(*[r[1] for r in resolved])
        e = self._enter()
        try:
            check(_lib.fn("ferry_register_batch")(e, addrs, lens, k, flags))
        except BaseException:
            for _, _, p in resolved:
                if p is not None:
                    p.release()
            raise
        finally:
            self._leave()
        with self._lock:
            for a, n, p in resolved:
                self._regions[a] = (n, p)
        return [r[0] for r in resolved]

    def _register_vectors(self, addrs, lens, flags):
        k = len(addrs)
        e = self._enter()
        try:
            check(_lib.fn("ferry_register_batch")(
                e, _vectors.pointer(addrs, ctypes.c_void_p) if k else (ctypes.c_void_p * 1)(),
                _vectors.pointer(lens, ctypes.c_size_t) if k else (ctypes.c_size_t * 1)(), k,
                flags))
        finally:
            self._leave()
        out = addrs.tolist()
        with self._lock:
            self._regions.update(zip(out, zip(lens.tolist(), itertools.repeat(None))))
        return out

    def deregister_batch(self, bufs):
        """Deregisters each; raises the first failure after processing all."""
        vec = _vectors.u64(bufs, "buffer_addresses")
        addrs_l = vec.tolist() if vec is not None else [_buffers.address(b) for b in bufs]
        k = len(addrs_l)
        addrs = (_vectors.pointer(vec, ctypes.c_void_p) if vec is not None and k
                 else (ctypes.c_void_p * max(k, 1))(*addrs_l))
        e = self._enter()
        try:
            rc = _lib.fn("ferry_deregister_batch")(e, addrs, k)
            detail = errors._c_detail() if rc < 0 else None
        finally:
            self._leave()
        # Regions whose deregistration failed were not registered (or are
        # still); dropping our pin only for those gone is what matters.
        if rc >= 0:
            self._drop_regions(addrs_l)
        if rc < 0:
            self._resync_regions(addrs_l)
            check(rc, detail or None)

    def _resync_regions(self, addrs_l):
        # After a partial failure we cannot tell which deregistrations took
        # effect; try each again: NOT_REGISTERED means it is gone.
        e = self._enter()
        try:
            for a in addrs_l:
                rc = _lib.fn("ferry_deregister")(e, a)
                if rc >= 0 or rc == errors.CODES.get("ADDRESS_NOT_REGISTERED"):
                    self._drop_region(a)
        finally:
            self._leave()

    @property
    def region_count(self):
        e = self._enter()
        try:
            return int(_lib.fn("ferry_region_count")(e))
        finally:
            self._leave()

    def region_info(self, addr, length=0):
        """The region registered with this engine that holds [addr, addr+length):
        RegionInfo(addr, len, flags, device, kind); device is -1 for host memory,
        else the device ordinal (kind "cuda:0", ...). Raises AddressNotRegistered /
        OutOfBounds. Touches no memory."""
        a = _buffers.address(addr)
        n = operator.index(length)
        if n < 0:
            _inval("negative length %d" % n)
        info = _lib.new_struct(_lib.RegionInfo)
        e = self._enter()
        try:
            check(_lib.fn("ferry_region_query")(e, a, n, ctypes.byref(info)))
        finally:
            self._leave()
        return RegionInfo(info.addr, info.len, info.flags, info.device, info.kind.decode())

    def write_registered(self, addr, data):
        """Copies data (bytes-like) into memory registered with this engine at addr,
        host or device; the registration is checked first (nothing touched else)."""
        a = _buffers.address(addr)
        src = bytes(data)
        e = self._enter()
        try:
            check(_lib.fn("ferry_region_write")(e, a, src, len(src)))
        finally:
            self._leave()

    def read_registered(self, addr, length):
        """length bytes of memory registered with this engine at addr (host or device)."""
        a = _buffers.address(addr)
        n = operator.index(length)
        if n < 0:
            _inval("negative length %d" % n)
        out = ctypes.create_string_buffer(n)
        e = self._enter()
        try:
            check(_lib.fn("ferry_region_read")(e, out, a, n))
        finally:
            self._leave()
        return out.raw[:n]

    def registered_overlap(self, addr, length):
        """(start, length) of a region registered through this object that
        overlaps [addr, addr+length), or None."""
        with self._lock:
            if self._closed:
                return None
            for a, (n, _) in self._regions.items():
                if a < addr + length and addr < a + n:
                    return a, n
        return None

    def is_registered(self, addr):
        """True when a region registered through this object starts at addr."""
        with self._lock:
            return _buffers.address(addr) in self._regions

    # ------------------------------------------------------------- sessions
    def open_session(self, peer):
        e = self._enter()
        try:
            check(_lib.fn("ferry_session_open")(e, _peer_bytes(peer)))
        finally:
            self._leave()

    def pin(self, peer):
        """The pinned name of peer, "host:port#<epoch hex>": the peer's epoch as
        the session knows it (the session is opened if needed). Every method
        that takes a peer takes a pinned name too; a call pinned to an epoch
        that is not the peer's current one raises PeerRestarted before any
        byte leaves, every time, so addresses learned under the pin never
        reach a restarted process. Pin before you fetch the addresses."""
        out = ctypes.create_string_buffer(320)
        e = self._enter()
        try:
            check(_lib.fn("ferry_session_pin")(e, _peer_bytes(peer), out, len(out)))
        finally:
            self._leave()
        return out.value.decode()

    def close_session(self, peer):
        e = self._enter()
        try:
            check(_lib.fn("ferry_session_close")(e, _peer_bytes(peer)))
        finally:
            self._leave()

    def session_info(self, peer):
        info = _lib.new_struct(_lib.PeerInfo)
        e = self._enter()
        try:
            check(_lib.fn("ferry_session_info")(e, _peer_bytes(peer), ctypes.byref(info)))
        finally:
            self._leave()
        return PeerInfo(info.name.decode(errors="replace"), info.protocol_version, info.engine_id,
                        info.epoch, info.segment_version, info.segment_count,
                        info.transport.decode(errors="replace"),
                        info.transport_reason.decode(errors="replace"), info.pid,
                        bool(info.same_host))

    def segments(self, peer, max_count=None):
        """The peer's remote-accessible segments, ascending by address (refreshed)."""
        p = _peer_bytes(peer)
        e = self._enter()
        try:
            cap = 64 if max_count is None else int(max_count)
            while True:
                arr = (_lib.Segment * max(cap, 1))()
                n = check(int(_lib.fn("ferry_session_segments")(e, p, arr, cap)))
                if n <= cap or max_count is not None:
                    return [Segment(s.addr, s.len, s.flags, s.generation) for s in arr[:min(n, cap)]]
                cap = n
        finally:
            self._leave()

    def ping(self, peer):
        """Round trip of a small control frame to the peer, in microseconds."""
        rtt = ctypes.c_uint64(0)
        e = self._enter()
        try:
            check(_call("ferry_session_ping", e, _peer_bytes(peer), ctypes.byref(rtt)))
        finally:
            self._leave()
        return int(rtt.value)

    # -------------------------------------------------------------- metrics
    @property
    def metrics_port(self):
        """Port of the Prometheus endpoint (GET /metrics), 0 when off."""
        e = self._enter()
        try:
            return int(_call("ferry_metrics_port", e))
        finally:
            self._leave()

    def metrics(self):
        """Per-peer counters: a list of PeerMetrics."""
        e = self._enter()
        try:
            cap = 16
            while True:
                arr = (_lib.PeerMetrics * cap)()
                n = check(int(_call("ferry_metrics_peers", e, arr, cap)))
                if n <= cap:
                    return [PeerMetrics.from_c(m) for m in arr[:n]]
                cap = n
        finally:
            self._leave()

    def transport_metrics(self, transport):
        """The sum over the peers that used transport ("tcp", "shm")."""
        m = _lib.PeerMetrics()
        e = self._enter()
        try:
            check(_call("ferry_metrics_transport", e, transport.encode(), ctypes.byref(m)))
        finally:
            self._leave()
        return PeerMetrics.from_c(m)

    def metrics_prometheus(self):
        """Every metric in Prometheus text format."""
        e = self._enter()
        try:
            cap = 1 << 16
            while True:
                buf = ctypes.create_string_buffer(cap)
                n = check(int(_call("ferry_metrics_prometheus", e, buf, cap)))
                if n < cap:
                    return buf.value.decode("utf-8", "replace")
                cap = n + 1
        finally:
            self._leave()

    # ------------------------------------------------------------ transfers
    def transfer(self, peer, opcode, local, remote, length=None):
        """Moves length bytes between local and the peer's address remote."""
        op = _opcode(opcode)
        p = _peer_bytes(peer)
        addr, n, pin = _buffers.resolve(local, length, writable=(op == READ) and not
                                        _buffers._is_int(local), what="local buffer")
        r = _buffers.remote_address(remote)
        e = self._enter()
        try:
            check(_lib.fn("ferry_transfer_sync")(e, p, op, addr, r, n))
        finally:
            self._leave()
            if pin is not None:
                pin.release()

    def write(self, peer, local, remote, length=None):
        self.transfer(peer, WRITE, local, remote, length)

    def read(self, peer, local, remote, length=None):
        self.transfer(peer, READ, local, remote, length)

    def transfer_batch(self, peer, opcode, locals_, remotes, lengths=None):
        """n requests of one opcode: all complete, or the first failure raised."""
        op = _opcode(opcode)
        p = _peer_bytes(peer)
        vecs = _vectors.triple(locals_, remotes, lengths) if lengths is not None else None
        if vecs is not None:  # all ints: C vectors, no per-entry Python work
            self._transfer_vectors(p, op, *vecs)
            return
        locals_ = list(locals_)
        remotes = list(remotes)
        lengths = [None] * len(locals_) if lengths is None else list(lengths)
        if not (len(locals_) == len(remotes) == len(lengths)):
            _inval("buffers, peer addresses and lengths differ in count (%d, %d, %d)"
                   % (len(locals_), len(remotes), len(lengths)))
        pins = []
        try:
            la, ra, ln = [], [], []
            for i, (b, r, n) in enumerate(zip(locals_, remotes, lengths)):
                a, k, pin = _buffers.resolve(b, n, writable=(op == READ) and not _buffers._is_int(b),
                                             what="local buffer %d" % i)
                pins.append(pin)
                la.append(a)
                ra.append(_buffers.remote_address(r, "peer address %d" % i))
                ln.append(k)
            k = len(la)
            if k == 0:
                return
            e = self._enter()
            try:
                check(_lib.fn("ferry_batch_transfer_sync")(
                    e, p, op, (ctypes.c_void_p * k)(*la), (ctypes.c_uint64 * k)(*ra),
                    (ctypes.c_size_t * k)(*ln), k))
            finally:
                self._leave()
        finally:
            for pin in pins:
                if pin is not None:
                    pin.release()

    def _transfer_vectors(self, p, op, la, ra, ln):
        """ferry_batch_transfer_sync over vectors from _vectors (raw addresses)."""
        k = len(ln)
        if k == 0:
            return
        e = self._enter()
        try:
            check(_lib.fn("ferry_batch_transfer_sync")(
                e, p, op, _vectors.pointer(la, ctypes.c_void_p),
                _vectors.pointer(ra, ctypes.c_uint64), _vectors.pointer(ln, ctypes.c_size_t), k))
        finally:
            self._leave()

    def write_batch(self, peer, locals_, remotes, lengths=None):
        self.transfer_batch(peer, WRITE, locals_, remotes, lengths)

    def read_batch(self, peer, locals_, remotes, lengths=None):
        self.transfer_batch(peer, READ, locals_, remotes, lengths)

    def batch(self, capacity):
        """A new async Batch of the given capacity (use as a context manager)."""
        return Batch(self, capacity)

    # -------------------------------------------------------- notifications
    def notify(self, peer, msg, name=None):
        """Sends msg (bytes or str, <= 64 KiB) to the peer's notification queue,
        delivered after every write this thread issued to that peer before it.
        name: Mooncake's TransferNotify name (carried in the message)."""
        p = _peer_bytes(peer)
        data = _encode_notify(msg, name)
        e = self._enter()
        try:
            buf = ctypes.create_string_buffer(data, len(data)) if data else None
            check(_lib.fn("ferry_notify")(e, p, buf, len(data)))
        finally:
            self._leave()

    def notifications(self, max_count=None):
        """Moves queued notifications out, all of them (max_count None) or up to
        max_count; a list of Notification."""
        out = []
        e = self._enter()
        try:
            while max_count is None or len(out) < max_count:
                want = 256 if max_count is None else min(256, max_count - len(out))
                arr = (_lib.Notification * want)()
                n = check(int(_lib.fn("ferry_get_notifications")(e, arr, want)))
                try:
                    for i in range(n):
                        raw = ctypes.string_at(arr[i].msg, arr[i].len) if arr[i].len else b""
                        out.append(_decode_notify(arr[i].peer.decode(errors="replace"), raw))
                finally:
                    if n:
                        _lib.fn("ferry_notifications_free")(arr, n)
                if n < want:
                    break
        finally:
            self._leave()
        return out

    def __repr__(self):
        return "<ferry.Engine %s%s>" % (self._name if self._e else "", " closed" if self._closed else "")
