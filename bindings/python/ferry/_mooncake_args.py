# SPDX-License-Identifier: Apache-2.0
"""Argument checks and conversions of the Mooncake-compatible API (ferry.engine):
the types its pybind11 signatures demand, the batch lists, and the
local_hostname, metadata server and protocol strings of initialize()."""

import ipaddress
import logging
import operator

from . import _buffers, errors
from .errors import fail

P2PHANDSHAKE = "P2PHANDSHAKE"

_log = logging.getLogger("ferry")

# Mooncake protocols Ferry has no transport for (a clear NOT_IMPLEMENTED).
_MOONCAKE_ONLY_PROTOCOLS = {"nvlink", "nvlink_intra", "hip", "xgmi", "ascend", "efa", "cxl",
                            "nvmeof", "barex", "ubshmem", "mnnvl", "gds", "io_uring",
                            "sunrise_link"}
_PROTOCOLS = {"tcp": "tcp", "shm": "shm", "auto": "auto", "": "auto", "rdma": "rdma"}
# Asked-for transports that fall back to "auto" when the engine lacks them.
_FALLBACK_FROM = {"rdma", "shm"}


def _code(name):
    return errors.CODES[name]


# ---- argument types. Mooncake's pybind11 signatures refuse a wrong type with
# TypeError before anything runs; so does this binding (never an
# AttributeError from deep inside, never a crash).
def _peer(v, what="target_hostname"):
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    raise TypeError("%s must be a str (the peer's session id \"host:port\"), not %s"
                    % (what, type(v).__name__))


def _int(v, what):
    if isinstance(v, bool) or not _buffers._is_int(v):
        raise TypeError("%s must be an int, not %s" % (what, type(v).__name__))
    return operator.index(v)



def _opcode_arg(v):
    if isinstance(v, bool) or not _buffers._is_int(v):
        raise TypeError("opcode must be a TransferOpcode, not %s" % type(v).__name__)
    return int(v)


def _seq(v, what):
    """A batch argument as given (a list, tuple, numpy array, array.array: no
    per-entry work here, so large batches keep the library's fast paths),
    or a list of an iterable; TypeError for anything else."""
    if isinstance(v, (str, bytes, bytearray)) or not hasattr(v, "__iter__"):
        raise TypeError("%s must be a list, not %s" % (what, type(v).__name__))
    return v if hasattr(v, "__len__") and hasattr(v, "__getitem__") else list(v)


def _sized(v):
    """v itself when it is a sequence or an array (for the vector fast path,
    see _vectors), else a list of it."""
    if hasattr(v, "__len__") and hasattr(v, "__getitem__") and not isinstance(v, (str, bytes)):
        return v
    return list(v)


def _lists(buffers, peer_buffer_addresses, lengths):
    """The three lists of a batch call; INVALID_ARGUMENT when their counts differ."""
    bufs = _seq(buffers, "buffers")
    remotes = _seq(peer_buffer_addresses, "peer_buffer_addresses")
    lens = _seq(lengths, "lengths")
    _same_count(("buffers", "peer_buffer_addresses", "lengths"), (bufs, remotes, lens))
    return bufs, remotes, lens


def _same_count(names, seqs):
    """Batch lists of one count, or INVALID_ARGUMENT, logged to the "ferry"
    logger as Mooncake logs it (its calls then return their failure value:
    -1, or batch id 0): nothing is moved or registered, never a batch cut
    to the shortest list."""
    counts = tuple(len(s) for s in seqs)
    if len(set(counts)) > 1:
        detail = ("INVALID_ARGUMENT (-1): %s and %s differ in count (%s)"
                  % (", ".join(names[:-1]), names[-1], ", ".join(map(str, counts))))
        _log.error("%s", detail)
        fail(_code("INVALID_ARGUMENT"), detail)


def _check_int_entries(remotes, lens):
    """After the library refused a batch's arguments: a TypeError naming the
    first entry that is not an int (Mooncake's pybind11 would have raised
    one), else nothing (the refusal stands)."""
    for what, seq in (("peer_buffer_addresses", remotes), ("lengths", lens)):
        if getattr(getattr(seq, "dtype", None), "kind", "") in ("i", "u"):
            continue
        for i, v in enumerate(seq):
            _int(v, "%s[%d]" % (what, i))


def _nonempty(bufs, remotes, lens):
    """Mooncake's convention: a zero-length request is complete as it is;
    only the others go to the engine. Without a zero length (the usual
    case, found at C speed), the lists go on untouched."""
    if not _has_zero(lens):
        return bufs, remotes, lens
    keep = [i for i, n in enumerate(lens) if isinstance(n, bool) or n != 0]
    return [bufs[i] for i in keep], [remotes[i] for i in keep], [lens[i] for i in keep]


def _has_zero(lens):
    try:
        return bool(0 in lens)
    except (TypeError, ValueError):
        return False


def _split_hostname(local_hostname):
    """("host", port or None) from "host", "host:port", "[v6]:port", "v6",
    "host:port:suffix" (Mooncake's Ascend form; the suffix is ignored)."""
    s = (local_hostname or "").strip()
    if not s:
        return None, None
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            fail(_code("INVALID_ARGUMENT"), "INVALID_ARGUMENT (-1): local_hostname %r: no ']'" % s)
        host, rest = s[1:end], s[end + 1:]
        if not rest:
            return host, None
        if not rest.startswith(":") or not rest[1:].isdigit():
            fail(_code("INVALID_ARGUMENT"),
                 "INVALID_ARGUMENT (-1): local_hostname %r: bad port" % s)
        return host, int(rest[1:])
    if s.count(":") > 1:
        try:
            ipaddress.IPv6Address(s)
            return s, None
        except ValueError:
            pass
    parts = s.split(":")
    if len(parts) == 1:
        return s, None
    if not parts[1].isdigit() or not (0 <= int(parts[1]) <= 65535):
        fail(_code("INVALID_ARGUMENT"),
             "INVALID_ARGUMENT (-1): local_hostname %r: port %r is not a number in 0..65535"
             % (s, parts[1]))
    return parts[0], int(parts[1])


def _metadata(metadata_server, metadata_type=None):
    m = (metadata_server or "").strip()
    if m == "" or m.upper() == P2PHANDSHAKE or m.lower() == "p2p":
        return "p2p"
    if "://" not in m:
        m = "%s://%s" % (metadata_type or "etcd", m)
    scheme = m.split("://", 1)[0].lower()
    if scheme in ("etcd", "redis", "http"):
        # http://host:port/metadata: Mooncake's HTTP metadata server, which
        # the library speaks itself (the path is part of the address).
        return m
    if scheme == "p2p":
        return "p2p"
    fail(_code("NOT_IMPLEMENTED"),
         "NOT_IMPLEMENTED (-303): metadata server %r: Ferry supports P2PHANDSHAKE, etcd://, "
         "redis:// and http://, not %s://" % (metadata_server, scheme))


def _transport(protocol):
    p = (protocol or "").strip().lower()
    if p in _PROTOCOLS:
        return _PROTOCOLS[p]
    if p in _MOONCAKE_ONLY_PROTOCOLS:
        fail(_code("NOT_IMPLEMENTED"),
             "NOT_IMPLEMENTED (-303): protocol %r is a Mooncake transport Ferry lacks; use "
             "tcp, shm, rdma or auto" % protocol)
    fail(_code("INVALID_ARGUMENT"),
         "INVALID_ARGUMENT (-1): unknown protocol %r (tcp, shm, rdma, auto)" % (protocol,))
