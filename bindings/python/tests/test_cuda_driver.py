# SPDX-License-Identifier: Apache-2.0
"""CUDA device memory through libferry's driver-API path, with no GPU: the C
tests' stub driver (tests/support/cuda_stub.c, built next to libferry.so as
tests/libcuda_stub.so) loaded as an application loads libcuda.so.1. Runs in
a child interpreter: the driver a process uses is chosen once per process."""

import os
import subprocess
import sys
import unittest

from _support import PY_DIR, requires_engine

from ferry import _lib

CHILD = r'''
import ctypes, os, random, sys
import ferry, ferry.engine as fe
from ferry import errors
from ferry.engine import TransferEngine

# No CUDA in this process yet: host memory only, and why.
ok, why = ferry.core.device_memory_supported()
assert not ok and "is not loaded in this process" in why, why
assert fe.SUPPORT_CUDA is False

# The application starts using CUDA (here: loads the stub driver).
stub = ctypes.CDLL(os.environ["FERRY_CUDA_DRIVER"], mode=os.RTLD_GLOBAL)
stub.cuda_stub_alloc.restype = ctypes.c_void_p
stub.cuda_stub_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
stub.cuda_stub_alias.restype = ctypes.c_void_p
stub.cuda_stub_alias.argtypes = [ctypes.c_void_p]
assert fe.SUPPORT_CUDA is True, ferry.core.device_memory_supported()

p, d = TransferEngine(), TransferEngine()
assert p.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
assert d.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
n = 1 << 18
g = stub.cuda_stub_alloc(n, 1, 0)  # "device 1" memory the CPU cannot touch
h = stub.cuda_stub_alloc(n, 0, 0)
data = random.Random(7).randbytes(n)
ctypes.memmove(stub.cuda_stub_alias(g), data, n)
assert p.register_memory(g, n) == 0, errors.last_error_detail()
assert p.engine.region_info(g, 64).kind == "cuda:1"
assert d.register_memory(h, n, "cuda:0") == 0, errors.last_error_detail()
sid = d.get_session_id()
assert p.transfer_sync_write(sid, g, h, n) == 0, errors.last_error_detail()
assert ctypes.string_at(stub.cuda_stub_alias(h), n) == data
ctypes.memset(stub.cuda_stub_alias(g), 0, n)
assert p.transfer_read_on_cuda(sid, g, h, n) == 0, errors.last_error_detail()
assert ctypes.string_at(stub.cuda_stub_alias(g), n) == data
# Host memory named as device memory: refused, the library can tell.
host = (ctypes.c_char * 4096)()
assert p.register_memory(ctypes.addressof(host), 4096, "cuda:0") == errors.INVALID_ARGUMENT
p.close()
d.close()
print("cuda-driver-ok")
'''

# Two processes, as two GPU workers of one host: device pointers registered
# with register_memory move by the CUDA IPC transport (the stub driver's
# handles), unchanged Mooncake-style calls.
STUB = r'''
import ctypes, os
stub = ctypes.CDLL(os.environ["FERRY_CUDA_DRIVER"], mode=os.RTLD_GLOBAL)
stub.cuda_stub_alloc.restype = ctypes.c_void_p
stub.cuda_stub_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
stub.cuda_stub_alias.restype = ctypes.c_void_p
stub.cuda_stub_alias.argtypes = [ctypes.c_void_p]
'''

IPC_TARGET = STUB + r'''
import random, sys
from ferry.engine import TransferEngine
d = TransferEngine()
assert d.initialize("127.0.0.1", "P2PHANDSHAKE", "auto", "") == 0
n = 1 << 20
h = stub.cuda_stub_alloc(n, 0, 0)
assert d.register_memory(h, n) == 0
print(d.get_session_id(), h, flush=True)
sys.stdin.readline()  # the initiator wrote
ok = ctypes.string_at(stub.cuda_stub_alias(h), n) == random.Random(9).randbytes(n)
print("target-ok" if ok else "target-bytes-differ", flush=True)
sys.stdin.readline()
d.close()
'''

IPC_INITIATOR = STUB + r'''
import random, sys
from ferry import errors
from ferry.engine import TransferEngine
sid, remote = sys.argv[1], int(sys.argv[2])
p = TransferEngine()
assert p.initialize("127.0.0.1", "P2PHANDSHAKE", "auto", "") == 0
n = 1 << 20
g, back = stub.cuda_stub_alloc(n, 1, 0), stub.cuda_stub_alloc(n, 1, 0)
ctypes.memmove(stub.cuda_stub_alias(g), random.Random(9).randbytes(n), n)
assert p.batch_register_memory([g, back], [n, n]) == 0, errors.last_error_detail()
assert p.transfer_sync_write(sid, g, remote, n) == 0, errors.last_error_detail()
info = p.engine.session_info(sid)
assert info.transport == "cuda_ipc", info
assert p.transfer_sync_read(sid, back, remote, n) == 0, errors.last_error_detail()
assert ctypes.string_at(stub.cuda_stub_alias(back), n) == random.Random(9).randbytes(n)
p.close()
print("initiator-ok", info.transport)
'''


@requires_engine
class TestCudaDriver(unittest.TestCase):
    def _stub_env(self):
        lib = _lib.path() or ""
        stub = os.environ.get("FERRY_CUDA_STUB") or os.path.join(
            os.path.dirname(lib), "tests", "libcuda_stub.so")
        if not os.path.exists(stub):
            self.skipTest("no stub driver next to %s (a build with FERRY_WITH_CUDA=OFF?)" % lib)
        return dict(os.environ, FERRY_CUDA_DRIVER=stub, FERRY_LIBRARY=lib,
                    PYTHONPATH=PY_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def test_stub_driver_moves_device_memory(self):
        out = subprocess.run([sys.executable, "-c", CHILD], env=self._stub_env(),
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("cuda-driver-ok", out.stdout)

    def test_device_memory_between_processes_goes_by_cuda_ipc(self):
        env = self._stub_env()
        target = subprocess.Popen([sys.executable, "-c", IPC_TARGET], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        try:
            sid, remote = target.stdout.readline().split()
            out = subprocess.run([sys.executable, "-c", IPC_INITIATOR, sid, remote], env=env,
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            self.assertIn("initiator-ok cuda_ipc", out.stdout)
            target.stdin.write("wrote\n")
            target.stdin.flush()
            self.assertEqual(target.stdout.readline().strip(), "target-ok")
            target.stdin.write("bye\n")
            target.stdin.flush()
            self.assertEqual(target.wait(timeout=60), 0, target.stderr.read())
        finally:
            if target.poll() is None:
                target.kill()
                target.wait()
            target.stdout.close()
            target.stdin.close()
            target.stderr.close()


if __name__ == "__main__":
    unittest.main()
