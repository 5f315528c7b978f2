# SPDX-License-Identifier: Apache-2.0
"""The values and small records of the strict API (ferry.core): opcodes, memory
flags, request states, the dataclasses its methods return, argument checks shared by
Engine and Batch, and the framing of named notifications."""

import ctypes
import struct
from dataclasses import dataclass
from typing import Optional

from . import _lib, errors
from .errors import fail

READ = 0
WRITE = 1
MEM_LOCAL = 0
MEM_REMOTE_READ = 1
MEM_REMOTE_WRITE = 2
MEM_REMOTE = MEM_REMOTE_READ | MEM_REMOTE_WRITE

STATUS_WAITING = 0
STATUS_PENDING = 1
STATUS_COMPLETED = 2
STATUS_FAILED = 3
STATUS_CANCELLED = 4
STATUS_TIMEOUT = 5
STATUS_NAMES = {0: "WAITING", 1: "PENDING", 2: "COMPLETED", 3: "FAILED", 4: "CANCELLED",
                5: "TIMEOUT"}

# struct_size is the ABI's bookkeeping (set by new_struct), not a setting.
CONFIG_FIELDS = tuple(f[0] for f in _lib.Config._fields_ if f[0] != "struct_size")
_STRING_FIELDS = {f[0] for f in _lib.Config._fields_ if f[1] is ctypes.c_char_p}

_NOTIFY_MAX = 64 * 1024
# Mooncake's notifications carry a sender-chosen name besides the message;
# Ferry's carry the sender's engine name. A named notification is framed as
# MAGIC, u16 little-endian name length, name, message.
_NOTIFY_MAGIC = b"\xffFN1"


def version():
    """The binding's idea of the C library version ("0.1.0")."""
    return "0.1.0"


def _inval(msg):
    fail(errors.CODES["INVALID_ARGUMENT"], "INVALID_ARGUMENT (-1): " + msg)


def _peer_bytes(peer):
    if isinstance(peer, bytes):
        return peer
    if not isinstance(peer, str) or not peer:
        _inval("peer must be a non-empty 'host:port' string, not %r" % (peer,))
    return peer.encode()


def _opcode(op):
    try:
        op = int(op)
    except (TypeError, ValueError):
        op = -1
    if op not in (READ, WRITE):
        _inval("opcode must be ferry.READ (0) or ferry.WRITE (1)")
    return op


def _call(name, *args):
    """Calls a C function; a missing symbol becomes NOT_IMPLEMENTED."""
    try:
        f = _lib.fn(name)
    except _lib.MissingSymbol:
        fail(errors.CODES["NOT_IMPLEMENTED"],
             "NOT_IMPLEMENTED (-303): %s lacks %s (built before the engine landed?)"
             % (_lib.path(), name))
    return f(*args)


@dataclass(frozen=True)
class Segment:
    addr: int
    len: int
    flags: int
    generation: int


@dataclass(frozen=True)
class PeerInfo:
    name: str
    protocol_version: int
    engine_id: int
    epoch: int
    segment_version: int
    segment_count: int
    transport: str
    transport_reason: str
    pid: int
    same_host: bool


@dataclass(frozen=True)
class PeerMetrics:
    peer: str
    transport: str
    requests: tuple        # (READ, WRITE) finished requests
    bytes: tuple           # (READ, WRITE) bytes confirmed
    failures: int
    retries: int
    latency: tuple         # requests per latency bucket (not cumulative)
    latency_sum_us: int
    errors: dict           # code -> count

    @staticmethod
    def from_c(m):
        n = min(int(m.nerrors), len(m.error_codes))
        return PeerMetrics(m.peer.decode(errors="replace"), m.transport.decode(errors="replace"),
                           tuple(m.requests), tuple(m.bytes), int(m.failures), int(m.retries),
                           tuple(m.latency), int(m.latency_sum_us),
                           {int(m.error_codes[i]): int(m.error_counts[i]) for i in range(n)})


@dataclass(frozen=True)
class RegionInfo:
    addr: int
    len: int
    flags: int
    device: int  # -1: host memory
    kind: str    # "host", "cuda:0", ...


def device_memory_supported():
    """(supported, why): whether this build and process tell device (CUDA)
    memory from host memory at registration. The first call may initialize
    the CUDA driver."""
    why = ctypes.c_char_p()
    ok = int(_lib.fn("ferry_device_memory_supported")(ctypes.byref(why))) == 1
    return ok, (why.value or b"").decode()


@dataclass(frozen=True)
class RequestStatus:
    state: int
    code: int
    bytes: int

    @property
    def state_name(self):
        return STATUS_NAMES.get(self.state, "UNKNOWN")

    @property
    def done(self):
        return self.state not in (STATUS_WAITING, STATUS_PENDING)

    @property
    def ok(self):
        return self.state == STATUS_COMPLETED


@dataclass(frozen=True)
class Notification:
    peer: str            # sender's engine name ("host:port")
    msg: bytes
    name: Optional[str]  # the sender-chosen name of a named notify, else None


def _encode_notify(msg, name):
    if isinstance(msg, str):
        msg = msg.encode("utf-8", "surrogateescape")
    msg = bytes(msg)
    if name is not None:
        nb = name.encode("utf-8", "surrogateescape") if isinstance(name, str) else bytes(name)
        if len(nb) > 0xFFFF:
            _inval("notify name is %d bytes, at most 65535" % len(nb))
        msg = _NOTIFY_MAGIC + struct.pack("<H", len(nb)) + nb + msg
    if len(msg) > _NOTIFY_MAX:
        _inval("notify message is %d bytes, at most %d" % (len(msg), _NOTIFY_MAX))
    return msg


def _decode_notify(peer, raw):
    if raw.startswith(_NOTIFY_MAGIC) and len(raw) >= 6:
        (n,) = struct.unpack_from("<H", raw, 4)
        if 6 + n <= len(raw):
            name = raw[6:6 + n].decode("utf-8", "surrogateescape")
            return Notification(peer, raw[6 + n:], name)
    return Notification(peer, raw, None)
