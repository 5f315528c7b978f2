# SPDX-License-Identifier: Apache-2.0
"""Mooncake's HTTP metadata server as the metadata service:
initialize(..., "http://127.0.0.1:PORT/metadata", "tcp", "") works with no
code change, against tests/http_meta_server.py (Mooncake's protocol: PUT,
GET, DELETE on /metadata?key=K), started here in a thread."""

import ctypes
import os
import sys
import unittest

from _support import EnvPatch, REPO_ROOT, requires_engine

from ferry import errors
from ferry.engine import TransferEngine

sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
import http_meta_server  # noqa: E402


@requires_engine
class TestHttpMetadata(unittest.TestCase):
    def setUp(self):
        self.server = http_meta_server.serve()
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d/metadata" % self.port
        self.env = EnvPatch(FERRY_TRANSPORT=None, FERRY_METADATA=None)
        self.env.__enter__()
        self.engines = []

    def tearDown(self):
        for te in self.engines:
            te.close()
        self.env.__exit__(None, None, None)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def engine(self, url=None):
        te = TransferEngine()
        rc = te.initialize("127.0.0.1", url or self.url, "tcp", "")
        self.assertEqual(rc, 0, errors.last_error_detail())
        self.engines.append(te)
        return te

    def test_two_engines_transfer_through_it(self):
        target, initiator = self.engine(), self.engine()
        name = target.get_session_id()
        # The target published its descriptor under Ferry's key.
        self.assertIn(("ferry/v1/engines/" + name), self.server.store)
        dst = ctypes.create_string_buffer(4096)
        src = ctypes.create_string_buffer(bytes(range(256)) * 16, 4096)
        self.assertEqual(target.register_memory(ctypes.addressof(dst), 4096), 0)
        self.assertEqual(initiator.register_memory(ctypes.addressof(src), 4096), 0)
        rc = initiator.transfer_sync_write(name, ctypes.addressof(src), ctypes.addressof(dst), 4096)
        self.assertEqual(rc, 0, errors.last_error_detail())
        self.assertEqual(dst.raw, src.raw)

    def test_default_path(self):
        # "http://h:p" means Mooncake's /metadata.
        te = self.engine("http://127.0.0.1:%d" % self.port)
        self.assertIn("ferry/v1/engines/" + te.get_session_id(), self.server.store)

    def test_unknown_peer_and_server_down(self):
        initiator = self.engine()
        dst = ctypes.create_string_buffer(64)
        self.assertEqual(initiator.register_memory(ctypes.addressof(dst), 64), 0)
        rc = initiator.transfer_sync_write("127.0.0.1:1", ctypes.addressof(dst), 0x1000, 64)
        self.assertLess(rc, 0)
        self.assertIn("holds no entry", errors.last_error_detail())
        self.server.shutdown()
        self.server.server_close()
        self.server = None
        te = TransferEngine()
        self.assertEqual(te.initialize("127.0.0.1", self.url, "tcp", ""), -1)
        self.assertEqual(errors.last_error_code(), errors.METADATA)
        self.assertIn(self.url, errors.last_error_detail())

    def test_bad_urls(self):
        te = TransferEngine()
        for url in ("http://", "http://h/metadata", "http://h:0/metadata",
                    "http://127.0.0.1:1/metadata?key=x"):
            self.assertEqual(te.initialize("127.0.0.1", url, "tcp", ""), -1, url)
            self.assertEqual(errors.last_error_code(), errors.INVALID_ARGUMENT, url)


if __name__ == "__main__":
    unittest.main()
