# SPDX-License-Identifier: Apache-2.0
"""Ferry error codes and exceptions.

The codes, their names, meanings and retry advice come from the C library's
single table (<ferry/error.h>, ferry_error_* functions), so Python never
disagrees with C. Every code is a module attribute (errors.TIMEOUT == -400),
also under its C name (errors.FERRY_ERR_TIMEOUT).

    errors.name(-3)             -> "ADDRESS_NOT_REGISTERED"
    errors.strerror(-3)         -> one line: what it means
    errors.advice(-3)           -> causes and what to do (as `ferry explain`)
    errors.retryable(-400)      -> True
    errors.parse("TIMEOUT")     -> -400 (also "-400", "FERRY_ERR_TIMEOUT")
    errors.last_error_detail()  -> this thread's last failure in full
    errors.CODES / errors.NAMES -> {name: code} / {code: name}

Exceptions: FerryError(code, name, detail, retryable) and one subclass per
code, grouped by category (see CATEGORY_OF). FerryError.from_code(code)
builds the right one.
"""

import ctypes
import threading

from . import _lib

__all__ = [
    "CODES", "NAMES", "name", "strerror", "advice", "retryable", "parse",
    "last_error_detail", "last_error_code", "last_error", "clear_last_error",
    "FerryError", "error_class", "check",
    # categories
    "ArgumentError", "AddressError", "ResourceError", "UnsupportedError",
    "FerryConnectionError", "ProtocolError", "FerryTimeout", "CancelError", "StateError",
]

_MIN_CODE = -1000  # the table's codes lie in [-1000, 0]


def _s(b):
    return b.decode("utf-8", "replace") if b is not None else ""


def name(code):
    """Name of a code without the FERRY_ERR_ prefix; "UNKNOWN" if not in the table."""
    return _s(_lib.fn("ferry_error_name")(int(code)))


def strerror(code):
    """One line: what the code means."""
    return _s(_lib.fn("ferry_strerror")(int(code)))


def advice(code):
    """Likely causes and what to do, a few lines (as `ferry explain`)."""
    return _s(_lib.fn("ferry_error_advice")(int(code)))


def retryable(code):
    """True when retrying the same operation may succeed."""
    return bool(_lib.fn("ferry_error_retryable")(int(code)))


def parse(text):
    """Code for a name ("TIMEOUT", "FERRY_ERR_TIMEOUT") or number ("-400"); None if unknown."""
    if isinstance(text, int):
        return text if name(text) != "UNKNOWN" else None
    out = ctypes.c_int(0)
    if _lib.fn("ferry_error_parse")(str(text).encode(), ctypes.byref(out)):
        return out.value
    return None


def _load_table():
    codes = {}
    for c in range(_MIN_CODE, 1):
        n = name(c)
        if n != "UNKNOWN":
            codes[n] = c
    return codes


CODES = _load_table()
NAMES = {c: n for n, c in CODES.items()}
globals().update(CODES)
globals().update({"FERRY_ERR_" + n: c for n, c in CODES.items()})
if "MALFORMED_FRAME" in CODES:  # Mooncake's name for -103
    MALFORMED_JSON = FERRY_ERR_MALFORMED_JSON = CODES["MALFORMED_FRAME"]  # noqa: F821

# ----------------------------------------------------------- last error
# The C library keeps the last failure per OS thread. The binding also fails
# in Python (a length mismatch, a buffer too small); those go here, and every
# failure the binding reports is mirrored here so that last_error_detail()
# describes the last failure a binding call on this thread returned.
_tls = threading.local()


def _record(code, detail):
    _tls.code = code
    _tls.detail = detail


def _c_detail():
    return _s(_lib.fn("ferry_last_error_detail")())


def last_error_detail():
    """This thread's last failure in full (peer, addresses, failing step); "" if none."""
    d = getattr(_tls, "detail", None)
    return d if d is not None else _c_detail()


def last_error_code():
    """This thread's last failure code (0 if none)."""
    c = getattr(_tls, "code", None)
    return c if c is not None else int(_lib.fn("ferry_last_error_code")())


def last_error():
    """This thread's last failure as a FerryError, or None."""
    c = last_error_code()
    return FerryError.from_code(c, last_error_detail()) if c else None


def clear_last_error():
    _tls.code = None
    _tls.detail = None
    _lib.fn("ferry_clear_last_error")()


# ------------------------------------------------------------ exceptions
class FerryError(Exception):
    """A Ferry failure: code (negative), name, detail (the full description) and
    retryable (whether retrying the same operation may succeed)."""

    def __init__(self, code, name=None, detail=None, retryable=None):
        code = int(code)
        self.code = code
        self.name = name if name is not None else globals()["name"](code)
        self.detail = detail if detail is not None else ""
        self.retryable = bool(retryable if retryable is not None else globals()["retryable"](code))
        super().__init__(code, self.name, self.detail, self.retryable)

    def __str__(self):
        if self.detail:
            # The C detail already starts with "NAME (code): " at its innermost part.
            if ("%s (%d)" % (self.name, self.code)) in self.detail:
                return self.detail
            return "%s (%d): %s" % (self.name, self.code, self.detail)
        return "%s (%d): %s" % (self.name, self.code, strerror(self.code))

    def __repr__(self):
        return "%s(code=%d, name=%r, detail=%r, retryable=%r)" % (
            type(self).__name__, self.code, self.name, self.detail, self.retryable)

    def __reduce__(self):
        return (type(self), (self.code, self.name, self.detail, self.retryable))

    @property
    def meaning(self):
        return strerror(self.code)

    @property
    def advice(self):
        return advice(self.code)

    @staticmethod
    def from_code(code, detail=None):
        """The exception of code's class; detail defaults to strerror(code)."""
        cls = error_class(code)
        return cls(code, name(code), detail if detail is not None else strerror(code),
                   retryable(code))


# Categories.
class ArgumentError(FerryError, ValueError):
    """The caller passed something invalid; retrying cannot help."""


class AddressError(FerryError):
    """An address range is not (or no longer) usable: registration, bounds, access."""


class ResourceError(FerryError):
    """Out of room: batch capacity, queue, memory."""


class UnsupportedError(FerryError):
    """The build, host or transport lacks what was asked for."""


class FerryConnectionError(FerryError):
    """Reaching or keeping the peer failed (name lookup, socket, peer gone or restarted)."""


class ProtocolError(FerryError):
    """The peer spoke something unexpected or failed verification."""


class FerryTimeout(FerryError):
    """The operation did not finish before its deadline."""


class CancelError(FerryError):
    """The request was cancelled (or its cancel could not be confirmed)."""


class StateError(FerryError):
    """The engine, session or batch is not in a state that allows the call."""


# One class per code: NAME -> (class name, category).
_PER_CODE = {
    "INVALID_ARGUMENT": ("InvalidArgument", ArgumentError),
    "TOO_MANY_REQUESTS": ("TooManyRequests", ResourceError),
    "ADDRESS_NOT_REGISTERED": ("AddressNotRegistered", AddressError),
    "BATCH_BUSY": ("BatchBusy", ResourceError),
    "DEVICE_NOT_FOUND": ("DeviceNotFound", UnsupportedError),
    "ADDRESS_OVERLAPPED": ("AddressOverlapped", AddressError),
    "DNS": ("DnsError", FerryConnectionError),
    "SOCKET": ("SocketError", FerryConnectionError),
    "MALFORMED_FRAME": ("MalformedFrame", ProtocolError),
    "REJECT_HANDSHAKE": ("HandshakeRejected", FerryConnectionError),
    "METADATA": ("MetadataError", FerryConnectionError),
    "ENDPOINT": ("EndpointError", FerryConnectionError),
    "CONTEXT": ("ContextError", StateError),
    "NUMA": ("NumaError", UnsupportedError),
    "CLOCK": ("ClockError", StateError),
    "MEMORY": ("FerryMemoryError", ResourceError),
    "NOT_IMPLEMENTED": ("FerryNotImplemented", UnsupportedError),
    "TIMEOUT": ("Timeout", FerryTimeout),
    "PEER_CLOSED": ("PeerClosed", FerryConnectionError),
    "PEER_RESTARTED": ("PeerRestarted", FerryConnectionError),
    "VERSION_MISMATCH": ("VersionMismatch", ProtocolError),
    "OUT_OF_BOUNDS": ("OutOfBounds", AddressError),
    "ACCESS_DENIED": ("AccessDenied", AddressError),
    "CHECKSUM_MISMATCH": ("ChecksumMismatch", ProtocolError),
    "CANCELLED": ("Cancelled", CancelError),
    "AUTH_FAILED": ("AuthFailed", ProtocolError),
    "STALE_SEGMENT": ("StaleSegment", AddressError),
    "SESSION_INVALID": ("SessionInvalid", StateError),
    "NOT_FOUND": ("NotFound", StateError),
    "CANCEL_UNCONFIRMED": ("CancelUnconfirmed", CancelError),
    "INTERNAL": ("InternalError", StateError),
}

_CLASS_BY_NAME = {}
for _n, (_cls_name, _base) in _PER_CODE.items():
    if _cls_name == "Timeout":
        # TIMEOUT is the only member of its category: the category is the class.
        _CLASS_BY_NAME[_n] = FerryTimeout
        continue
    _cls = type(_cls_name, (_base,), {"__doc__": "%s (%s)." % (_n, _base.__doc__.rstrip("."))})
    _cls.__module__ = __name__
    globals()[_cls_name] = _cls
    __all__.append(_cls_name)
    _CLASS_BY_NAME[_n] = _cls
del _n, _cls_name, _base

CATEGORY_OF = {n: c.__mro__[1] if c is not FerryTimeout else FerryTimeout
               for n, c in _CLASS_BY_NAME.items()}


def error_class(code):
    """The exception class for a code (FerryError for a code Python has no class for)."""
    return _CLASS_BY_NAME.get(name(code), FerryError)


def check(rc, detail=None):
    """rc if rc >= 0; otherwise records and raises the matching FerryError, with the
    C library's detail for this thread unless detail is given."""
    if rc >= 0:
        return rc
    if detail is None:
        # Trust the C detail only when it belongs to this failure.
        detail = _c_detail() if _lib.fn("ferry_last_error_code")() == rc else ""
        if not detail:
            detail = "%s (%d): %s" % (name(rc), rc, strerror(rc))
    _record(rc, detail)
    raise FerryError.from_code(rc, detail)


def fail(code, detail):
    """Raises a failure found in Python (not by the C library), recording it."""
    _record(code, detail)
    raise FerryError.from_code(code, detail)
