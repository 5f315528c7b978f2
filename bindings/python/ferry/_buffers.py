# SPDX-License-Identifier: Apache-2.0
"""Turning what callers pass as a buffer into (address, length, pin).

Accepted:
  * int (or anything with __index__): a raw address, e.g. tensor.data_ptr();
    length is then required and cannot be checked;
  * objects with data_ptr() (torch tensors): data_ptr(), nbytes, must be contiguous;
  * objects with __array_interface__ (numpy arrays): C-contiguous;
  * ctypes objects (arrays, structures, scalars): ctypes.addressof / sizeof;
    ctypes pointers and c_void_p: the address they hold;
  * the buffer protocol (bytearray, mmap, memoryview, array.array, bytes as a
    source only): contiguous.

The pin keeps the memory alive and, for buffer-protocol objects, holds a
buffer export, so a bytearray cannot be resized nor an mmap closed under a
transfer or a registration. Release it with pin.release() (or drop it).
"""

import ctypes
import operator

from . import errors

# ---- Py_buffer via the C API: works for read-only exporters too (bytes).
class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.py_object),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_PyBUF_SIMPLE = 0
_PyBUF_WRITABLE = 1
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


class Pin:
    """Keeps a buffer's memory alive (and exported) until released."""

    __slots__ = ("obj", "_view")

    def __init__(self, obj, view=None):
        self.obj = obj
        self._view = view

    def release(self):
        if self._view is not None:
            view, self._view = self._view, None
            _release_buffer(ctypes.byref(view))
        self.obj = None

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


def _bad(msg):
    errors.fail(errors.CODES["INVALID_ARGUMENT"], "INVALID_ARGUMENT (-1): " + msg)


def _want_len(length, have, what):
    if length is None:
        return have
    length = operator.index(length)
    if length < 0:
        _bad("negative length %d" % length)
    if length > have:
        _bad("length %d exceeds the %d bytes of the %s passed" % (length, have, what))
    return length


# The common base of every ctypes type (not exported under a public name).
_CDATA = next(c for c in ctypes.c_int.__mro__ if c.__name__ == "_CData")
_CTYPES_POINTERS = (ctypes._Pointer, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_wchar_p)


def _is_int(obj):
    """ints, numpy integer scalars (np.uint64(addr)) and other integer types."""
    if isinstance(obj, bool):
        return False
    if isinstance(obj, int):
        return True
    return (hasattr(obj, "__index__") and not isinstance(obj, _CDATA)
            and getattr(obj, "ndim", 0) == 0)


def _check_addr(addr, what):
    if addr < 0 or addr >= 1 << 64:
        _bad("%s address %#x is outside the address space" % (what, addr))
    return addr


def remote_address(v, what="peer address"):
    """A peer-side address: an int in [0, 2**64)."""
    if not _is_int(v):
        _bad("%s must be an int, not %s" % (what, type(v).__name__))
    return _check_addr(operator.index(v), what)


def resolve(obj, length=None, writable=False, what="buffer"):
    """(address, length, pin) for obj; raises InvalidArgument for what cannot work.

    writable: the memory will be written by Ferry (a read's destination,
    memory registered for remote writes).
    """
    if obj is None or isinstance(obj, bool):
        _bad("%s must be an address or a buffer object, not %r" % (what, obj))
    if _is_int(obj):
        addr = _check_addr(operator.index(obj), what)
        if length is None:
            _bad("%s given as a raw address needs a length" % what)
        length = operator.index(length)
        if length < 0:
            _bad("negative length %d" % length)
        if length >= 1 << 64:  # a ctypes size_t would keep only its low 64 bits
            _bad("length %d does not fit 64 bits" % length)
        return addr, length, None

    data_ptr = getattr(obj, "data_ptr", None)
    if callable(data_ptr):  # torch.Tensor and look-alikes
        is_contig = getattr(obj, "is_contiguous", None)
        if callable(is_contig) and not is_contig():
            _bad("%s tensor is not contiguous" % what)
        nbytes = getattr(obj, "nbytes", None)
        if nbytes is None and hasattr(obj, "numel") and hasattr(obj, "element_size"):
            nbytes = obj.numel() * obj.element_size()
        addr = int(data_ptr())
        if nbytes is None:
            if length is None:
                _bad("%s: cannot tell the size of %s; pass a length" % (what, type(obj).__name__))
            return addr, operator.index(length), Pin(obj)
        return addr, _want_len(length, int(nbytes), what), Pin(obj)

    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:  # numpy
        addr, readonly = ai["data"]
        flags = getattr(obj, "flags", None)
        if flags is not None and not flags["C_CONTIGUOUS"]:
            _bad("%s array is not C-contiguous" % what)
        if writable and readonly:
            _bad("%s array is read-only but would be written" % what)
        nbytes = getattr(obj, "nbytes", None)
        if nbytes is None:
            n = 1
            for d in ai["shape"]:
                n *= d
            nbytes = n * int(ai["typestr"][2:])
        return int(addr), _want_len(length, int(nbytes), what), Pin(obj)

    if isinstance(obj, _CTYPES_POINTERS):
        addr = ctypes.cast(obj, ctypes.c_void_p).value or 0
        if not addr:
            _bad("%s is a NULL pointer" % what)
        if length is None:
            _bad("%s given as a ctypes pointer needs a length" % what)
        return addr, operator.index(length), Pin(obj)

    if isinstance(obj, _CDATA):  # arrays, structures, scalars
        return ctypes.addressof(obj), _want_len(length, ctypes.sizeof(obj), what), Pin(obj)

    # The buffer protocol.
    view = _PyBuffer()
    flags = _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE
    try:
        _get_buffer(obj, ctypes.byref(view), flags)
    except (BufferError, TypeError, ValueError) as exc:
        if writable:
            try:
                memoryview(obj)
            except TypeError:
                pass
            else:
                _bad("%s %s is not writable or not contiguous (%s)" % (what, type(obj).__name__, exc))
        _bad("%s: %s is not an address nor a contiguous buffer (%s)" % (what, type(obj).__name__, exc))
    pin = Pin(obj, view)
    try:
        n = _want_len(length, view.len, what)
    except Exception:
        pin.release()
        raise
    return view.buf or 0, n, pin


def address(obj):
    """The address of obj (an int stays as it is)."""
    if _is_int(obj):
        return _check_addr(operator.index(obj), "address")
    if isinstance(obj, _CTYPES_POINTERS):
        return resolve(obj, length=0)[0]
    addr, _, pin = resolve(obj)
    if pin is not None:
        pin.release()
    return addr
