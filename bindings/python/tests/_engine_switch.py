# SPDX-License-Identifier: Apache-2.0
"""Which TransferEngine the binding's tests drive, for the differential run
(differential.py): imported by _support, before any test module takes
TransferEngine by name.

  FERRY_DIFF_ENGINE unset     nothing changes: Ferry's engine, as always.
  FERRY_DIFF_ENGINE=ferry     Ferry's engine, every call recorded (FERRY_DIFF_LOG).
  FERRY_DIFF_ENGINE=mooncake  the real Mooncake module in its place: `from
                              ferry.engine import TransferEngine`,
                              ferry.install_mooncake_shim() and `from mooncake.engine
                              import ...` all give Mooncake's (found on PYTHONPATH,
                              or in $MOONCAKE_BUILD/py, or .baseline/mooncake/py).
                              Peer processes (pd_peer.py) inherit the variable.

With FERRY_DIFF_LOG=FILE every public method call on a TransferEngine of
this process is appended to FILE as a JSON line (test, engine ordinal,
method, its k-th call, arguments, result, exception, milliseconds).
"""

import hashlib
import json
import os
import sys
import threading
import time

ENGINE = os.environ.get("FERRY_DIFF_ENGINE", "")
LOG_PATH = os.environ.get("FERRY_DIFF_LOG", "")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

_lock = threading.Lock()
_state = {"test": "", "engines": 0, "counts": {}}
_depth = threading.local()  # calls a method makes on its own engine are not recorded again


def mooncake_py_dir():
    for d in (os.path.join(os.environ["MOONCAKE_BUILD"], "py") if os.environ.get("MOONCAKE_BUILD") else None,
              os.path.join(REPO_ROOT, ".baseline", "mooncake", "py")):
        if d and os.path.isdir(os.path.join(d, "mooncake")):
            return d
    return None


def import_real_mooncake():
    """The real mooncake.engine (raises ImportError where there is none)."""
    for name in ("mooncake.engine", "mooncake"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None) is None and name == "mooncake":
            del sys.modules[name]  # a shim's package, not Mooncake's
    d = mooncake_py_dir()
    if d and d not in sys.path:
        sys.path.insert(0, d)
    import mooncake.engine as real
    if "ferry" in (getattr(real, "__file__", "") or ""):
        raise ImportError("mooncake.engine is Ferry's shim, not Mooncake (%s)" % real.__file__)
    return real


def set_test(test_id, scope=False):
    """Calls from now on belong to test_id. Engines are numbered afresh in each
    test ("t1", "t2", ...) and in each class's setUpClass (scope: "c1", ...)."""
    with _lock:
        _state["test"] = test_id
        _state["counts"] = {}
        _state["engines"] = 0
        _state["prefix"] = "c" if scope else "t"


def record(entry):
    if not LOG_PATH:
        return
    line = json.dumps(entry, default=repr)
    with _lock:
        with open(LOG_PATH, "a") as f:
            f.write(line + "\n")


def summarize(v, depth=0):
    """A result or argument, short and comparable: bytes by length and digest."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        return {"bytes": len(b), "sha": hashlib.sha256(b).hexdigest()[:12]}
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v if not isinstance(v, str) or len(v) < 120 else v[:117] + "..."
    if isinstance(v, (list, tuple)):
        if len(v) > 8 or depth > 1:
            return {"list": len(v)}
        return [summarize(x, depth + 1) for x in v]
    if hasattr(v, "name") and hasattr(v, "msg"):
        return {"notify": [summarize(v.name), summarize(v.msg)]}
    return type(v).__name__


def _wrap(name, fn):
    def call(self, *args, **kwargs):
        if getattr(_depth, "n", 0):
            return fn(self, *args, **kwargs)
        with _lock:
            ordinal = self.__dict__.get("_diff_ordinal") if hasattr(self, "__dict__") else None
            if ordinal is None:
                _state["engines"] += 1
                ordinal = "%s%d" % (_state.get("prefix", "t"), _state["engines"])
                try:
                    self._diff_ordinal = ordinal
                except AttributeError:
                    pass
            key = (ordinal, name)
            k = _state["counts"].get(key, 0) + 1
            _state["counts"][key] = k
            test = _state["test"]
        t0 = time.monotonic()
        exc = None
        _depth.n = 1
        try:
            result = fn(self, *args, **kwargs)
            return result
        except BaseException as e:  # recorded, then raised as before
            exc = e
            result = None
            raise
        finally:
            _depth.n = 0
            record({"kind": "call", "test": test, "eng": ordinal, "call": name, "k": k,
                    "args": summarize(list(args)), "kw": sorted(kwargs),
                    "ret": summarize(result), "exc": None if exc is None else "%s: %s" % (type(exc).__name__, exc),
                    "ms": round((time.monotonic() - t0) * 1000, 2), "thread": threading.current_thread().name})
    call.__name__ = name
    call.__doc__ = getattr(fn, "__doc__", None)
    return call


def _host_of(local_hostname):
    """The host part of initialize's local_hostname, as SGLang's wrapper
    names the engine: "[v6]" for an IPv6 address (Mooncake's maybeWrapIpV6)."""
    h = local_hostname
    if h.startswith("["):
        return h[:h.index("]") + 1]
    if h.count(":") == 1 or (h.count(":") == 2 and ":npu_" in h):
        h = h.split(":", 1)[0]
    elif h.count(":") > 1:
        return "[%s]" % h
    return h


class _Polyfills:
    """What the tests call on an engine that Mooncake's class lacks, done as
    Mooncake's callers do it: get_session_id as SGLang's MooncakeTransferEngine
    wrapper ("host:get_rpc_port()"); close() as nothing (Mooncake's engine ends
    when the object is collected; the tests hold theirs until their end)."""

    def initialize(self, local_hostname, *a, **kw):
        self._diff_host = _host_of(local_hostname)
        return super().initialize(local_hostname, *a, **kw)

    def initialize_ext(self, local_hostname, *a, **kw):
        self._diff_host = _host_of(local_hostname)
        return super().initialize_ext(local_hostname, *a, **kw)

    def get_session_id(self):
        return "%s:%d" % (getattr(self, "_diff_host", "127.0.0.1"), self.get_rpc_port())

    def close(self):
        return None


def recorded_class(base, polyfill=False):
    """A subclass of base whose public methods record each call (where
    FERRY_DIFF_LOG is set); with polyfill, _Polyfills' methods added."""
    bases = (_Polyfills, base) if polyfill else (base,)
    if not LOG_PATH:
        return type(base.__name__, bases, {})
    attrs = {}
    probe = type("probe", bases, {})
    for name in dir(probe):
        if name.startswith("_") or name in ("engine",):
            continue
        fn = getattr(probe, name, None)
        if callable(fn) and not isinstance(fn, type):
            attrs[name] = _wrap(name, fn)
    return type(base.__name__, bases, attrs)


def mooncake_class():
    """The real mooncake.engine, its TransferEngine replaced by a recorded one
    with the polyfills (the same class for this process's tests and its peers)."""
    real = import_real_mooncake()
    if not getattr(real.TransferEngine, "_diff_wrapped", False):
        te = recorded_class(real.TransferEngine, polyfill=True)
        te._diff_wrapped = True
        real.TransferEngine = te
    return real


def install():
    """Applies FERRY_DIFF_ENGINE; returns the engine module in use (or None)."""
    if not ENGINE:
        return None
    import ferry
    import ferry.engine as fe
    if ENGINE == "mooncake":
        real = mooncake_class()
        sys.modules["mooncake.engine"] = real
        te = real.TransferEngine
        for mod in (fe, ferry):
            mod.TransferEngine = te
            mod.TransferNotify = real.TransferNotify
            mod.TransferOpcode = real.TransferOpcode
        ferry.install_mooncake_shim = lambda: real
        return real
    if ENGINE == "ferry":
        if LOG_PATH:
            te = recorded_class(fe.TransferEngine)
            fe.TransferEngine = te
            ferry.TransferEngine = te
            fe.mooncake_vllm_adaptor = te  # the old name stays the same class
        return fe
    raise RuntimeError("FERRY_DIFF_ENGINE=%r: ferry or mooncake" % ENGINE)
