# SPDX-License-Identifier: Apache-2.0
"""The CUDA driver and runtime as ferry.engine asks them, through ctypes: whether an
address is device memory, and waiting on a stream. Nothing here loads or
initializes CUDA in a process that has not."""

import ctypes
import os

from ._mooncake_args import _code
from .errors import fail


_CUDA_DRIVER = []


def _cuda_driver():
    """libcuda (the driver API) if this process has loaded it already, or None.
    Never loads nor initializes CUDA: a process that did not is left as it is
    (fork-safe); asked again until found. FERRY_CUDA_DRIVER names another
    file, as for libferry (the tests' stub driver)."""
    if not _CUDA_DRIVER:
        try:
            lib = ctypes.CDLL(os.environ.get("FERRY_CUDA_DRIVER") or "libcuda.so.1",
                              mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
            lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
            lib.cuPointerGetAttribute.restype = ctypes.c_int
        except (OSError, AttributeError):
            return None
        _CUDA_DRIVER.append(lib)
    return _CUDA_DRIVER[0]


_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
_CU_MEMORYTYPE_DEVICE = 2


def _device_ordinal(addr):
    """The CUDA device whose memory addr is (device memory only: pinned host
    and managed memory are CPU-accessible), or None. Any driver error (no
    driver, not initialized in this process, an unknown pointer) is None."""
    drv = _cuda_driver()
    if drv is None:
        return None
    kind = ctypes.c_uint(0)
    if drv.cuPointerGetAttribute(ctypes.byref(kind), _CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr) != 0:
        return None
    if kind.value != _CU_MEMORYTYPE_DEVICE:
        return None
    ordinal = ctypes.c_int(-1)
    drv.cuPointerGetAttribute(ctypes.byref(ordinal), _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, addr)
    return ordinal.value


def _cuda_stream_wait(stream):
    """Waits until the work queued on a CUDA stream (0: the default stream) has
    finished, through torch when it is loaded, else the CUDA runtime library.
    A non-zero stream without CUDA in this process is NOT_IMPLEMENTED."""
    import sys
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_available():
        if stream:
            torch.cuda.ExternalStream(stream).synchronize()
        elif torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return 0
    # No CUDA driver loaded: nothing can be queued, and loading the runtime
    # here would initialize CUDA in a process that does not use it.
    rt = _cudart() if _cuda_driver() is not None else None
    if rt is None:
        if stream:
            fail(_code("NOT_IMPLEMENTED"), "NOT_IMPLEMENTED (-303): stream_ptr %#x given, but no "
                 "usable CUDA runtime in this process (no torch.cuda; no CUDA driver loaded, "
                 "libcudart missing, or without a device)" % stream)
        return 0  # no CUDA in this process: nothing can be queued on a stream
    err = rt.cudaStreamSynchronize(ctypes.c_void_p(stream))
    if err != 0:
        fail(_code("INVALID_ARGUMENT"), "INVALID_ARGUMENT (-1): cudaStreamSynchronize(%#x) "
             "failed with CUDA error %d" % (stream, err))
    return 0


_CUDART = []


def _cudart():
    if not _CUDART:
        import ctypes.util
        lib = None
        for name in (ctypes.util.find_library("cudart"), "libcudart.so", "libcudart.so.12",
                     "libcudart.so.11.0"):
            if not name:
                continue
            try:
                lib = ctypes.CDLL(name)
                lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
                lib.cudaStreamSynchronize.restype = ctypes.c_int
                break
            except (OSError, AttributeError):
                lib = None
        if lib is not None:
            # A runtime without a driver or device cannot have queued anything.
            n = ctypes.c_int(0)
            if lib.cudaGetDeviceCount(ctypes.byref(n)) != 0 or n.value <= 0:
                lib = None
        _CUDART.append(lib)
    return _CUDART[0]
