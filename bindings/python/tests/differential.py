#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The drop-in checked against the original: runs the binding's sequence tests
(SGLang's, vLLM's and Mooncake's own call sequences) once against Ferry's
TransferEngine and once against the real Mooncake module (mooncake.engine
built by bench/mooncake.py build), with the same processes and checks, and
prints, call by call, where return codes, bytes read back, blocking time or
exceptions differ, then the tests whose outcome differs.

  MOONCAKE_BUILD=DIR python3 bindings/python/tests/differential.py [-k PATTERN] [--json FILE]

Needs a release libferry (FERRY_LIBRARY or build/) and Mooncake's build
(MOONCAKE_BUILD, default .baseline/mooncake; without one it says how to get
it and exits 2). Not part of make test.

How: the tests run unchanged in a child process per engine with
FERRY_DIFF_ENGINE=ferry|mooncake (_engine_switch.py: the tests' support code
hands them that engine, and records every call on it). A failed check does
not end its test here: it is recorded (file:line and message) and the test
goes on, so that the two engines' whole call sequences can be compared. A
test that crashes its process or makes no progress for --hang seconds is
recorded as such and the run goes on with the next one.

Calls are matched by (test, engine number in the test, method, k-th call of
that method on that engine). Ids, addresses and ports (allocate_managed_buffer,
get_rpc_port, batch ids, ...) are compared by sign only. Classes of difference:
  rc        one returned 0 (success), the other a failure
  code      both failed, with different codes (Ferry returns its own negative
            codes where Mooncake returns -1; the codes are Ferry's documented API)
  value     another return value differs (a status, a count, a list)
  bytes     bytes read back differ (read_bytes_from_buffer)
  exception one raised, the other did not (or another type)
  time      blocking time differs by 4x or more, and one took >= 200 ms
  only      the call was made under one engine only (the test took another path)
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
MODULES = ("test_sglang_sequences", "test_vllm_sequences", "test_mooncake_sequences", "test_mooncake_upstream")
BY_SIGN = {"get_rpc_port", "get_session_id", "allocate_managed_buffer", "allocateManagedBuffer",
           "get_first_buffer_address", "transfer_submit_write", "batch_transfer_async_write",
           "batch_transfer_async_read", "get_engine", "get_engine_ptr", "get_local_topology",
           "batch_transfer_async"}
CHECK_CAP = 3  # failed checks recorded per test and line


# ---------------------------------------------------------------- child
def child(engine, log_path, ids):
    os.environ["FERRY_DIFF_ENGINE"] = engine
    os.environ["FERRY_DIFF_LOG"] = log_path
    sys.path.insert(0, TESTS_DIR)
    import traceback
    import unittest

    import _engine_switch as sw
    import _support  # noqa: F401  (installs the engine)

    seen = {}

    def where():
        for fr in reversed(traceback.extract_stack()[:-2]):
            if fr.filename.startswith(TESTS_DIR) and not fr.filename.endswith(("differential.py",
                                                                                "_engine_switch.py")):
                return "%s:%d" % (os.path.basename(fr.filename), fr.lineno)
        return "?"

    def soft(name, fn):
        def check(self, *a, **kw):
            try:
                return fn(self, *a, **kw)
            except self.failureException as e:
                w = where()
                key = (sw._state["test"], w)
                seen[key] = seen.get(key, 0) + 1
                if seen[key] <= CHECK_CAP:
                    sw.record({"kind": "check", "test": sw._state["test"], "where": w, "k": seen[key],
                               "check": name, "msg": str(e).splitlines()[0][:200] if str(e) else ""})
                return None
        return check

    for name in dir(unittest.TestCase):
        if (name.startswith("assert") and name not in ("assertRaises", "assertRaisesRegex", "assertWarns",
                                                       "assertWarnsRegex", "assertLogs", "assertNoLogs")) \
                or name == "fail":
            setattr(unittest.TestCase, name, soft(name, getattr(unittest.TestCase, name)))

    import random
    import zlib

    class Result(unittest.TestResult):
        def startTest(self, test):
            random.seed(zlib.crc32(test.id().encode()))  # the same "random" payloads under both engines
            sw.set_test(test.id())
            sw.record({"kind": "start", "test": test.id()})
            super().startTest(test)

        def _end(self, test, outcome, msg=""):
            tid = test.id() if hasattr(test, "id") else str(test)
            sw.record({"kind": "end", "test": tid, "outcome": outcome, "msg": msg[:300]})

        def addSuccess(self, test):
            self._end(test, "ok")

        def addFailure(self, test, err):
            self._end(test, "fail", "%s: %s" % (err[0].__name__, str(err[1]).splitlines()[0] if str(err[1]) else ""))

        def addError(self, test, err):
            self._end(test, "error", "%s: %s" % (err[0].__name__, str(err[1]).splitlines()[0] if str(err[1]) else ""))

        def addSkip(self, test, reason):
            self._end(test, "skip", reason)

        def addExpectedFailure(self, test, err):
            self._end(test, "ok")

    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    wrapped = set()
    for tid in ids:
        t = loader.loadTestsFromName(tid)
        for case in t:
            cls = type(case)
            if cls not in wrapped:  # its setUpClass's calls and engines are its own
                wrapped.add(cls)
                setup = cls.__dict__.get("setUpClass")

                def scoped(c, _setup=setup, _name=cls.__module__ + "." + cls.__name__):
                    random.seed(zlib.crc32(_name.encode()))
                    sw.set_test(_name + ".setUpClass", scope=True)
                    sw.record({"kind": "start", "test": _name + ".setUpClass"})
                    try:
                        if _setup is not None:
                            _setup.__func__(c)
                        else:
                            super(c, c).setUpClass()
                    except BaseException as e:
                        sw.record({"kind": "end", "test": _name + ".setUpClass", "outcome": "error",
                                   "msg": ("%s: %s" % (type(e).__name__, e))[:300]})
                        raise
                    sw.record({"kind": "end", "test": _name + ".setUpClass", "outcome": "ok", "msg": ""})
                cls.setUpClass = classmethod(scoped)
        suite.addTest(t)
    suite.run(Result())
    sw.record({"kind": "done"})
    return 0


def list_ids(pattern):
    sys.path.insert(0, TESTS_DIR)
    import unittest
    loader = unittest.TestLoader()
    ids = []

    def walk(s):
        for t in s:
            if isinstance(t, unittest.TestSuite):
                walk(t)
            else:
                ids.append(t.id())
    for m in MODULES:
        walk(loader.loadTestsFromName(m))
    return [i for i in ids if not pattern or re.search(pattern, i)]


# ---------------------------------------------------------------- runner
def read_log(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out


def run_engine(engine, ids, env, hang_s, workdir):
    """Runs ids in children until every one has an outcome; the log's records."""
    log = os.path.join(workdir, engine + ".jsonl")
    open(log, "w").close()
    remaining = list(ids)
    while remaining:
        idfile = os.path.join(workdir, engine + ".ids")
        with open(idfile, "w") as f:
            f.write("\n".join(remaining))
        errf = open(os.path.join(workdir, engine + ".stderr"), "a")
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", engine, "--log", log,
                              "--ids", idfile], env=env, stdout=errf, stderr=errf, start_new_session=True)
        last_n, last_t, why = -1, time.monotonic(), None
        while True:
            rc = p.poll()
            recs = read_log(log)
            if len(recs) != last_n:
                last_n, last_t = len(recs), time.monotonic()
            if rc is not None:
                why = None if rc == 0 else "crashed (rc %d)" % rc
                break
            if time.monotonic() - last_t > hang_s:
                why = "hung (no call for %d s)" % hang_s
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                break
            time.sleep(0.5)
        errf.close()
        recs = read_log(log)
        ended = {r["test"] for r in recs if r["kind"] == "end"}
        started = [r["test"] for r in recs if r["kind"] == "start"]
        if why is not None and started and started[-1] not in ended:
            with open(log, "a") as f:
                f.write(json.dumps({"kind": "end", "test": started[-1], "outcome": why, "msg": ""}) + "\n")
            ended.add(started[-1])
        try:
            os.killpg(p.pid, signal.SIGKILL)  # peers it left behind
        except OSError:
            pass
        left = [i for i in remaining if i not in ended]
        if len(left) == len(remaining):  # no progress at all: give up on these
            with open(log, "a") as f:
                for i in left:
                    f.write(json.dumps({"kind": "end", "test": i, "outcome": why or "not run", "msg": ""}) + "\n")
            break
        remaining = left
    return read_log(log)


# ---------------------------------------------------------------- compare
def norm(call, v):
    if call in BY_SIGN:
        if isinstance(v, int) and not isinstance(v, bool):
            return "0" if v == 0 else (">0" if v > 0 else "<0")
        if isinstance(v, str):
            return re.sub(r"\d+", "N", v)
    return v


def classify(call, f, m):
    if (f["exc"] is None) != (m["exc"] is None) or (
            f["exc"] and m["exc"] and f["exc"].split(":")[0] != m["exc"].split(":")[0]):
        return "exception"
    a, b = norm(call, f["ret"]), norm(call, m["ret"])
    if a != b:
        if isinstance(a, dict) and isinstance(b, dict) and "sha" in a and "sha" in b:
            return "bytes"
        ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b))
        if ints and (a == 0) != (b == 0) and call not in ("transfer_check_status",):
            return "rc"
        if ints and a < 0 and b < 0:
            return "code"
        if isinstance(a, dict) and "sha" in a or isinstance(b, dict) and "sha" in b:
            return "bytes"
        return "value"
    slow, fast = max(f["ms"], m["ms"]), min(f["ms"], m["ms"])
    if slow >= 200 and slow >= 4 * max(fast, 0.01):
        return "time"
    return None


def short(v):
    s = json.dumps(v) if not isinstance(v, str) else v
    return s if len(s) <= 60 else s[:57] + "..."


def compare(rf, rm):
    def index(recs):
        calls, checks, ends = {}, {}, {}
        for r in recs:
            if r["kind"] == "call":
                calls[(r["test"], r["eng"], r["call"], r["k"])] = r
            elif r["kind"] == "check":
                checks[(r["test"], r["where"], r["k"])] = r
            elif r["kind"] == "end":
                ends[r["test"]] = r
        return calls, checks, ends
    cf, kf, ef = index(rf)
    cm, km, em = index(rm)
    rows = []
    for key in sorted(set(cf) | set(cm), key=lambda k: (k[0], k[1], k[2], k[3])):
        if key[2] == "close":  # a no-op under Mooncake; Ferry's __del__ calls it again
            continue
        f, m = cf.get(key), cm.get(key)
        if f is None or m is None:
            rows.append((key, "only", f, m))
            continue
        c = classify(key[2], f, m)
        if c:
            rows.append((key, c, f, m))
    checks = [(key, kf.get(key), km.get(key)) for key in sorted(set(kf) | set(km))]
    tests = sorted(set(ef) | set(em))
    return rows, checks, [(t, ef.get(t), em.get(t)) for t in tests]


def describe(r):
    if r is None:
        return "-"
    if r["exc"]:
        return "raised " + short(r["exc"])
    return "%s (%.0f ms)" % (short(r["ret"]), r["ms"])


def print_report(rows, checks, tests, out=sys.stdout, full=False):
    def tshort(t):
        return t.replace("test_", "").replace("_sequences", "").replace("mooncake", "mc")
    counts = {}
    for _, c, _, _ in rows:
        counts[c] = counts.get(c, 0) + 1
    print("per call (ferry | mooncake; runs of the same difference on one method folded):", file=out)
    only_by_test = {}
    groups = []  # consecutive calls of one method with the same difference
    for key, c, f, m in rows:
        if c == "only" and not full:
            only_by_test.setdefault(key[0], []).append((key, f, m))
            continue
        sig = (key[0], key[1], key[2], c, None if c == "bytes" else (short(f["ret"]) if f else None,
                                                                  short(m["ret"]) if m else None))
        if groups and groups[-1][0] == sig and groups[-1][2] == key[3] - 1:
            groups[-1][2] = key[3]
            groups[-1][3] += 1
        else:
            groups.append([sig, key[3], key[3], 1, f, m])
    for sig, k0, k1, n, f, m in groups:
        ks = "#%d" % k0 if n == 1 else "#%d-%d (%d calls)" % (k0, k1, n)
        print("  %-9s %s  %s.%s%s  %s | %s" % (sig[3], tshort(sig[0]), sig[1], sig[2], ks, describe(f), describe(m)),
              file=out)
    for t, items in only_by_test.items():
        nf = sum(1 for k, f, m in items if f is not None)
        nm = sum(1 for k, f, m in items if m is not None)
        print("  only      %s  %d calls under ferry only, %d under mooncake only (first: %s)"
              % (tshort(t), nf, nm, ", ".join("%s.%s#%d" % k[1:] for k, f, m in items[:3])), file=out)
    print("\nfailed checks (a check that failed under one engine or both):", file=out)
    for key, f, m in checks:
        print("  %s  %s#%d  ferry: %s | mooncake: %s" % (tshort(key[0]), key[1], key[2],
                                                        short(f["msg"]) if f else "passed",
                                                        short(m["msg"]) if m else "passed"), file=out)
    print("\ntests (ferry | mooncake):", file=out)
    same = 0
    for t, f, m in tests:
        fo, mo = (f or {}).get("outcome", "-"), (m or {}).get("outcome", "-")
        nf = sum(1 for k, a, b in checks if k[0] == t and a)
        nm = sum(1 for k, a, b in checks if k[0] == t and b)
        if fo == mo and nf == nm == 0 and not full:
            same += 1
            continue
        print("  %-70s %s%s | %s%s" % (tshort(t), fo, " (%d checks failed)" % nf if nf else "",
                                       mo, " (%d checks failed)" % nm if nm else ""), file=out)
        for r in (f, m):
            if r and r.get("msg") and r["outcome"] not in ("ok",):
                print("      %s" % short(r["msg"]), file=out)
    print("  (%d more tests: same outcome, no failed check)" % same, file=out)
    print("\nsummary: %d tests; differing calls by class: %s" % (
        len(tests), ", ".join("%s %d" % kv for kv in sorted(counts.items())) or "none"), file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child")
    ap.add_argument("--log")
    ap.add_argument("--ids")
    ap.add_argument("-k", dest="pattern", default="", help="only test ids matching this regex")
    ap.add_argument("--hang", type=int, default=60, help="seconds without a call before a test counts as hung")
    ap.add_argument("--json", help="also save both engines' records here")
    ap.add_argument("--from", dest="from_", help="re-print the report of a saved --json file")
    ap.add_argument("--full", action="store_true", help="every differing call and every test")
    a = ap.parse_args()
    if a.child:
        with open(a.ids) as f:
            ids = [x for x in f.read().split("\n") if x]
        return child(a.child, a.log, ids)
    if a.from_:
        with open(a.from_) as f:
            d = json.load(f)
        print_report(*compare(d["ferry"], d["mooncake"]), full=a.full)
        return 0
    sys.path.insert(0, TESTS_DIR)
    import _engine_switch as sw
    if sw.mooncake_py_dir() is None:
        print("differential: no Mooncake build (MOONCAKE_BUILD=DIR, or .baseline/mooncake): "
              "bench/mooncake.py build makes one (about 10 minutes on 2 cores)", file=sys.stderr)
        return 2
    ids = list_ids(a.pattern)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(TESTS_DIR) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    workdir = tempfile.mkdtemp(prefix="ferry-diff.")
    print("differential: %d tests, ferry then mooncake (records in %s)" % (len(ids), workdir), file=sys.stderr)
    t0 = time.monotonic()
    recs = {}
    for engine in ("ferry", "mooncake"):
        recs[engine] = run_engine(engine, ids, env, a.hang, workdir)
        print("differential: %s done after %.0f s" % (engine, time.monotonic() - t0), file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f)
    print_report(*compare(recs["ferry"], recs["mooncake"]), full=a.full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
