# SPDX-License-Identifier: Apache-2.0
"""ferry.TransferEngine offers Mooncake's Python API (names, parameters, defaults),
and the parts of initialize() that need no engine behave."""

import inspect
import sys
import unittest

from _support import EnvPatch

import ferry
import ferry.engine
from ferry import errors
from ferry.engine import TransferEngine, _metadata, _split_hostname, _transport

# Method -> parameters after self, as Mooncake's pybind11 module declares them
# (mooncake-integration/transfer_engine/transfer_engine_py.cpp). Methods that
# Mooncake binds without py::arg names take positional arguments there; the
# names here are ours.
MOONCAKE = {
    "initialize": ["local_hostname", "metadata_server", "protocol", "device_name"],
    "initialize_ext": ["local_hostname", "metadata_server", "protocol", "device_name",
                       "metadata_type"],
    "get_rpc_port": [],
    "allocate_managed_buffer": ["length"],
    "free_managed_buffer": ["buffer_addr", "length"],
    "transfer_sync_write": ["target_hostname", "buffer", "peer_buffer_address", "length",
                            "transport_hint"],
    "transfer_sync_read": ["target_hostname", "buffer", "peer_buffer_address", "length",
                           "transport_hint"],
    "batch_transfer_sync_write": ["target_hostname", "buffers", "peer_buffer_addresses",
                                  "lengths", "transport_hint"],
    "batch_transfer_sync_read": ["target_hostname", "buffers", "peer_buffer_addresses",
                                 "lengths", "transport_hint"],
    "batch_transfer_async_write": ["target_hostname", "buffers", "peer_buffer_addresses",
                                   "lengths", "transport_hint"],
    "batch_transfer_async_read": ["target_hostname", "buffers", "peer_buffer_addresses",
                                  "lengths", "transport_hint"],
    "transfer_sync": ["target_hostname", "buffer", "peer_buffer_address", "length", "opcode",
                      "notify", "transport_hint"],
    "batch_transfer_sync": ["target_hostname", "buffers", "peer_buffer_addresses", "lengths",
                            "opcode", "notify", "transport_hint"],
    "batch_transfer_async": ["target_hostname", "buffers", "peer_buffer_addresses", "lengths",
                             "opcode", "transport_hint"],
    "get_batch_transfer_status": ["batch_ids"],
    "transfer_submit_write": ["target_hostname", "buffer", "peer_buffer_address", "length",
                              "transport_hint"],
    "transfer_check_status": ["batch_id"],
    "write_bytes_to_buffer": ["dest_address", "src_ptr", "length"],
    "read_bytes_from_buffer": ["source_address", "length"],
    "register_memory": ["buffer_addr", "capacity", "location"],
    "unregister_memory": ["buffer_addr"],
    "batch_register_memory": ["buffer_addresses", "capacities", "location"],
    "batch_unregister_memory": ["buffer_addresses"],
    "get_local_topology": ["device_name"],
    "get_first_buffer_address": ["segment_name"],
    "warmup_efa_segment": ["segment_name"],
    "get_notifies": [],
    "send_probe": ["peer_server_name"],
    "get_engine": [],
    "get_engine_ptr": [],
    # Mooncake binds these when built with CUDA (USE_CUDA); Ferry always has them.
    "transfer_write_on_cuda": ["target_hostname", "buffer", "peer_buffer_address", "length",
                               "stream_ptr", "transport_hint"],
    "transfer_read_on_cuda": ["target_hostname", "buffer", "peer_buffer_address", "length",
                              "stream_ptr", "transport_hint"],
    "batch_transfer_write_on_cuda": ["target_hostname", "buffers", "peer_buffer_addresses",
                                     "lengths", "stream_ptr", "transport_hint"],
    "batch_transfer_read_on_cuda": ["target_hostname", "buffers", "peer_buffer_addresses",
                                    "lengths", "stream_ptr", "transport_hint"],
}
DEFAULTS = {"transport_hint": "", "notify": None, "location": "*", "device_name": None,
            "stream_ptr": 0}


class TestSurface(unittest.TestCase):
    def test_methods_and_parameters(self):
        for name, params in MOONCAKE.items():
            m = getattr(TransferEngine, name, None)
            self.assertTrue(callable(m), name)
            sig = inspect.signature(m)
            got = [p for p in sig.parameters if p != "self"]
            self.assertEqual(got, params, name)
            for p in params:
                if p in DEFAULTS and not (name.startswith("initialize")):
                    self.assertEqual(sig.parameters[p].default, DEFAULTS[p], "%s(%s)" % (name, p))

    def test_module_level_names(self):
        m = ferry.engine
        self.assertEqual(int(m.TransferOpcode.Read), 0)
        self.assertEqual(int(m.TransferOpcode.Write), 1)
        self.assertIs(m.Read, m.TransferOpcode.Read)
        self.assertIs(TransferEngine.TransferOpcode, m.TransferOpcode)
        n = m.TransferNotify("prefill-0", "done")
        self.assertEqual((n.name, n.msg), ("prefill-0", "done"))
        self.assertEqual(m.TransferNotify(), m.TransferNotify("", ""))
        for flag in ("SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL"):
            self.assertIs(getattr(m, flag), False)
        # SUPPORT_CUDA says what the library and process can do.
        self.assertIs(m.SUPPORT_CUDA, ferry.core.device_memory_supported()[0])
        if not m.SUPPORT_CUDA:
            self.assertIn("CUDA", ferry.core.device_memory_supported()[1])
        self.assertIs(ferry.TransferEngine, TransferEngine)

    def test_mooncake_shim(self):
        saved = {k: sys.modules.get(k) for k in ("mooncake", "mooncake.engine")}
        try:
            for k in saved:
                sys.modules.pop(k, None)
            ferry.install_mooncake_shim()
            from mooncake.engine import TransferEngine as TE  # noqa: N814
            self.assertIs(TE, TransferEngine)
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v


    def test_mooncake_shim_keeps_mooncake_store(self):
        # SGLang imports mooncake.store (HiCache, MooncakeDistributedStore) beside
        # mooncake.engine: with Mooncake installed, the shim replaces only the engine.
        import os
        import tempfile
        saved = {k: sys.modules.get(k) for k in ("mooncake", "mooncake.engine", "mooncake.store")}
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "mooncake"))
            for name, text in (("__init__.py", ""), ("engine.py", "REAL = True\n"),
                               ("store.py", "class MooncakeDistributedStore:\n    pass\n")):
                with open(os.path.join(d, "mooncake", name), "w") as f:
                    f.write(text)
            sys.path.insert(0, d)
            try:
                for k in saved:
                    sys.modules.pop(k, None)
                ferry.install_mooncake_shim()
                from mooncake.engine import TransferEngine as TE  # noqa: N814
                from mooncake.store import MooncakeDistributedStore  # noqa: F401
                self.assertIs(TE, TransferEngine)
                self.assertTrue(sys.modules["mooncake.store"].__file__.startswith(d))
            finally:
                sys.path.remove(d)
                for k, v in saved.items():
                    if v is None:
                        sys.modules.pop(k, None)
                    else:
                        sys.modules[k] = v


class TestInitializeParsing(unittest.TestCase):
    def test_hostname(self):
        self.assertEqual(_split_hostname("127.0.0.1"), ("127.0.0.1", None))
        self.assertEqual(_split_hostname("127.0.0.1:17001"), ("127.0.0.1", 17001))
        self.assertEqual(_split_hostname("node-3"), ("node-3", None))
        self.assertEqual(_split_hostname("[::1]:9000"), ("::1", 9000))
        self.assertEqual(_split_hostname("[::1]"), ("::1", None))
        self.assertEqual(_split_hostname("fe80::1"), ("fe80::1", None))
        # Mooncake's Ascend form host:port:npu_N
        self.assertEqual(_split_hostname("10.0.0.1:5000:npu_3"), ("10.0.0.1", 5000))
        self.assertEqual(_split_hostname(""), (None, None))
        self.assertEqual(_split_hostname(None), (None, None))
        for bad in ("host:abc", "host:70000", "[::1]x", "[::1"):
            with self.assertRaises(ferry.InvalidArgument, msg=bad):
                _split_hostname(bad)

    def test_metadata(self):
        self.assertEqual(_metadata("P2PHANDSHAKE"), "p2p")
        self.assertEqual(_metadata(""), "p2p")
        self.assertEqual(_metadata(None), "p2p")
        self.assertEqual(_metadata("etcd://10.0.0.1:2379"), "etcd://10.0.0.1:2379")
        self.assertEqual(_metadata("redis://h:6379"), "redis://h:6379")
        self.assertEqual(_metadata("10.0.0.1:2379"), "etcd://10.0.0.1:2379")  # Mooncake default
        self.assertEqual(_metadata("h:6379", "redis"), "redis://h:6379")
        # Mooncake's HTTP metadata server: the whole URL is the address.
        self.assertEqual(_metadata("http://h:8080/metadata"), "http://h:8080/metadata")
        self.assertEqual(_metadata("h:8080/metadata", "http"), "http://h:8080/metadata")
        with self.assertRaises(ferry.FerryNotImplemented) as cm:
            _metadata("consul://h:8500")
        self.assertIn("consul", cm.exception.detail)

    def test_protocol(self):
        self.assertEqual(_transport("tcp"), "tcp")
        self.assertEqual(_transport("TCP"), "tcp")
        self.assertEqual(_transport("shm"), "shm")
        self.assertEqual(_transport("rdma"), "rdma")
        self.assertEqual(_transport(""), "auto")
        with self.assertRaises(ferry.FerryNotImplemented):
            _transport("nvlink")
        with self.assertRaises(ferry.InvalidArgument):
            _transport("carrier-pigeon")

    def test_bad_initialize_returns_codes(self):
        te = TransferEngine()
        with EnvPatch(FERRY_TRANSPORT=None, FERRY_METADATA=None):
            # Mooncake's initialize returns -1 for every failure (its own
            # test_transfer_engine_protocol.py asserts == -1); the Ferry code
            # and the reason stay in errors.last_error_code() / _detail().
            self.assertEqual(te.initialize("127.0.0.1", "P2PHANDSHAKE", "nvlink", ""), -1)
            self.assertEqual(errors.last_error_code(), errors.NOT_IMPLEMENTED)
            self.assertIn("nvlink", errors.last_error_detail())
            self.assertEqual(te.initialize("127.0.0.1:notaport", "P2PHANDSHAKE", "tcp", ""), -1)
            self.assertEqual(errors.last_error_code(), errors.INVALID_ARGUMENT)
            self.assertEqual(te.initialize("127.0.0.1", "consul://x:1", "tcp", ""), -1)
            self.assertEqual(errors.last_error_code(), errors.NOT_IMPLEMENTED)
            self.assertEqual(te.initialize("127.0.0.1", "http://x:1/a b", "tcp", ""), -1)
            self.assertEqual(errors.last_error_code(), errors.INVALID_ARGUMENT)
        strict = TransferEngine(raise_on_error=True)
        with self.assertRaises(ferry.InvalidArgument):
            strict.initialize("127.0.0.1", "P2PHANDSHAKE", "carrier-pigeon", "")

    def test_calls_before_initialize(self):
        te = TransferEngine()
        self.assertEqual(te.get_rpc_port(), errors.CONTEXT)
        self.assertEqual(te.get_session_id(), "")
        self.assertEqual(te.register_memory(0x1000, 64), errors.CONTEXT)
        self.assertEqual(te.transfer_sync_write("127.0.0.1:1", 0x1000, 0x2000, 64), errors.CONTEXT)
        self.assertIn("initialize", errors.last_error_detail())
        self.assertEqual(te.get_first_buffer_address("127.0.0.1:1"), 0)
        self.assertEqual(te.get_notifies(), [])
        self.assertEqual(te.get_engine_ptr(), 0)
        with self.assertRaises(ferry.ContextError):
            TransferEngine(raise_on_error=True).get_rpc_port()

    def test_raw_memory_helpers_need_an_engine(self):
        # They touch only memory registered with the engine: none before initialize.
        import ctypes
        te = TransferEngine()
        buf = (ctypes.c_char * 16)()
        self.assertEqual(te.write_bytes_to_buffer(ctypes.addressof(buf), b"hello", 5), errors.CONTEXT)
        self.assertEqual(te.read_bytes_from_buffer(ctypes.addressof(buf), 5), errors.CONTEXT)
        self.assertEqual(te.write_bytes_to_buffer(0, b"hello", 5), errors.CONTEXT)
        with self.assertRaises(TypeError):
            te.write_bytes_to_buffer(ctypes.addressof(buf), 12345, 5)
        with self.assertRaises(TypeError):
            te.read_bytes_from_buffer("0x1000", 5)


if __name__ == "__main__":
    unittest.main()
