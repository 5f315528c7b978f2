# SPDX-License-Identifier: Apache-2.0
"""Mooncake's transfer_tensor_sync_write / transfer_tensor_sync_read: a tensor
sent as a 24-byte header (int32 dtype code, int32 ndim, int32 shape[4], -1
for unused dimensions; native byte order) followed by its elements, and read
back into a new CPU tensor.

Where Ferry differs, for the data's sake: a non-contiguous tensor is sent as
its elements in order (Mooncake sends the bytes at data_ptr(), which are not
the tensor's values then), a header whose shape and dtype do not account for
exactly the bytes read is refused (None) instead of reinterpreted, and the
tensor's memory is registered only for the call unless it already is."""

import math
import mmap
import struct

from . import core, errors
from ._mooncake_args import _code
from .errors import fail

HEADER = struct.Struct("=ii4i")
HEADER_SIZE = HEADER.size  # 24
MAX_DIMS = 4

# Mooncake's dtype codes (its TensorDtype enum), then Ferry's additions.
_DTYPES = ("float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
           "int64", "uint64", "bool",
           "float16", "bfloat16")  # Ferry: 11, 12
_ITEMSIZE = {"float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2,
             "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "bool": 1, "float16": 2,
             "bfloat16": 2}


def _invalid(why):
    fail(_code("INVALID_ARGUMENT"), "INVALID_ARGUMENT (-1): " + why)


def dtype_code(dtype):
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    try:
        return _DTYPES.index(name)
    except ValueError:
        _invalid("tensor dtype %s is not one transfer_tensor_sync_write sends (%s)"
                 % (dtype, ", ".join(_DTYPES)))


def describe(tensor):
    """(tensor or its contiguous copy, header bytes, data address, data bytes)."""
    if "Tensor" not in type(tensor).__name__:
        _invalid("transfer_tensor_sync_write needs a torch.Tensor, not %s" % type(tensor).__name__)
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()  # its elements in order, not the strided storage
    code = dtype_code(tensor.dtype)
    shape = [int(d) for d in tuple(tensor.shape)]
    if len(shape) > MAX_DIMS:
        _invalid("tensor has %d dimensions; at most %d are sent" % (len(shape), MAX_DIMS))
    nbytes = int(tensor.numel()) * int(tensor.element_size())
    header = HEADER.pack(code, len(shape), *(shape + [-1] * (MAX_DIMS - len(shape))))
    return tensor, header, int(tensor.data_ptr()), nbytes


def parse(header, payload_len):
    """(dtype name, shape) from a header read back, checked against the bytes read."""
    code, ndim, *dims = HEADER.unpack(header)
    if not 0 <= code < len(_DTYPES):
        _invalid("tensor header: unknown dtype code %d" % code)
    if not 0 <= ndim <= MAX_DIMS:
        _invalid("tensor header: %d dimensions" % ndim)
    shape = dims[:ndim]
    if any(d < 0 for d in shape):
        _invalid("tensor header: negative dimension in %r" % (shape,))
    name = _DTYPES[code]
    want = math.prod(shape) * _ITEMSIZE[name]
    if want != payload_len:
        _invalid("tensor header: %s %r is %d bytes but %d follow it (total_size %d)"
                 % (name, tuple(shape), want, payload_len, payload_len + HEADER_SIZE))
    return name, shape


def build(name, shape, payload):
    try:
        import torch
    except ImportError:
        fail(_code("NOT_IMPLEMENTED"), "NOT_IMPLEMENTED (-303): transfer_tensor_sync_read "
             "returns a torch.Tensor and torch is not installed")
    dtype = getattr(torch, name)
    if not payload:
        return torch.empty(tuple(shape), dtype=dtype)
    return torch.frombuffer(bytearray(payload), dtype=dtype).reshape(tuple(shape))


class Staging:
    """A registered anonymous mapping of n bytes, for the duration of a call."""

    def __init__(self, eng, n):
        self.eng = eng
        self.mm = mmap.mmap(-1, max(n, 1))
        try:
            self.addr = eng.register(self.mm, max(n, 1), core.MEM_LOCAL)
        except BaseException:
            self.mm.close()
            raise

    def close(self):
        try:
            self.eng.deregister(self.addr)
        except errors.FerryError:
            pass
        self.mm.close()


def register_for_call(eng, addr, n):
    """Registers [addr, addr+n) unless this engine has it registered already;
    True when it was registered here (the caller deregisters it)."""
    if n == 0:
        return False
    try:
        eng.region_info(addr, n)
        return False
    except errors.FerryError:
        pass
    eng.register(addr, n, core.MEM_LOCAL)
    return True
