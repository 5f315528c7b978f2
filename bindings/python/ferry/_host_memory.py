# SPDX-License-Identifier: Apache-2.0
"""Mooncake's module-level allocate_host_buffer / free_host_buffer (host
memory for staging, e.g. registered afterwards with register_memory).

Mooncake allocates pinned memory and frees whatever pointer it is given. Ferry
hands out anonymous mappings (page-aligned, zeroed) and frees only its own,
once: an unknown pointer, or one freed already, is ADDRESS_NOT_REGISTERED, and
memory that a live engine still has registered is kept (ADDRESS_OVERLAPPED):
unmapping it would let a peer's write land in unmapped or reused memory.
Both are logged on the "ferry" logger and their detail is in
errors.last_error_detail(); the memory stays mapped (a leak, never a crash)."""

import ctypes
import logging
import mmap
import threading

from . import core, errors
from ._mooncake_args import _code, _int

log = logging.getLogger("ferry")

_lock = threading.Lock()
_mapped = {}  # address -> mmap


def allocate_host_buffer(size):
    """The address of size bytes of zeroed host memory; 0 for size <= 0 or on failure."""
    n = _int(size, "size")
    if n <= 0:
        errors._record(_code("INVALID_ARGUMENT"), "INVALID_ARGUMENT (-1): allocate_host_buffer "
                       "size %d: nothing allocated" % n)
        return 0
    try:
        mm = mmap.mmap(-1, n)
    except (OSError, ValueError, OverflowError) as exc:
        errors._record(_code("MEMORY"), "MEMORY: allocate_host_buffer(%d): %s" % (n, exc))
        return 0
    view = ctypes.c_char.from_buffer(mm)
    addr = ctypes.addressof(view)
    del view  # no export left: close() stays possible
    with _lock:
        _mapped[addr] = mm
    errors._record(0, "")
    return addr


def free_host_buffer(ptr):
    """Frees memory from allocate_host_buffer: 0 (also for ptr 0), or a negative
    code with the memory left as it is (see the module doc)."""
    addr = _int(ptr, "ptr")
    if addr == 0:
        errors._record(0, "")
        return 0
    with _lock:
        mm = _mapped.get(addr)
        if mm is None:
            return _refuse("ADDRESS_NOT_REGISTERED", "free_host_buffer(%#x): not an address "
                           "allocate_host_buffer returned, or freed already; nothing freed" % addr)
        hit = core.registered_anywhere(addr, len(mm))
        if hit is not None:
            return _refuse("ADDRESS_OVERLAPPED", "free_host_buffer(%#x): [%#x+%d) is still "
                           "registered with engine %s; not freed (unregister_memory first)"
                           % ((addr,) + hit[1:] + hit[:1]))
        del _mapped[addr]
    mm.close()
    errors._record(0, "")
    return 0


def _refuse(name, why):
    code = _code(name)
    detail = "%s (%d): %s" % (name, code, why)
    log.warning("ferry: %s", detail)
    errors._record(code, detail)
    return code
