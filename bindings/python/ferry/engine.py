# SPDX-License-Identifier: Apache-2.0
"""Mooncake-compatible API: ferry.engine mirrors mooncake.engine.

    from ferry.engine import TransferEngine      # instead of mooncake.engine
    te = TransferEngine()
    te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "")
    session_id = te.get_session_id()            # "127.0.0.1:<rpc port>"
    te.register_memory(ptr, length)
    te.batch_transfer_sync_write(peer_session, [ptr], [peer_ptr], [length])

Method names, arguments and return conventions follow Mooncake's Python
binding (mooncake-integration/transfer_engine/transfer_engine_py.cpp). One
deliberate difference: a failure returns the negative Ferry code (-3
ADDRESS_NOT_REGISTERED, -400 TIMEOUT, ...) instead of Mooncake's bare -1, and
errors.last_error_detail() (or get_last_error()) describes it. Code that
tests `ret != 0` or `ret < 0` works unchanged.

TransferEngine(raise_on_error=True) raises ferry.FerryError subclasses
instead of returning codes. See bindings/python/README.md for the mapping.

The argument checks are in _mooncake_args, the CUDA driver and runtime calls
in _cuda, the memory registration in _registrations, the async batches and
their statuses in _async_batches.
"""

import enum
import itertools
import json
import logging
import mmap
import os
import threading
import time

from . import _lib, _strided, _tensors, _vectors, core, errors
from ._async_batches import AsyncBatches, _total
from ._host_memory import allocate_host_buffer, free_host_buffer  # noqa: F401 - API
from ._cuda import _cuda_driver, _cuda_stream_wait, _cudart, _device_ordinal  # noqa: F401 - _cudart: tests
from ._mooncake_args import (P2PHANDSHAKE, _FALLBACK_FROM,  # noqa: F401 - P2PHANDSHAKE: API
                             _check_int_entries, _code, _int, _lists, _metadata, _nonempty,
                             _opcode_arg, _peer, _split_hostname, _transport)
from ._registrations import MemoryRegistrations, _deregister_all
from .core import Engine
from .errors import FerryError, fail

__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify", "Read", "Write",
           "allocate_host_buffer", "free_host_buffer",
           "SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_INTRA_NVLINK", "SUPPORT_CUDA"]

log = logging.getLogger("ferry")
log.addHandler(logging.NullHandler())  # the application decides where warnings go
_notify_loss_log = [0.0]  # when the last lost-notify warning went out (one a second)

SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_INTRA_NVLINK = False
# SUPPORT_CUDA: whether this library and process tell CUDA device memory from
# host memory at registration (module __getattr__ below, on first use).


class TransferOpcode(enum.IntEnum):
    Read = 0
    Write = 1
    # Mooncake's Python API reference (docs/source/python-api-reference/
    # transfer-engine.md) and examples spell them READ / WRITE: aliases.
    READ = 0
    WRITE = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification: name (sender-chosen) and msg, as in Mooncake."""

    __slots__ = ("name", "msg", "peer")

    def __init__(self, name="", msg="", peer=None):
        self.name = name
        self.msg = msg
        self.peer = peer  # Ferry: the sender's engine name

    def __repr__(self):
        return "TransferNotify(name=%r, msg=%r)" % (self.name, self.msg)

    def __eq__(self, other):
        return (isinstance(other, TransferNotify) and self.name == other.name
                and self.msg == other.msg)


def _check_notify(note):
    """Refuses (ArgumentError) a notify that could never be sent, before its transfer
    moves anything: once the bytes are placed, the notify no longer decides the result."""
    if note is not None:
        core._encode_notify(note.msg, note.name)


def _notify(v):
    if v is None or isinstance(v, TransferNotify):
        return v
    if hasattr(v, "name") and hasattr(v, "msg"):  # another TransferNotify class (Mooncake's own)
        return v
    raise TypeError("notify must be a TransferNotify(name, msg) or None, not %s"
                    % type(v).__name__)


class TransferEngine(MemoryRegistrations, AsyncBatches):
    """Drop-in for mooncake.engine.TransferEngine over Ferry.

    raise_on_error: raise FerryError subclasses instead of returning codes.
    transport_fallback: protocol "rdma" (or "shm") falls back to Ferry's
    automatic transport choice when this build or host lacks that transport,
    like Mooncake falling back when no RDMA device is found (a warning is
    logged on the "ferry" logger); False makes it an error (what the engine
    reports: INVALID_ARGUMENT for a transport this build does not know,
    DEVICE_NOT_FOUND for one without a device).
    engine: an existing ferry.Engine to front (already initialized; not
    closed by this object), e.g. a strict and a code-returning view of one engine.
    """

    TransferOpcode = TransferOpcode

    def __init__(self, raise_on_error=False, transport_fallback=True, engine=None):
        self.raise_on_error = raise_on_error
        self.transport_fallback = transport_fallback
        self._engine = engine
        self._owns_engine = engine is None
        self._hostname = None
        self._device_name = None
        self._protocol = None
        self._transport = None
        self._lock = threading.Lock()
        self._batches = {}  # id -> _async_batches._AsyncBatch
        self._batch_ids = itertools.count(1)
        self._managed = {}  # addr -> mmap
        # Peers whose session this object opened (Mooncake's segment handle
        # cache): the first call to a peer opens its session, synchronously,
        # so an async submit to a peer nobody answers for fails at submit
        # (0); a failed call forgets the peer, so the next one opens afresh.
        self._open_peers = set()

    # ------------------------------------------------------------ plumbing
    def _fail(self, exc):
        if self.raise_on_error:
            raise exc
        return exc.code

    def _run(self, f, *args, on_error=None):
        # errors.last_error_detail() describes this call: empty after a success.
        try:
            out = f(*args)
        except FerryError as exc:
            errors._record(exc.code, exc.detail)
            if self.raise_on_error:
                raise
            return exc.code if on_error is None else on_error
        errors._record(0, "")
        return out

    def _session(self, eng, peer):
        """Opens the session to peer on this object's first call to it."""
        if peer not in self._open_peers:
            eng.open_session(peer)
            self._open_peers.add(peer)

    def _run_peer(self, peer, f, on_error=None):
        """_run for a call to one peer: a failure forgets the peer (see _open_peers)."""
        def call():
            try:
                return f()
            except FerryError:
                self._open_peers.discard(peer)
                raise
        return self._run(call, on_error=on_error)

    def _eng(self):
        if self._engine is None or self._engine.closed:
            fail(_code("CONTEXT"), "CONTEXT (-202): the TransferEngine is not initialized "
                 "(call initialize first) or was closed")
        return self._engine

    @property
    def engine(self):
        """The underlying ferry.Engine (None before initialize)."""
        return self._engine

    def get_last_error(self):
        """This thread's last failure as a FerryError (None if none)."""
        return errors.last_error()

    # -------------------------------------------------------- initialization
    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        """0, or a negative code. local_hostname: "host" or "host:port";
        metadata_server: "P2PHANDSHAKE", "etcd://h:p", "redis://h:p",
        "http://h:p/metadata" (Mooncake's HTTP metadata server) or "h:p" (etcd);
        protocol: "rdma", "tcp", "shm", "auto" (fallback: see the class doc);
        device_name: RDMA device filter, unused by Ferry.
        A failure returns -1, as Mooncake's initialize does for every failure
        (its own tests assert == -1); the Ferry code and the reason are in
        errors.last_error_code() / last_error_detail()."""
        return self._run(self._initialize, local_hostname, metadata_server, protocol,
                         device_name, None, on_error=-1)

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name,
                       metadata_type):
        return self._run(self._initialize, local_hostname, metadata_server, protocol,
                         device_name, metadata_type, on_error=-1)

    def _initialize(self, local_hostname, metadata_server, protocol, device_name, metadata_type):
        if self._engine is not None and not self._engine.closed:
            fail(_code("INVALID_ARGUMENT"),
                 "INVALID_ARGUMENT (-1): TransferEngine already initialized as %s"
                 % self._engine.name)
        host, port = _split_hostname(local_hostname)
        kw = {}
        if host is not None:
            kw["host"] = host
        if port is not None:
            kw["port"] = port
        # SGLang hard-codes the metadata server and the protocol: the FERRY_*
        # environment, when set, overrides them (operators choose there).
        if not os.environ.get("FERRY_METADATA"):
            kw["metadata"] = _metadata(metadata_server, metadata_type)
        transport = None
        if not os.environ.get("FERRY_TRANSPORT"):
            transport = _transport(protocol)
            if transport in ("rdma", "auto") and _mc_force_tcp():
                transport = "tcp"  # Mooncake: MC_FORCE_TCP installs TCP only
            kw["transport"] = transport
        if not os.environ.get("FERRY_TIMEOUT_MS") and os.environ.get("MC_TRANSFER_TIMEOUT"):
            try:
                kw["timeout_ms"] = max(5, int(os.environ["MC_TRANSFER_TIMEOUT"])) * 1000
            except ValueError:
                pass
        try:
            eng = self._open_engine(kw)
        except FerryError as exc:
            if (transport not in _FALLBACK_FROM or not self.transport_fallback or exc.name not in
                    ("DEVICE_NOT_FOUND", "NOT_IMPLEMENTED", "INVALID_ARGUMENT")):
                raise
            log.warning("ferry: protocol %r unavailable (%s); falling back to transport "
                        "'auto'", protocol, exc)
            kw["transport"] = "auto"
            eng = self._open_engine(kw)
            transport = "auto"
        self._engine = eng
        self._owns_engine = True
        self._hostname = host
        self._protocol = protocol
        self._transport = transport or eng.config.get("transport")
        self._device_name = device_name
        return 0

    @staticmethod
    def _open_engine(kw):
        """Engine(**kw). With P2PHANDSHAKE, Mooncake ignores the port of
        local_hostname and listens on a free one (its session id is then
        "host:get_rpc_port()", which is what its callers use: Mooncake's own
        tests pass fixed "127.0.0.1:12345"/":12347"). Ferry keeps the port
        asked for when it can have it (a restarted process keeps its name),
        and takes a free one, with a warning, when it is in use, instead of
        failing where Mooncake succeeds. With etcd/redis/http the port is part of
        the name peers look up: a busy port stays an error there."""
        try:
            return Engine(**kw)
        except FerryError as exc:
            if not (kw.get("port") and kw.get("metadata") == "p2p" and exc.name == "SOCKET"
                    and "in use" in (exc.detail or "")):
                raise  # e.g. an address that is not local: the port is not the problem
            log.warning("ferry: cannot listen on port %d (%s); P2PHANDSHAKE: taking a free "
                        "port as Mooncake does (session id: host:get_rpc_port())",
                        kw["port"], exc.detail)
            return Engine(**dict(kw, port=0))

    def get_rpc_port(self):
        """The port peers connect to (the engine's listen port)."""
        return self._run(lambda: self._eng().port)

    def get_session_id(self):
        """"host:port", the name peers pass as target_hostname / session id."""
        try:
            return self._eng().name
        except FerryError:
            if self.raise_on_error:
                raise
            return ""

    def get_engine(self):
        return self._engine

    def get_engine_ptr(self):
        return self._engine.handle if self._engine is not None else 0

    def close(self):
        """Frees batches and managed buffers, destroys the engine (Ferry extension)."""
        eng, self._engine = self._engine, None
        with self._lock:
            batches, self._batches = self._batches, {}
        for ent in batches.values():
            if ent.batch is not None:
                ent.batch._shutdown()
        if eng is not None:
            for addr in list(self._managed):
                try:
                    eng.deregister(addr)
                except FerryError:
                    pass
            if self._owns_engine:
                eng.close()
        for mm in self._managed.values():
            try:
                mm.close()
            except Exception:
                pass
        self._managed.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---------------------------------------------------------- registration
    # register_memory, unregister_memory and their batch forms:
    # _registrations.MemoryRegistrations.
    @staticmethod
    def _check_location(eng, addrs, location):
        _check_device_without_cuda(eng, addrs)
        TransferEngine._check_named_location(eng, addrs, location)

    def allocate_managed_buffer(self, length):
        """A registered buffer of length bytes owned by the engine; its address, 0 on failure."""
        def go():
            eng = self._eng()
            n = int(length)
            if n <= 0:
                fail(_code("INVALID_ARGUMENT"), "INVALID_ARGUMENT (-1): length must be positive")
            mm = mmap.mmap(-1, n)
            try:
                addr = eng.register(mm, n, core.MEM_REMOTE)
            except BaseException:
                mm.close()
                raise
            self._managed[addr] = mm
            return addr
        return self._run(go, on_error=0)

    def free_managed_buffer(self, buffer_addr, length):
        def go():
            mm = self._managed.pop(int(buffer_addr), None)
            if mm is None:
                fail(_code("ADDRESS_NOT_REGISTERED"), "ADDRESS_NOT_REGISTERED (-3): %#x is not a "
                     "managed buffer of this engine" % int(buffer_addr))
            try:
                self._eng().deregister(int(buffer_addr))
            finally:
                mm.close()
            return 0
        return self._run(go)

    # ------------------------------------------------------------- transfers
    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length,
                            transport_hint=""):
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length,
                                  TransferOpcode.Write)

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length,
                           transport_hint=""):
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length,
                                  TransferOpcode.Read)

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode,
                      notify=None, transport_hint=""):
        """0 when every byte is placed (write) or received (read); a negative code.
        notify (TransferNotify): sent to the peer after the transfer completes."""
        peer, op, note = _peer(target_hostname), _opcode_arg(opcode), _notify(notify)
        remote, n = _int(peer_buffer_address, "peer_buffer_address"), _int(length, "length")

        def go():
            _check_notify(note)
            eng = self._eng()
            if n >= self._SCALED_SYNC_FROM:
                self._sync_scaled(eng, peer, op, [buffer], [remote], [n], n)
            elif n != 0:  # zero bytes: complete as it is (Mooncake)
                eng.transfer(peer, op, buffer, remote, n)
            if note is not None:
                self._notify_after_transfer(eng, peer, note)
            return 0
        return self._run_peer(peer, go)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                  transport_hint=""):
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses, lengths,
                                        TransferOpcode.Write)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                 transport_hint=""):
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses, lengths,
                                        TransferOpcode.Read)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                            opcode, notify=None, transport_hint=""):
        peer, op, note = _peer(target_hostname), _opcode_arg(opcode), _notify(notify)

        def go():
            _check_notify(note)
            eng = self._eng()
            vecs = _vectors.triple(buffers, peer_buffer_addresses, lengths)
            if vecs is not None:  # all ints: C vectors (see _vectors), no per-entry Python
                la, ra, ln = _vectors.nonzero(*vecs)
                total = _vectors.total(ln)
                if total >= self._SCALED_SYNC_FROM:
                    self._sync_scaled(eng, peer, op, buffers, peer_buffer_addresses, lengths, total)
                else:
                    eng._transfer_vectors(core._peer_bytes(peer), op, la, ra, ln)
                bufs = ()
            else:
                bufs, remotes, lens = _nonempty(*_lists(buffers, peer_buffer_addresses, lengths))
                total = _total(lens)
                if total >= self._SCALED_SYNC_FROM:
                    self._sync_scaled(eng, peer, op, bufs, remotes, lens, total)
                    bufs = ()
            if len(bufs):
                try:
                    eng.transfer_batch(peer, op, bufs, remotes, lens)
                except errors.InvalidArgument:  # noqa: F821 - from the code table
                    _check_int_entries(remotes, lens)
                    raise
            if note is not None:
                self._notify_after_transfer(eng, peer, note)
            return 0
        return self._run_peer(peer, go)

    @staticmethod
    def _notify_after_transfer(eng, peer, note):
        """Sends a transfer's notify once its bytes are placed. As in Mooncake, a
        placed transfer never fails for its notify: a notify that fails (the
        peer dropped it, its connection broke) is counted in the engine's
        notifies_unsent and logged (a warning, at most one a second), and the
        transfer still returns 0."""
        try:
            eng.notify(peer, note.msg, name=note.name)
        except FerryError as exc:
            now = time.monotonic()
            if now - _notify_loss_log[0] >= 1.0:
                _notify_loss_log[0] = now
                log.warning("ferry: the notify after a placed transfer to %s was lost: %s", peer, exc)

    # ---------------------------------------------------------------- tensors
    def transfer_tensor_sync_write(self, target_hostname, tensor, peer_buffer_address):
        """Writes tensor to peer_buffer_address as Mooncake does: a 24-byte header
        (dtype code, ndim, shape[4]) then the elements; the peer's region must hold
        24 + numel * element_size bytes. 0 or a negative code (see ferry/_tensors.py)."""
        peer = _peer(target_hostname)
        remote = _int(peer_buffer_address, "peer_buffer_address")

        def go():
            eng = self._eng()
            t, header, data, nbytes = _tensors.describe(tensor)
            head = _tensors.Staging(eng, len(header))
            ours = False
            try:
                head.mm[:len(header)] = header
                if _tensors.register_for_call(eng, data, nbytes):
                    # a device pointer this library cannot move: deregistered, raises
                    _check_device_without_cuda(eng, [data])
                    ours = True
                bufs, remotes, lens = [head.addr], [remote], [len(header)]
                if nbytes:
                    bufs.append(data)
                    remotes.append(remote + len(header))
                    lens.append(nbytes)
                self._transfer_lists(eng, peer, TransferOpcode.Write, bufs, remotes, lens)
            finally:
                head.close()
                if ours:
                    eng.deregister(data)
            del t  # (a contiguous copy had to live until its bytes were sent)
            return 0
        return self._run_peer(peer, go)

    def transfer_tensor_sync_read(self, target_hostname, peer_buffer_address, total_size):
        """Reads what transfer_tensor_sync_write wrote (total_size = 24 + its data
        bytes) into a new CPU torch.Tensor; None on failure (the code and reason
        in errors.last_error_code() / last_error_detail())."""
        peer = _peer(target_hostname)
        remote = _int(peer_buffer_address, "peer_buffer_address")
        total = _int(total_size, "total_size")

        def go():
            eng = self._eng()
            if total < _tensors.HEADER_SIZE:
                fail(_code("INVALID_ARGUMENT"), "INVALID_ARGUMENT (-1): total_size %d is less "
                     "than the %d-byte tensor header" % (total, _tensors.HEADER_SIZE))
            stage = _tensors.Staging(eng, total)
            try:
                self._transfer_lists(eng, peer, TransferOpcode.Read, [stage.addr], [remote],
                                     [total])
                raw = bytes(stage.mm[:total])
            finally:
                stage.close()
            name, shape = _tensors.parse(raw[:_tensors.HEADER_SIZE], total - _tensors.HEADER_SIZE)
            return _tensors.build(name, shape, raw[_tensors.HEADER_SIZE:])
        failed = object()
        out = self._run_peer(peer, go, on_error=failed)
        return None if out is failed else out

    def _transfer_lists(self, eng, peer, op, bufs, remotes, lens):
        """A sync batch with Mooncake's size-scaled deadline (as batch_transfer_sync)."""
        total = sum(lens)
        if total >= self._SCALED_SYNC_FROM:
            self._sync_scaled(eng, peer, op, bufs, remotes, lens, total)
        else:
            eng.transfer_batch(peer, op, bufs, remotes, lens)

    def transfer_strided_sync(self, target_hostname, opcode, local_base, local_stride, remote_base,
                              remote_stride, piece_len, n=None, local_indices=None, remote_indices=None):
        """Ferry extension: n pieces of piece_len bytes, piece i between
        local_base + local_indices[i] * local_stride and remote_base +
        remote_indices[i] * remote_stride (indices None: 0..n-1; lists or
        numpy integer arrays). One descriptor instead of n entries: bounds
        checked once, sent compactly (see ferry/_strided.py). n defaults to
        the indices' length. 0, or as batch_transfer_sync on failure."""
        peer, op = _peer(target_hostname), _opcode_arg(opcode)
        if n is None:
            given = remote_indices if remote_indices is not None else local_indices
            n = len(given) if given is not None else 0

        def go():
            if n:
                _strided.transfer_sync(self._eng(), core._peer_bytes(peer), op, local_base, local_stride,
                                       remote_base, remote_stride, piece_len, n, local_indices,
                                       remote_indices)
            return 0
        return self._run_peer(peer, go)

    # ---------------------------------------------------------- async batches
    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses,
                                   lengths, transport_hint=""):
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, TransferOpcode.Write)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, TransferOpcode.Read)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length,
                              transport_hint=""):
        """A batch id for transfer_check_status, or 0 when the submit failed."""
        return self.batch_transfer_async(target_hostname, [buffer], [peer_buffer_address],
                                         [length], TransferOpcode.Write)

    # --------------------------------------------------------------- segments
    def get_first_buffer_address(self, segment_name):
        """The address of the peer's first registered region still registered (remote-accessible),
        as Mooncake's buffers[0]; 0 if none or on failure."""
        def go():
            segs = self._eng().segments(segment_name)
            # A region's generation is the peer registry's count of registrations
            # when it was registered: the smallest is the earliest still there.
            return min(segs, key=lambda s: s.generation).addr if segs else 0
        return self._run(go, on_error=0)

    def send_probe(self, peer_server_name):
        """0 when the peer answers a ping (a control-frame round trip); a session the peer
        invalidated (restart) is re-opened. A negative code otherwise."""
        def go():
            eng = self._eng()
            try:
                if _lib.has("ferry_session_ping"):
                    eng.ping(peer_server_name)
                else:
                    eng.segments(peer_server_name, max_count=0)
            except (errors.PeerRestarted, errors.SessionInvalid,  # noqa: F821
                    errors.PeerClosed):  # noqa: F821
                try:
                    eng.close_session(peer_server_name)
                except FerryError:
                    pass
                eng.open_session(peer_server_name)
            return 0
        return self._run(go)

    def warmup_efa_segment(self, segment_name):
        """Opens the session ahead of the first transfer."""
        return self._run(lambda: (self._eng().open_session(segment_name), 0)[1])

    def get_local_topology(self, device_name=None):
        """JSON text; Ferry has no RDMA topology to report."""
        return json.dumps({"transport": self._transport or "auto", "devices": []})

    # ---------------------------------------------------------- notifications
    def get_notifies(self):
        """Queued notifications as TransferNotify(name, msg) (msg a str, as in Mooncake)."""
        def go():
            out = []
            for n in self._eng().notifications():
                msg = n.msg.decode("utf-8", "surrogateescape")
                out.append(TransferNotify(n.name if n.name is not None else n.peer, msg, n.peer))
            return out
        return self._run(go, on_error=[])

    def send_notify(self, target_hostname, notify, msg=None):
        """Ferry extension: sends a notification without a transfer.
        send_notify(peer, TransferNotify(name, msg)) or send_notify(peer, name, msg)."""
        peer = _peer(target_hostname)
        if msg is not None and not isinstance(msg, (str, bytes, bytearray)):
            raise TypeError("msg must be a str or bytes, not %s" % type(msg).__name__)
        if isinstance(notify, (str, bytes)) or notify is None:
            name, m = notify, msg if msg is not None else ""
        else:
            note = _notify(notify)
            name, m = note.name, note.msg
        if not isinstance(m, (str, bytes, bytearray)):
            raise TypeError("msg must be a str or bytes, not %s" % type(m).__name__)

        def go():
            self._eng().notify(peer, m, name=name)
            return 0
        return self._run(go)

    # ----------------------------------------------------------- raw memory
    def write_bytes_to_buffer(self, dest_address, src_ptr, length):
        """Copies length bytes of src_ptr (bytes or str) to dest_address, which must
        lie in memory registered with this engine (host or device): 0, or
        ADDRESS_NOT_REGISTERED / OUT_OF_BOUNDS / INVALID_ARGUMENT, nothing touched.
        Mooncake copies blindly (a bad address crashes the interpreter)."""
        dest = _int(dest_address, "dest_address")
        if isinstance(src_ptr, str):
            src = src_ptr.encode("utf-8", "surrogateescape")
        elif isinstance(src_ptr, (bytes, bytearray, memoryview)):
            src = bytes(src_ptr)
        else:
            raise TypeError("src_ptr must be bytes or str, not %s" % type(src_ptr).__name__)
        n = _int(length, "length")

        def go():
            eng = self._eng()
            if n > len(src) or n < 0:
                fail(_code("INVALID_ARGUMENT"), "INVALID_ARGUMENT (-1): length %d exceeds the %d "
                     "source bytes" % (n, len(src)))
            eng.write_registered(dest, src[:n])
            return 0
        return self._run(go)

    def read_bytes_from_buffer(self, source_address, length):
        """length bytes at source_address, which must lie in memory registered with
        this engine (host or device). On failure the negative code (an int, not
        bytes: never uninitialised bytes); raise_on_error=True raises."""
        src = _int(source_address, "source_address")
        n = _int(length, "length")

        def go():
            if n < 0:
                fail(_code("INVALID_ARGUMENT"), "INVALID_ARGUMENT (-1): negative length %d" % n)
            return self._eng().read_registered(src, n)
        return self._run(go)

    # ------------------------------------------------------- CUDA streams
    # Mooncake (built with CUDA) queues the transfer on the stream with
    # cudaLaunchHostFunc: it starts after the stream's earlier work and later
    # work waits for it. Ferry waits for the stream's earlier work here, then
    # transfers before returning, which gives the same order. Mooncake
    # returns None and exits the process when the transfer fails; Ferry
    # returns 0 or the negative code (raise_on_error=True raises).
    def transfer_write_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                               stream_ptr=0, transport_hint=""):
        return self._on_cuda(target_hostname, [buffer], [peer_buffer_address], [length],
                             TransferOpcode.Write, stream_ptr)

    def transfer_read_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                              stream_ptr=0, transport_hint=""):
        return self._on_cuda(target_hostname, [buffer], [peer_buffer_address], [length],
                             TransferOpcode.Read, stream_ptr)

    def batch_transfer_write_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                     lengths, stream_ptr=0, transport_hint=""):
        return self._on_cuda(target_hostname, buffers, peer_buffer_addresses, lengths,
                             TransferOpcode.Write, stream_ptr)

    def batch_transfer_read_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                    lengths, stream_ptr=0, transport_hint=""):
        return self._on_cuda(target_hostname, buffers, peer_buffer_addresses, lengths,
                             TransferOpcode.Read, stream_ptr)

    def _on_cuda(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode,
                 stream_ptr):
        stream = _int(stream_ptr, "stream_ptr")
        rc = self._run(_cuda_stream_wait, stream)
        if rc != 0:
            return rc
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses, lengths,
                                        opcode)

    # ------------------------------------------ Mooncake's first Python binding
    # The mooncake_vllm_adaptor module's camelCase methods, which vLLM 0.7's
    # MooncakePipe calls (mva.mooncake_vllm_adaptor(); the shim provides the
    # module). Its transferSync only reads: local buffer <- peer address.
    def allocateManagedBuffer(self, length):  # noqa: N802 - Mooncake's name
        return self.allocate_managed_buffer(length)

    def freeManagedBuffer(self, buffer_addr, length):  # noqa: N802
        return self.free_managed_buffer(buffer_addr, length)

    def transferSync(self, target_hostname, buffer, peer_buffer_address, length):  # noqa: N802
        return self.transfer_sync_read(target_hostname, buffer, peer_buffer_address, length)

    def writeBytesToBuffer(self, dest_address, src_ptr, length):  # noqa: N802
        return self.write_bytes_to_buffer(dest_address, src_ptr, length)

    def readBytesFromBuffer(self, source_address, length):  # noqa: N802
        return self.read_bytes_from_buffer(source_address, length)


# The class's name in Mooncake's first Python releases (its
# mooncake-wheel/tests/transfer_engine_target.py still calls
# mooncake_vllm_adaptor() and initialize()).
mooncake_vllm_adaptor = TransferEngine


# ------------------------------------------------------------------- CUDA
def _check_device_without_cuda(eng, addrs):
    """A library that cannot tell device memory (SUPPORT_CUDA False) would take
    a CUDA pointer for host memory and touch it with the CPU. Ask the CUDA
    driver, if this process has one initialized, and refuse such a pointer
    loudly (the regions are deregistered)."""
    if _support_cuda():
        return  # the library tells them apart itself
    if _cuda_driver() is None:
        return  # no CUDA driver in this process: no device memory (asked once, not per address)
    for a in addrs:
        ordinal = _device_ordinal(a)
        if ordinal is None:
            continue
        _deregister_all(eng, addrs)
        why = core.device_memory_supported()[1]
        fail(_code("NOT_IMPLEMENTED"), "NOT_IMPLEMENTED (-303): %#x is CUDA device %d memory, "
             "and this libferry cannot move device memory (%s); not registered. Use a library "
             "built with FERRY_WITH_CUDA, or register host memory" % (a, ordinal, why))


def _mc_force_tcp():
    """Mooncake's MC_FORCE_TCP: when set, its engine installs the TCP transport
    only (SGLang sets MC_FORCE_TCP=1 for TCP-only deployments)."""
    v = os.environ.get("MC_FORCE_TCP")
    return v is not None and v.strip().lower() not in ("0", "false", "no", "off")


def _support_cuda():
    # Asked of the library on each use until True (then kept): libferry uses
    # the CUDA driver only once this process has loaded it (torch.cuda, ...),
    # so False before CUDA is in use here can turn True later.
    value = globals().get("SUPPORT_CUDA")
    if value is None:
        value = core.device_memory_supported()[0]
        if value:
            globals()["SUPPORT_CUDA"] = value
    return value


def __getattr__(name):
    if name == "SUPPORT_CUDA":
        return _support_cuda()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
