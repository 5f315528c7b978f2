# SPDX-License-Identifier: Apache-2.0
"""Ferry against a real CUDA driver, with torch (run by scripts/gpu-check.sh,
which sets FERRY_LIBRARY and PYTHONPATH): torch.cuda tensors registered by
data_ptr(), moved between two processes on GPU 0 through the CUDA IPC
transport and through TCP with host staging, every byte compared on the
device, and GB/s printed beside torch's own device-to-device and
device-to-host copy rates measured in the same run; then the same by
cuda_ipc from a process whose torch allocator uses expandable segments
(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: VMM memory, cuMemCreate +
cuMemMap, exported as a file descriptor the target takes with pidfd_getfd).
Exit 0 when every check passed.

Sizes: FERRY_GPU_CHECK_MB (default 256) per transfer, FERRY_GPU_CHECK_ITERS
(default 8) timed transfers per direction and transport (TCP: a quarter)."""

import multiprocessing as mp
import os
import sys
import time

MB = int(os.environ.get("FERRY_GPU_CHECK_MB", "256"))
SIZE = MB << 20
ITERS = int(os.environ.get("FERRY_GPU_CHECK_ITERS", "8"))


def pattern(seed, n, device):
    """n bytes of seed's pseudo-random pattern, made on the device."""
    import torch
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device=device, generator=g)


def target_main(conn):
    """The peer: an engine with SIZE bytes of GPU 0 memory registered."""
    import torch
    from ferry.core import Engine, MEM_REMOTE
    dev = torch.device("cuda", 0)
    buf = torch.zeros(SIZE, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    e = Engine("127.0.0.1", 0, timeout_ms=120000)
    e.register(buf.data_ptr(), SIZE, MEM_REMOTE)
    conn.send((e.name, buf.data_ptr(), e.region_info(buf.data_ptr(), 1).kind))
    while True:
        cmd, seed, n = conn.recv()
        if cmd == "quit":
            break
        if cmd == "check":  # every byte, on the device
            conn.send(bool(torch.equal(buf[:n], pattern(seed, n, dev))))
        elif cmd == "fill":
            buf[:n].copy_(pattern(seed, n, dev))
            torch.cuda.synchronize()
            conn.send(True)
        elif cmd == "zero":
            buf.zero_()
            torch.cuda.synchronize()
            conn.send(True)
    e.close()
    conn.send("bye")


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def torch_rates():
    """torch's own copies of SIZE bytes on GPU 0: D2D, D2H pinned, D2H pageable."""
    import torch
    dev = torch.device("cuda", 0)
    a = pattern(1, SIZE, dev)
    b = torch.empty_like(a)
    pinned = torch.empty(SIZE, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(SIZE, dtype=torch.uint8)
    out = {}
    for name, dst in (("D2D", b), ("D2H pinned", pinned), ("D2H pageable", pageable)):
        dst.copy_(a)  # warm up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(ITERS):
            dst.copy_(a)
        torch.cuda.synchronize()
        out[name] = gbps(SIZE * ITERS, time.perf_counter() - t0)
    return out


def run_transport(peer, remote, conn, transport, expect, checksum=0):
    """Writes then reads SIZE bytes with one engine forced (or not) to a
    transport; checks the session's transport and every byte on the device.
    Over tcp without checksums both sides pipeline their staging (pinned
    buffers, copies overlapping the socket, docs/RDMA_AND_GPU.md); with
    checksums each slice is staged whole and copied synchronously, the
    rate to compare with."""
    import torch
    from ferry.core import Engine, MEM_LOCAL
    dev = torch.device("cuda", 0)
    failures = []
    iters = ITERS if expect == "cuda_ipc" else max(1, ITERS // 4)
    src = pattern(11, SIZE, dev)
    dst = torch.zeros(SIZE, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    e = Engine("127.0.0.1", 0, timeout_ms=120000, transport=transport, checksum=checksum)
    try:
        e.register(src.data_ptr(), SIZE, MEM_LOCAL)
        e.register(dst.data_ptr(), SIZE, MEM_LOCAL)
        kind = e.region_info(src.data_ptr(), 1).kind
        if not kind.startswith("cuda:"):
            failures.append("a torch.cuda tensor registered as %s, not cuda:N" % kind)
        e.write(peer, src.data_ptr(), remote, 1 << 20)  # opens the session
        info = e.session_info(peer)
        print("  %-8s session: %s (%s)" % (transport, info.transport, info.transport_reason))
        if info.transport != expect:
            failures.append("%s: transport %s, expected %s" % (transport, info.transport, expect))
        conn.send(("zero", 0, 0))
        conn.recv()
        t0 = time.perf_counter()
        for _ in range(iters):
            e.write(peer, src.data_ptr(), remote, SIZE)
        w = gbps(SIZE * iters, time.perf_counter() - t0)
        conn.send(("check", 11, SIZE))
        if not conn.recv():
            failures.append("%s write: the target's bytes differ" % transport)
        conn.send(("fill", 12, SIZE))
        conn.recv()
        t0 = time.perf_counter()
        for _ in range(iters):
            e.read(peer, dst.data_ptr(), remote, SIZE)
        r = gbps(SIZE * iters, time.perf_counter() - t0)
        if not torch.equal(dst, pattern(12, SIZE, dev)):
            failures.append("%s read: the bytes read differ" % transport)
        print("  %-8s write %6.2f GB/s   read %6.2f GB/s   (%d x %d MiB each way)%s"
              % (info.transport, w, r, iters, MB,
                 "  CRC32C: whole slices, not pipelined" if checksum else ""))
    finally:
        e.close()
    return failures


def vmm_info(ptr):
    """(VMM memory, shareable as a POSIX descriptor) for the device address
    ptr: cuMemRetainAllocationHandle works only for VMM memory."""
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuMemRetainAllocationHandle.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    cu.cuMemGetAllocationPropertiesFromHandle.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
    cu.cuMemRelease.argtypes = [ctypes.c_ulonglong]
    h = ctypes.c_ulonglong()
    if cu.cuMemRetainAllocationHandle(ctypes.byref(h), ctypes.c_void_p(ptr)) != 0:
        return False, False
    prop = (ctypes.c_ubyte * 64)()  # CUmemAllocationProp: type, requestedHandleTypes, ...
    rc = cu.cuMemGetAllocationPropertiesFromHandle(prop, h.value)
    cu.cuMemRelease(h.value)
    types = int.from_bytes(bytes(prop[4:8]), "little") if rc == 0 else 0
    return True, bool(types & 1)  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def vmm_main(conn, peer, remote):
    """A process whose torch allocator uses expandable segments: writes and
    reads SIZE bytes with the target by cuda_ipc, every byte checked on the
    device (the target's through the parent, which relays to it)."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    from ferry.core import Engine, MEM_LOCAL

    def target(cmd, seed, n):
        conn.send(("target", cmd, seed, n))
        return conn.recv()

    dev = torch.device("cuda", 0)
    failures = []
    src = pattern(21, SIZE, dev)
    dst = torch.zeros(SIZE, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    is_vmm, shareable = vmm_info(src.data_ptr())
    print("  vmm      expandable segments: VMM memory %s, shareable as a descriptor %s" % (is_vmm, shareable))
    if not is_vmm:
        failures.append("expandable segments: the tensor is not VMM memory (cuMemRetainAllocationHandle failed)")
    e = None
    try:
        e = Engine("127.0.0.1", 0, timeout_ms=120000)
        e.register(src.data_ptr(), SIZE, MEM_LOCAL)
        e.register(dst.data_ptr(), SIZE, MEM_LOCAL)
        e.write(peer, src.data_ptr(), remote, 1 << 20)
        info = e.session_info(peer)
        print("  vmm      session: %s (%s)" % (info.transport, info.transport_reason))
        if info.transport != "cuda_ipc":
            failures.append("VMM: transport %s, expected cuda_ipc (%s)" % (info.transport, info.transport_reason))
        target("zero", 0, 0)
        t0 = time.perf_counter()
        for _ in range(ITERS):
            e.write(peer, src.data_ptr(), remote, SIZE)
        w = gbps(SIZE * ITERS, time.perf_counter() - t0)
        if not target("check", 21, SIZE):
            failures.append("VMM write: the target's bytes differ")
        target("fill", 22, SIZE)
        t0 = time.perf_counter()
        for _ in range(ITERS):
            e.read(peer, dst.data_ptr(), remote, SIZE)
        r = gbps(SIZE * ITERS, time.perf_counter() - t0)
        if not torch.equal(dst, pattern(22, SIZE, dev)):
            failures.append("VMM read: the bytes read differ")
        print("  vmm      write %6.2f GB/s   read %6.2f GB/s   (%d x %d MiB each way; near D2D: by IPC, "
              "near D2H: the pieces went by tcp)" % (w, r, ITERS, MB))
    except Exception as ex:  # reported, not raised: the parent waits for "done"
        failures.append("VMM: %s" % ex)
    finally:
        if e is not None:
            e.close()
    conn.send(("done", failures))


def run_vmm(peer, remote, conn):
    """vmm_main in its own process (the allocator's setting is read once per
    process), its target commands relayed to the target."""
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=vmm_main, args=(there, peer, remote))
    p.start()
    try:
        while True:
            msg = here.recv()
            if msg[0] == "done":
                return msg[1]
            conn.send(msg[1:])
            here.send(conn.recv())
    except EOFError:
        return ["VMM: the expandable-segments process died (exit code %s)" % p.exitcode]
    finally:
        p.join(60)
        if p.is_alive():
            p.kill()


def main():
    import torch
    import ferry
    import ferry.engine as fe
    torch.zeros(1, device="cuda")  # this process uses CUDA: the driver is loaded
    failures = []
    ok, why = ferry.core.device_memory_supported()
    print("device_memory_supported: %s (%s)" % (ok, why))
    print("SUPPORT_CUDA: %s" % fe.SUPPORT_CUDA)
    if not ok or fe.SUPPORT_CUDA is not True:
        failures.append("device memory not supported with a real driver: " + why)
    rates = torch_rates()
    print("torch on GPU 0 (%d MiB copies): " % MB +
          ", ".join("%s %.2f GB/s" % kv for kv in rates.items()))
    ctx = mp.get_context("spawn")  # never fork a process that initialized CUDA
    here, there = ctx.Pipe()
    p = ctx.Process(target=target_main, args=(there,))
    p.start()
    try:
        peer, remote, kind = here.recv()
        print("target pid %d: %s, %d MiB of %s at %#x" % (p.pid, peer, MB, kind, remote))
        if not kind.startswith("cuda:"):
            failures.append("the target's torch.cuda tensor registered as " + kind)
        failures += run_transport(peer, remote, here, "auto", "cuda_ipc")
        failures += run_transport(peer, remote, here, "tcp", "tcp")
        failures += run_transport(peer, remote, here, "tcp", "tcp", checksum=1)
        failures += run_vmm(peer, remote, here)
        here.send(("quit", 0, 0))
        here.recv()
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
