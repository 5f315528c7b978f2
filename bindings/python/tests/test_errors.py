# SPDX-License-Identifier: Apache-2.0
"""ferry.errors: the code table comes from the C library; exceptions per code."""

import ctypes
import os
import pickle
import re
import subprocess
import sys
import threading
import unittest

from _support import PY_DIR, REPO_ROOT, peer_env

import ferry
from ferry import _lib, errors


def header_table():
    """(name, value, retryable) rows of FERRY_ERROR_TABLE in <ferry/error.h>."""
    with open(os.path.join(REPO_ROOT, "include", "ferry", "error.h")) as f:
        text = f.read()
    return [(m.group(1), int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"X\((\w+),\s*(-?\d+),\s*([01]),", text)]


class TestTable(unittest.TestCase):
    def test_codes_match_header(self):
        rows = header_table()
        self.assertGreater(len(rows), 20)
        self.assertEqual(errors.CODES, {n: v for n, v, _ in rows})
        for n, v, r in rows:
            self.assertEqual(getattr(errors, n), v)
            self.assertEqual(getattr(errors, "FERRY_ERR_" + n), v)
            self.assertEqual(errors.NAMES[v], n)
            self.assertEqual(errors.retryable(v), bool(r), n)
            self.assertEqual(errors.name(v), n)

    def test_known_values(self):
        # Values shared with Mooncake's error codes.
        self.assertEqual(errors.OK, 0)
        self.assertEqual(errors.INVALID_ARGUMENT, -1)
        self.assertEqual(errors.ADDRESS_NOT_REGISTERED, -3)
        self.assertEqual(errors.MALFORMED_JSON, errors.MALFORMED_FRAME)
        self.assertEqual(errors.TIMEOUT, -400)
        self.assertTrue(errors.retryable(errors.TIMEOUT))
        self.assertFalse(errors.retryable(errors.PEER_RESTARTED))

    def test_strings_from_c(self):
        lib = _lib.lib()
        for code in errors.NAMES:
            self.assertEqual(errors.strerror(code), lib.ferry_strerror(code).decode())
            self.assertEqual(errors.advice(code), lib.ferry_error_advice(code).decode())
        self.assertEqual(errors.name(-999), "UNKNOWN")
        self.assertEqual(errors.strerror(-999), "unknown error code")
        self.assertIn("register", errors.advice(errors.ADDRESS_NOT_REGISTERED))

    def test_parse(self):
        self.assertEqual(errors.parse("TIMEOUT"), -400)
        self.assertEqual(errors.parse("ferry_err_timeout"), -400)
        self.assertEqual(errors.parse("-3"), -3)
        self.assertEqual(errors.parse(-3), -3)
        self.assertEqual(errors.parse("MALFORMED_JSON"), -103)
        self.assertIsNone(errors.parse("NO_SUCH_CODE"))
        self.assertIsNone(errors.parse("-9999"))
        self.assertIsNone(errors.parse(-9999))


class TestExceptions(unittest.TestCase):
    def test_every_code_has_a_class(self):
        for n, code in errors.CODES.items():
            if code == 0:
                continue
            cls = errors.error_class(code)
            self.assertTrue(issubclass(cls, errors.FerryError), n)
            self.assertIsNot(cls, errors.FerryError, "no Python class for %s" % n)
            # Each class sits under one category, directly below FerryError.
            cats = [c for c in cls.__mro__ if c.__base__ is errors.FerryError
                    or errors.FerryError in c.__bases__]
            self.assertTrue(cats, n)
            e = errors.FerryError.from_code(code, "detail of %s" % n)
            self.assertIsInstance(e, cls)
            self.assertEqual((e.code, e.name, e.detail, e.retryable),
                             (code, n, "detail of %s" % n, errors.retryable(code)))

    def test_categories(self):
        self.assertTrue(issubclass(ferry.PeerRestarted, ferry.FerryConnectionError))
        self.assertTrue(issubclass(ferry.PeerClosed, ferry.FerryConnectionError))
        self.assertIs(errors.error_class(errors.TIMEOUT), ferry.FerryTimeout)
        self.assertTrue(issubclass(ferry.AddressNotRegistered, ferry.AddressError))
        self.assertTrue(issubclass(ferry.OutOfBounds, ferry.AddressError))
        self.assertTrue(issubclass(ferry.InvalidArgument, ValueError))
        self.assertIs(errors.error_class(-999), errors.FerryError)

    def test_constructor_and_str(self):
        e = ferry.FerryError(-400, "TIMEOUT", "write to 127.0.0.1:1 timed out", True)
        self.assertEqual(e.code, -400)
        self.assertEqual(e.name, "TIMEOUT")
        self.assertTrue(e.retryable)
        self.assertIn("TIMEOUT (-400)", str(e))
        self.assertIn("127.0.0.1:1", str(e))
        # Defaults from the table.
        e = ferry.FerryError(-3)
        self.assertEqual(e.name, "ADDRESS_NOT_REGISTERED")
        self.assertFalse(e.retryable)
        self.assertIn(errors.strerror(-3), str(e))
        self.assertEqual(e.meaning, errors.strerror(-3))
        self.assertIn("register", e.advice)
        # The C detail already names the code: not repeated.
        e = errors.FerryError.from_code(-3, "write to x failed: ADDRESS_NOT_REGISTERED (-3): y")
        self.assertEqual(str(e).count("(-3)"), 1)

    def test_pickle(self):
        for code in (-1, -3, -400, -402, -999):
            e = errors.FerryError.from_code(code, "d")
            f = pickle.loads(pickle.dumps(e))
            self.assertIs(type(f), type(e))
            self.assertEqual((f.code, f.name, f.detail, f.retryable),
                             (e.code, e.name, e.detail, e.retryable))

    def test_check(self):
        self.assertEqual(errors.check(0), 0)
        self.assertEqual(errors.check(7), 7)
        with self.assertRaises(ferry.OutOfBounds) as cm:
            errors.check(-404, "my detail")
        self.assertEqual(cm.exception.detail, "my detail")
        self.assertEqual(errors.last_error_detail(), "my detail")
        self.assertEqual(errors.last_error_code(), -404)
        self.assertIsInstance(errors.last_error(), ferry.OutOfBounds)
        # Without a C failure on this thread, the detail is built from the table.
        errors.clear_last_error()
        self.assertEqual(errors.last_error_detail(), "")
        self.assertEqual(errors.last_error_code(), 0)
        self.assertIsNone(errors.last_error())
        with self.assertRaises(ferry.FerryTimeout) as cm:
            errors.check(-400)
        self.assertIn("TIMEOUT (-400)", cm.exception.detail)

    def test_last_error_is_per_thread(self):
        errors.clear_last_error()
        seen = {}

        def worker():
            try:
                errors.check(-3, "in the worker")
            except errors.FerryError:
                pass
            seen["detail"] = errors.last_error_detail()
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        self.assertEqual(seen["detail"], "in the worker")
        self.assertEqual(errors.last_error_detail(), "")

    def test_c_detail_reaches_python(self):
        # The C library records a failure's detail per thread; check() picks it
        # up only when its code matches the failure being reported.
        # A public call that fails in C (libferry.so exports nothing else).
        lib = _lib.lib()
        lib.ferry_register.restype = ctypes.c_int
        lib.ferry_register.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        errors.clear_last_error()
        self.assertEqual(lib.ferry_register(None, None, 64, 0), -1)
        with self.assertRaises(ferry.InvalidArgument) as cm:
            errors.check(-1)
        self.assertIn("register: engine is NULL", cm.exception.detail)
        self.assertIn("INVALID_ARGUMENT (-1)", str(cm.exception))
        with self.assertRaises(ferry.FerryTimeout) as cm:
            errors.check(-400)  # C's last error is -1: its detail is not reused
        self.assertNotIn("engine is NULL", cm.exception.detail)


class TestLoader(unittest.TestCase):
    def run_py(self, code, **env):
        e = peer_env(**env)
        if env.get("FERRY_LIBRARY") is None:
            e.pop("FERRY_LIBRARY", None)
        return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True,
                              text=True, timeout=60)

    def test_env_path_and_dir(self):
        path = _lib.path()
        r = self.run_py("import ferry; print(ferry.library_path())", FERRY_LIBRARY=path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), path)
        r = self.run_py("import ferry; print(ferry.library_path())",
                        FERRY_LIBRARY=os.path.dirname(path))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(os.path.realpath(r.stdout.strip()), os.path.realpath(path))

    def test_bad_env_is_a_clear_import_error(self):
        r = self.run_py("import ferry", FERRY_LIBRARY="/nonexistent/libferry.so")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("LibraryNotFound", r.stderr)
        self.assertIn("/nonexistent/libferry.so", r.stderr)
        self.assertIn("FERRY_LIBRARY", r.stderr)
        r = self.run_py("try:\n    import ferry\nexcept ImportError as e:\n"
                        "    print('caught', type(e).__name__)", FERRY_LIBRARY="/nonexistent/x.so")
        self.assertEqual(r.stdout.strip(), "caught LibraryNotFound", r.stderr)

    def test_build_dir_found_without_env(self):
        if not _lib.path().startswith(REPO_ROOT):
            self.skipTest("library not from the repository's build dirs")
        r = self.run_py("import ferry; print(ferry.library_path())")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.strip().startswith(os.path.join(REPO_ROOT, "build")),
                        r.stdout)

    def test_import_without_pythonpath_tweaks(self):
        r = subprocess.run([sys.executable, "-c", "import ferry, ferry.engine; "
                            "print(ferry.engine.TransferEngine.__name__)"],
                           cwd=PY_DIR, capture_output=True, text=True, timeout=60,
                           env=peer_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "TransferEngine")


if __name__ == "__main__":
    unittest.main()
