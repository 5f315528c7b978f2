# SPDX-License-Identifier: Apache-2.0
"""The ctypes structures match <ferry/ferry.h>: sizes and offsets, from a C compiler."""

import ctypes
import os
import shutil
import subprocess
import tempfile
import unittest

from _support import REPO_ROOT

from ferry import _lib

STRUCTS = {
    "ferry_config_t": _lib.Config,
    "ferry_segment_t": _lib.Segment,
    "ferry_peer_info_t": _lib.PeerInfo,
    "ferry_request_t": _lib.Request,
    "ferry_strided_t": _lib.Strided,
    "ferry_status_t": _lib.Status,
    "ferry_notification_t": _lib.Notification,
    "ferry_peer_metrics_t": _lib.PeerMetrics,
    "ferry_region_info_t": _lib.RegionInfo,
}

CONSTANTS = ["FERRY_MEM_LOCAL", "FERRY_MEM_REMOTE_READ", "FERRY_MEM_REMOTE_WRITE",
             "FERRY_MEM_REMOTE", "FERRY_OP_READ", "FERRY_OP_WRITE", "FERRY_STATUS_WAITING",
             "FERRY_STATUS_PENDING", "FERRY_STATUS_COMPLETED", "FERRY_STATUS_FAILED",
             "FERRY_STATUS_CANCELLED", "FERRY_STATUS_TIMEOUT", "FERRY_LATENCY_BUCKETS",
             "FERRY_METRICS_MAX_CODES"]


def c_compiler():
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


@unittest.skipUnless(c_compiler(), "no C compiler")
class TestLayout(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <ferry/ferry.h>",
                 "int main(void) {"]
        for cname, py in STRUCTS.items():
            lines.append('printf("%s size %%zu\\n", sizeof(%s));' % (cname, cname))
            for f in py._fields_:
                lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));'
                             % (cname, f[0], cname, f[0]))
        for c in CONSTANTS:
            lines.append('printf("const %s %%d\\n", (int)(%s));' % (c, c))
        lines += ["return 0;", "}"]
        cls.tmp = tempfile.mkdtemp(prefix="ferry-layout-")
        src = os.path.join(cls.tmp, "layout.c")
        exe = os.path.join(cls.tmp, "layout")
        with open(src, "w") as f:
            f.write("\n".join(lines))
        subprocess.run([c_compiler(), "-std=c11", "-I", os.path.join(REPO_ROOT, "include"),
                        src, "-o", exe], check=True, capture_output=True, timeout=120)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
        cls.c = {}
        for line in out.splitlines():
            a, b, v = line.split()
            cls.c[(a, b)] = int(v)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_structs(self):
        for cname, py in STRUCTS.items():
            self.assertEqual(ctypes.sizeof(py), self.c[(cname, "size")], cname)
            for f in py._fields_:
                self.assertEqual(getattr(py, f[0]).offset, self.c[(cname, f[0])],
                                 "%s.%s" % (cname, f[0]))

    def test_constants(self):
        import ferry
        py = {"FERRY_MEM_LOCAL": ferry.MEM_LOCAL, "FERRY_MEM_REMOTE_READ": ferry.MEM_REMOTE_READ,
              "FERRY_MEM_REMOTE_WRITE": ferry.MEM_REMOTE_WRITE,
              "FERRY_MEM_REMOTE": ferry.MEM_REMOTE, "FERRY_OP_READ": ferry.READ,
              "FERRY_OP_WRITE": ferry.WRITE}
        py["FERRY_LATENCY_BUCKETS"] = _lib.LATENCY_BUCKETS
        py["FERRY_METRICS_MAX_CODES"] = len(_lib.PeerMetrics().error_codes)
        for name, st in ferry.STATUS_NAMES.items():
            py["FERRY_STATUS_" + st] = name
        for c in CONSTANTS:
            self.assertEqual(py[c], self.c[("const", c)], c)


if __name__ == "__main__":
    unittest.main()
