# SPDX-License-Identifier: Apache-2.0
"""Shared helpers for the binding's tests (stdlib unittest only).

Run: /usr/bin/python3 -m unittest discover -s bindings/python/tests -v
The library is found as the package finds it ($FERRY_LIBRARY, build dirs).
"""

import os
import sys
import unittest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PY_DIR = os.path.dirname(TESTS_DIR)
REPO_ROOT = os.path.dirname(os.path.dirname(PY_DIR))
if PY_DIR not in sys.path:
    sys.path.insert(0, PY_DIR)

import ferry  # noqa: E402
from ferry import _lib  # noqa: E402

import _engine_switch  # noqa: E402  (FERRY_DIFF_ENGINE: the differential run's engine switch)

_engine_switch.install()

try:
    import numpy  # noqa: F401
    HAVE_NUMPY = True
except ImportError:
    HAVE_NUMPY = False

requires_numpy = unittest.skipUnless(HAVE_NUMPY, "numpy is not installed for this interpreter")

ENGINE_SOURCE = os.path.join(REPO_ROOT, "src", "serve", "engine.c")


def engine_in_library():
    return _lib.has("ferry_engine_create")


def requires_engine(obj):
    """Skips before the engine exists in the tree; once src/serve/engine.c exists, a
    library without the engine is a stale build and the tests fail instead."""
    if engine_in_library():
        return obj
    if os.path.exists(ENGINE_SOURCE):
        def fail(self):
            self.fail("%s lacks ferry_engine_create although %s exists: rebuild the library"
                      % (_lib.path(), ENGINE_SOURCE))
        if isinstance(obj, type):
            obj.setUpClass = classmethod(lambda cls: None)
            for name in list(vars(obj)):
                if name.startswith("test"):
                    setattr(obj, name, fail)
            return obj
        return fail
    return unittest.skip("libferry.so has no engine yet (%s absent)" % ENGINE_SOURCE)(obj)


def peer_env(**extra):
    """Environment for a peer subprocess: same library, same package path."""
    env = dict(os.environ)
    env["FERRY_LIBRARY"] = _lib.path()
    env["PYTHONPATH"] = PY_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


class EnvPatch:
    """Sets environment variables for a with-block, restoring them after."""

    def __init__(self, **values):
        self.values = values
        self.saved = {}

    def __enter__(self):
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
