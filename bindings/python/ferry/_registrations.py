# SPDX-License-Identifier: Apache-2.0
"""TransferEngine's memory registration (Mooncake's register_memory,
unregister_memory, batch_register_memory, batch_unregister_memory): the count
of ranges registered again and the location checks. A mixin of
ferry.engine.TransferEngine, which keeps the helpers (_eng, _run and
_check_location, whose CUDA check the tests reach through ferry.engine)
these methods use."""

import threading

from . import _buffers, core
from ._mooncake_args import _code, _same_count, _sized
from .errors import FerryError, fail


class MemoryRegistrations:
    # Exactly the same range registered again (same address and length) is
    # counted, not refused: it stays registered until as many unregister
    # calls. SGLang registers an embedding per /send call when it has no
    # shared registration, and two decoder TP ranks' /send calls for one
    # request run in threads: the second registration overlapped the first,
    # the first call's deregistration then took the region from under the
    # second's transfer, and that refusal's code is ignored there (silent
    # loss). Mooncake refuses the duplicate (ERR_ADDRESS_OVERLAPPED); a range
    # that only overlaps is still refused here. See the binding README.
    def register_memory(self, buffer_addr, capacity, location="*"):
        """Registers [buffer_addr, +capacity) as remote-accessible. 0 or a negative code.
        buffer_addr: an int or a buffer object. The library tells device from host
        memory itself; a location that names the other kind ("cuda:0" for memory
        taken as host memory, "cpu" for device memory) is refused (see _check_location).
        The very same range registered again is counted (see above)."""
        def go():
            eng = self._eng()
            with _registry_lock(eng):
                if _hold_again(eng, [buffer_addr], [capacity]) is not None:
                    return 0
                addr = eng.register(buffer_addr, capacity, core.MEM_REMOTE)
                _registered(eng, [addr], [capacity])
                self._check_location(eng, [addr], location)
            return 0
        return self._run(go)

    def unregister_memory(self, buffer_addr):
        """0, or a negative code. A range registered n times is deregistered by the n-th call."""
        def go():
            eng = self._eng()
            with _registry_lock(eng):
                if not _release_hold(eng, buffer_addr):
                    try:
                        eng.deregister(buffer_addr)
                    finally:
                        _forget_gone(eng, [buffer_addr])
            return 0
        return self._run(go)

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        """All or nothing, as Mooncake: 0, or a negative code with none registered.
        Entries that repeat a registered range exactly are counted (see above)."""
        def go():
            eng = self._eng()
            addrs, caps = _sized(buffer_addresses), _sized(capacities)
            _same_count(("buffer_addresses", "capacities"), (addrs, caps))
            with _registry_lock(eng):
                held = _hold_again(eng, addrs, caps)
                if held is None:
                    held = {}
                elif len(held) == len(addrs):
                    return 0
                else:
                    keep = [i for i in range(len(addrs)) if i not in held]
                    addrs, caps = [addrs[i] for i in keep], [caps[i] for i in keep]
                try:
                    new = eng.register_batch(addrs, caps, core.MEM_REMOTE)
                    _registered(eng, new, caps)
                    self._check_location(eng, new, location)
                except BaseException:
                    for a in held.values():
                        _release_hold(eng, a)
                    raise
            return 0
        return self._run(go)

    @staticmethod
    def _check_named_location(eng, addrs, location):
        """Mooncake's location ("cuda:0", "cpu:0", "*"): "*" lets the library
        decide. One naming the other kind than the library found fails loudly
        (the regions are deregistered): device memory taken as host memory would
        be touched by the CPU, a crash or garbage far from here."""
        loc = (location or "*").strip().lower() if isinstance(location, str) else "*"
        want_device = loc.startswith(("cuda", "gpu"))
        want_host = loc.startswith(("cpu", "host"))
        if not (want_device or want_host):
            return
        for a in addrs:
            info = eng.region_info(a)
            if want_device == (info.device >= 0):
                continue
            _deregister_all(eng, addrs)
            if want_device:
                ok, why = core.device_memory_supported()
                fail(_code("NOT_IMPLEMENTED") if not ok else _code("INVALID_ARGUMENT"),
                     "%s: location %r names device memory but [%#x+%d) was registered as host "
                     "memory (%s); not registered" % (
                         "NOT_IMPLEMENTED (-303)" if not ok else "INVALID_ARGUMENT (-1)",
                         location, info.addr, info.len,
                         why if not ok else "CUDA does not know this pointer"))
            fail(_code("INVALID_ARGUMENT"), "INVALID_ARGUMENT (-1): location %r names host memory "
                 "but [%#x+%d) is device memory (%s); not registered"
                 % (location, info.addr, info.len, info.kind))

    def batch_unregister_memory(self, buffer_addresses):
        """0, or the first failure (every entry processed). Counted ranges lose one count."""
        def go():
            eng = self._eng()
            addrs = _sized(buffer_addresses)
            with _registry_lock(eng):
                rest = [a for a in addrs if not _release_hold(eng, a)] if _holds(eng) else addrs
                if len(rest):
                    try:
                        eng.deregister_batch(rest)
                    finally:
                        _forget_gone(eng, rest)
            return 0
        return self._run(go)


# ------------------------------------------------- repeated registrations
# Per ferry.Engine (TransferEngine views of one engine share them): the extra
# registrations of a range, {address: count beyond the first}, and a lock
# that makes "is it registered, with this length" and the registration one step.
_REGISTRY_GUARD = threading.Lock()


def _registry_lock(eng):
    lock = getattr(eng, "_mooncake_registry_lock", None)
    if lock is None:
        with _REGISTRY_GUARD:
            lock = getattr(eng, "_mooncake_registry_lock", None)
            if lock is None:
                eng._mooncake_holds = {}
                eng._mooncake_ranges = {}
                lock = eng._mooncake_registry_lock = threading.Lock()
    return lock


def _holds(eng):
    return eng._mooncake_holds


def _registered(eng, addrs, caps):
    """Notes ranges just registered through register_memory / batch_register_memory:
    only those are counted when registered again (not a transfer's local-only
    registration, a managed or staging buffer). Caller holds _registry_lock."""
    for a, n in zip(addrs, caps):
        a = int(a)
        eng._mooncake_ranges[a] = int(n)
        _holds(eng).pop(a, None)  # a count left by a range freed another way


def _forget_gone(eng, addrs):
    """Drops the notes of ranges no longer registered. Caller holds _registry_lock."""
    ranges = eng._mooncake_ranges
    if not ranges:
        return
    with eng._lock:
        for a in addrs:
            if not isinstance(a, bool) and _buffers._is_int(a) and int(a) not in eng._regions:
                ranges.pop(int(a), None)


def _hold_again(eng, addrs, caps):
    """For the entries (int address, int length) that repeat a range registered
    through eng exactly: counts them and returns {index: address}; None when
    there are none. Caller holds _registry_lock."""
    if len(addrs) != len(caps) or not len(addrs):
        return None  # the library reports a mismatch
    ranges = eng._mooncake_ranges
    if not ranges:
        return None
    held, seen = {}, set()
    with eng._lock:
        regions = eng._regions
        for i, (a, n) in enumerate(zip(addrs, caps)):
            if isinstance(a, bool) or isinstance(n, bool) or not (_buffers._is_int(a)
                                                                  and _buffers._is_int(n)):
                continue
            a, n = int(a), int(n)
            ent = regions.get(a)
            if (n > 0 and ranges.get(a) == n and ent is not None and ent[0] == n
                    and a not in seen):
                held[i] = a
                seen.add(a)
    holds = _holds(eng)
    for a in held.values():
        holds[a] = holds.get(a, 0) + 1
    return held or None


def _release_hold(eng, addr):
    """True when addr had a repeated registration, now one fewer (nothing
    deregistered). Caller holds _registry_lock."""
    holds = _holds(eng)
    if not holds or isinstance(addr, bool) or not _buffers._is_int(addr):
        return False
    a = int(addr)
    n = holds.get(a, 0)
    if n == 0:
        return False
    with eng._lock:
        gone = a not in eng._regions  # deregistered another way (free_managed_buffer, ferry.Engine)
    if gone:
        del holds[a]
        return False
    if n == 1:
        del holds[a]
    else:
        holds[a] = n - 1
    return True


def _deregister_all(eng, addrs):
    for a in addrs:
        try:
            eng.deregister(a)
        except FerryError:
            pass
