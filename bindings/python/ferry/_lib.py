# SPDX-License-Identifier: Apache-2.0
"""Locating and loading libferry.so, and the ctypes view of <ferry/ferry.h>.

Search order:
  1. $FERRY_LIBRARY: a path to the library file, or a directory holding it;
  2. when this package runs from a checkout, the repository's build
     directories (build/, then build-*/ in name order), skipping builds that
     cannot be loaded into this interpreter (an ASan build without LD_PRELOAD);
  3. the system loader: libferry.so.<ABI_MAJOR> (the SONAME; found through
     LD_LIBRARY_PATH and the ldconfig cache, so an installed library in
     /usr/local/lib needs `ldconfig` once), then ctypes.util.find_library;
  4. the library the wheel carries (ferry/_libs/libferry.so.<ABI_MAJOR>,
     bindings/python/_build/ferry_backend.py puts it there).
A library is taken only if it exports ferry_version() with the major
version this binding was written for (docs/ABI.md).

Functions of the engine half are bound lazily: a library built before the
engine existed still loads and serves the error functions, and a call to a
missing symbol fails with NOT_IMPLEMENTED naming the symbol.
"""

import ctypes
import ctypes.util
import glob
import os
import threading

__all__ = ["LibraryNotFound", "lib", "path", "fn", "has", "Config", "Segment", "PeerInfo",
           "PeerMetrics", "Request", "Strided", "Status", "Notification", "new_struct"]

LIB_NAME = "libferry.so"
# The ABI major version this binding speaks: the SONAME is libferry.so.<ABI_MAJOR>.
ABI_MAJOR = 0
SONAME = "%s.%d" % (LIB_NAME, ABI_MAJOR)

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# bindings/python/ferry -> repository root
REPO_ROOT = os.path.normpath(os.path.join(_PKG_DIR, os.pardir, os.pardir, os.pardir))


class LibraryNotFound(ImportError):
    """libferry.so could not be found or loaded; the message lists every try."""


def _candidates():
    env = os.environ.get("FERRY_LIBRARY")
    if env:
        if os.path.isdir(env):
            yield os.path.join(env, LIB_NAME), "FERRY_LIBRARY"
        else:
            yield env, "FERRY_LIBRARY"
        return  # an explicit choice is not second-guessed
    if os.path.exists(os.path.join(REPO_ROOT, "include", "ferry", "ferry.h")):
        build_dirs = [os.path.join(REPO_ROOT, "build")]
        build_dirs += sorted(d for d in glob.glob(os.path.join(REPO_ROOT, "build-*")) if os.path.isdir(d))
        for d in build_dirs:
            p = os.path.join(d, LIB_NAME)
            if os.path.exists(p):
                yield p, "repository build"
    yield SONAME, "system loader"
    found = ctypes.util.find_library("ferry")
    if found and found != SONAME:
        yield found, "system loader"
    bundled = os.path.join(_PKG_DIR, "_libs", SONAME)
    if os.path.exists(bundled):
        yield bundled, "the wheel's copy"


def _incompatible(handle):
    """Why the loaded library cannot serve this binding, or None."""
    if not hasattr(handle, "ferry_error_name"):
        return "not a Ferry library (no ferry_error_name)"
    if not hasattr(handle, "ferry_version"):
        return "a Ferry library older than its stable ABI (no ferry_version)"
    handle.ferry_version.restype = ctypes.c_char_p
    handle.ferry_version.argtypes = []
    version = handle.ferry_version().decode()
    if version.split(".")[0] != str(ABI_MAJOR):
        return "Ferry %s, but this binding needs ABI major %d" % (version, ABI_MAJOR)
    return None


_lock = threading.Lock()
_lib = None
_path = None


def lib():
    """The loaded library (loaded on first use)."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for cand, origin in _candidates():
            try:
                handle = ctypes.CDLL(cand)
            except OSError as exc:
                tried.append("%s (%s): %s" % (cand, origin, exc))
                continue
            why = _incompatible(handle)
            if why:
                tried.append("%s (%s): %s" % (cand, origin, why))
                continue
            _declare_error_api(handle)
            _path = cand
            _lib = handle
            from . import _logging  # library messages to logging.getLogger("ferry")
            _logging._set(handle, True)
            return _lib
        raise LibraryNotFound(
            "libferry.so not found or not loadable; install it (cmake --install, then ldconfig), "
            "build it (cmake -S . -B build && cmake --build build) or set FERRY_LIBRARY. "
            "Tried:\n  " + "\n  ".join(tried))


def path():
    """File the library was loaded from."""
    lib()
    return _path


# ------------------------------------------------------------------ structs
c_size_t = ctypes.c_size_t
c_u64 = ctypes.c_uint64
c_u32 = ctypes.c_uint32
c_u16 = ctypes.c_uint16
c_int = ctypes.c_int
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p


# Structs that may grow begin with struct_size (docs/ABI.md): the library
# reads and writes only the bytes it covers, so these classes need not match
# a newer library's; new_struct() sets it. tests/test_layout.py checks that
# the fields match the header.
class Config(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("host", c_char_p),
        ("port", c_u16),
        ("metadata", c_char_p),
        ("transport", c_char_p),
        ("timeout_ms", c_int),
        ("connect_timeout_ms", c_int),
        ("conns_per_peer", c_int),
        ("workers", c_int),
        ("slice_size", c_size_t),
        ("retries", c_int),
        ("retry_backoff_ms", c_int),
        ("checksum", c_int),
        ("keepalive_ms", c_int),
        ("secret", c_char_p),
        ("log_level", c_int),
        ("max_sessions", c_int),
        ("metadata_ttl_s", c_int),
        ("metrics_port", c_int),
        ("cancel_timeout_ms", c_int),
        ("spin_us", c_int),
        ("max_connections", c_int),
        ("max_connections_per_source", c_int),
        ("metrics_host", c_char_p),
    ]


class Segment(ctypes.Structure):
    _fields_ = [("addr", c_u64), ("len", c_u64), ("flags", c_u32), ("generation", c_u32)]


class PeerInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("name", ctypes.c_char * 256),
        ("protocol_version", c_u32),
        ("engine_id", c_u64),
        ("epoch", c_u64),
        ("segment_version", c_u64),
        ("segment_count", c_size_t),
        ("transport", ctypes.c_char * 16),
        ("transport_reason", ctypes.c_char * 128),
        ("pid", ctypes.c_int32),
        ("same_host", c_int),
    ]


def new_struct(cls):
    """A zeroed cls instance, its struct_size set when it has one: the
    library then writes no byte past the struct this file describes."""
    obj = cls()
    if "struct_size" in (f[0] for f in cls._fields_):
        obj.struct_size = ctypes.sizeof(cls)
    return obj


class PeerMetrics(ctypes.Structure):
    _fields_ = [
        ("peer", ctypes.c_char * 256),
        ("transport", ctypes.c_char * 16),
        ("requests", c_u64 * 2),
        ("bytes", c_u64 * 2),
        ("failures", c_u64),
        ("retries", c_u64),
        ("latency", c_u64 * 19),  # FERRY_LATENCY_BUCKETS
        ("latency_sum_us", c_u64),
        ("error_codes", c_int * 64),  # FERRY_METRICS_MAX_CODES
        ("error_counts", c_u64 * 64),
        ("nerrors", c_size_t),
    ]


LATENCY_BUCKETS = 19


class Request(ctypes.Structure):
    _fields_ = [("opcode", c_int), ("local", c_void_p), ("remote", c_u64), ("len", c_size_t)]


class Strided(ctypes.Structure):
    """ferry_strided_t: n pieces at base + index * stride on each side."""
    _fields_ = [("struct_size", c_size_t), ("opcode", c_int), ("local_base", c_void_p),
                ("local_stride", c_u64), ("remote_base", c_u64), ("remote_stride", c_u64),
                ("piece_len", c_size_t), ("local_idx", ctypes.POINTER(c_u64)),
                ("remote_idx", ctypes.POINTER(c_u64)), ("n", c_size_t)]


class Status(ctypes.Structure):
    _fields_ = [("state", c_int), ("code", c_int), ("bytes", c_u64)]


class RegionInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("addr", c_u64), ("len", c_u64), ("flags", ctypes.c_uint), ("device", c_int),
                ("kind", ctypes.c_char * 24)]


class Notification(ctypes.Structure):
    _fields_ = [("peer", ctypes.c_char * 256), ("len", c_size_t),
                ("msg", ctypes.POINTER(ctypes.c_ubyte))]


# ----------------------------------------------------------------- prototypes
_P = ctypes.POINTER
_ERROR_API = {
    "ferry_error_name": (c_char_p, [c_int]),
    "ferry_strerror": (c_char_p, [c_int]),
    "ferry_error_advice": (c_char_p, [c_int]),
    "ferry_error_retryable": (c_int, [c_int]),
    "ferry_error_parse": (c_int, [c_char_p, _P(c_int)]),
    "ferry_last_error_detail": (c_char_p, []),
    "ferry_last_error_code": (c_int, []),
    "ferry_clear_last_error": (None, []),
}

_ENGINE_API = {
    "ferry_config_init": (None, [_P(Config)]),
    "ferry_config_from_env": (c_int, [_P(Config)]),
    "ferry_engine_create": (c_int, [_P(Config), _P(c_void_p)]),
    "ferry_engine_destroy": (None, [c_void_p]),
    "ferry_engine_port": (c_u16, [c_void_p]),
    "ferry_engine_name": (c_char_p, [c_void_p]),
    "ferry_engine_epoch": (c_u64, [c_void_p]),
    "ferry_register": (c_int, [c_void_p, c_void_p, c_size_t, ctypes.c_uint]),
    "ferry_deregister": (c_int, [c_void_p, c_void_p]),
    "ferry_register_batch": (c_int, [c_void_p, _P(c_void_p), _P(c_size_t), c_size_t, ctypes.c_uint]),
    "ferry_deregister_batch": (c_int, [c_void_p, _P(c_void_p), c_size_t]),
    "ferry_region_count": (c_size_t, [c_void_p]),
    "ferry_region_query": (c_int, [c_void_p, c_void_p, c_size_t, _P(RegionInfo)]),
    "ferry_region_write": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t]),
    "ferry_region_read": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t]),
    "ferry_device_memory_supported": (c_int, [_P(c_char_p)]),
    "ferry_session_open": (c_int, [c_void_p, c_char_p]),
    "ferry_session_close": (c_int, [c_void_p, c_char_p]),
    "ferry_session_info": (c_int, [c_void_p, c_char_p, _P(PeerInfo)]),
    "ferry_session_segments": (ctypes.c_long, [c_void_p, c_char_p, _P(Segment), c_size_t]),
    "ferry_session_ping": (c_int, [c_void_p, c_char_p, _P(c_u64)]),
    "ferry_session_pin": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t]),
    "ferry_metrics_peers": (ctypes.c_long, [c_void_p, _P(PeerMetrics), c_size_t]),
    "ferry_metrics_transport": (c_int, [c_void_p, c_char_p, _P(PeerMetrics)]),
    "ferry_metrics_prometheus": (ctypes.c_long, [c_void_p, c_char_p, c_size_t]),
    "ferry_metrics_port": (c_u16, [c_void_p]),
    "ferry_transfer_sync": (c_int, [c_void_p, c_char_p, c_int, c_void_p, c_u64, c_size_t]),
    "ferry_batch_transfer_sync": (c_int, [c_void_p, c_char_p, c_int, _P(c_void_p), _P(c_u64),
                                          _P(c_size_t), c_size_t]),
    "ferry_strided_transfer_sync": (c_int, [c_void_p, c_char_p, _P(Strided)]),
    "ferry_batch_submit_strided": (ctypes.c_long, [c_void_p, c_char_p, _P(Strided), c_int]),
    "ferry_batch_alloc": (c_int, [c_void_p, c_size_t, _P(c_void_p)]),
    "ferry_batch_submit": (ctypes.c_long, [c_void_p, c_char_p, _P(Request), c_size_t, c_int]),
    "ferry_batch_status": (c_int, [c_void_p, c_size_t, _P(Status)]),
    "ferry_batch_wait": (c_int, [c_void_p, c_int]),
    "ferry_batch_cancel": (c_int, [c_void_p]),
    "ferry_batch_cancel_request": (c_int, [c_void_p, c_size_t]),
    "ferry_batch_free": (c_int, [c_void_p]),
    "ferry_notify": (c_int, [c_void_p, c_char_p, c_void_p, c_size_t]),
    "ferry_get_notifications": (ctypes.c_long, [c_void_p, _P(Notification), c_size_t]),
    "ferry_notifications_free": (None, [_P(Notification), c_size_t]),
}


def _declare(handle, name, proto):
    f = getattr(handle, name)
    f.restype, f.argtypes = proto[0], proto[1]
    return f


def _declare_error_api(handle):
    for name, proto in _ERROR_API.items():
        _declare(handle, name, proto)


_bound = {}


class MissingSymbol(Exception):
    """The loaded library lacks a function of the public API."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


def has(name):
    """True when the loaded library exports the public function name."""
    try:
        fn(name)
        return True
    except MissingSymbol:
        return False


def fn(name):
    """The ctypes function for a public API name, prototypes applied."""
    f = _bound.get(name)
    if f is not None:
        return f
    handle = lib()
    proto = _ERROR_API.get(name) or _ENGINE_API.get(name)
    if proto is None:
        raise KeyError(name)
    try:
        f = _declare(handle, name, proto)
    except AttributeError:
        raise MissingSymbol(name) from None
    _bound[name] = f
    return f
