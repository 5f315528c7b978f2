# SPDX-License-Identifier: Apache-2.0
"""The build backend of the ferry-transfer distribution (PEP 517), in the tree.

It writes the wheel itself (a zip with the package, a .dist-info and its
RECORD), so building needs neither setuptools nor the `wheel` package: a
`pip install --no-build-isolation` works with any interpreter that has pip,
including one where setuptools' bdist_wheel is missing ("invalid command
'bdist_wheel'", setuptools before 70.1 without `wheel` installed).

The wheel carries libferry.so (as ferry/_libs/libferry.so.<MAJOR>, its
SONAME), which ferry/_lib.py loads when neither FERRY_LIBRARY nor a system
library is found. The library comes from, in order:
  1. $FERRY_WHEEL_LIBRARY (or config setting ferry-library): a libferry.so
     file; "none" builds a pure-Python wheel that carries no library;
  2. the repository's release build, build/libferry.so.<MAJOR>, when this is a
     checkout with that build;
  3. a build of the library alone: cmake -DBUILD_TESTING=OFF in a temporary
     folder (needs cmake and a compiler, no network).
Metadata comes from pyproject.toml's [project] table (tomllib, Python 3.11+,
or tomli), the version from ferry/__init__.py.
"""

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bindings/python
REPO_ROOT = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir))
PACKAGE = "ferry"
ABI_MAJOR = 0
SONAME = "libferry.so.%d" % ABI_MAJOR


# ------------------------------------------------------------------ metadata
def _project():
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _version():
    with open(os.path.join(HERE, PACKAGE, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("no __version__ in ferry/__init__.py")
    return m.group(1)


def _dist_name(project):
    return re.sub(r"[-_.]+", "_", project["name"]).lower()


def _metadata(project, version):
    lines = ["Metadata-Version: 2.1", "Name: %s" % project["name"], "Version: %s" % version,
             "Summary: %s" % project.get("description", "")]
    lic = project.get("license", {})
    if isinstance(lic, dict) and lic.get("text"):
        lines.append("License: %s" % lic["text"])
    for c in project.get("classifiers", []):
        lines.append("Classifier: %s" % c)
    if project.get("requires-python"):
        lines.append("Requires-Python: %s" % project["requires-python"])
    for extra, reqs in sorted(project.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: %s" % extra)
        for r in reqs:
            lines.append('Requires-Dist: %s; extra == "%s"' % (r, extra))
    body = ""
    readme = project.get("readme")
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(HERE, readme), encoding="utf-8") as f:
            body = "\n" + f.read()
    return "\n".join(lines) + "\n" + body


# ------------------------------------------------------------------ library
def _library(config_settings):
    """Path of the libferry.so to carry, or None for a pure wheel."""
    choice = (config_settings or {}).get("ferry-library") or os.environ.get("FERRY_WHEEL_LIBRARY")
    if choice:
        if choice == "none":
            return None
        if not os.path.isfile(choice):
            raise RuntimeError("FERRY_WHEEL_LIBRARY=%s: no such file" % choice)
        return choice
    built = os.path.join(REPO_ROOT, "build", SONAME)
    if os.path.isfile(built):
        return built
    if not os.path.isfile(os.path.join(REPO_ROOT, "CMakeLists.txt")):
        raise RuntimeError("no libferry.so to put in the wheel: set FERRY_WHEEL_LIBRARY to one "
                           "(or to 'none' for a wheel using the system's library)")
    out = tempfile.mkdtemp(prefix="ferry-wheel-lib.")
    env = dict(os.environ)
    if shutil.which("ccache"):
        env.setdefault("CMAKE_C_COMPILER_LAUNCHER", "ccache")
    subprocess.run(["cmake", "-S", REPO_ROOT, "-B", out, "-DCMAKE_BUILD_TYPE=Release",
                    "-DBUILD_TESTING=OFF"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", out, "--target", "ferry_shared", "-j", str(os.cpu_count() or 2)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return os.path.join(out, SONAME)


def _platform_tag():
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


# ------------------------------------------------------------------ wheel
class _Wheel:
    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.record = []

    def add(self, arcname, data, mode=0o644):
        info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = (mode | 0o100000) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append("%s,sha256=%s,%d" % (arcname, digest, len(data)))

    def close(self, record_name):
        self.record.append("%s,," % record_name)
        self.zip.writestr(zipfile.ZipInfo(record_name, date_time=(1980, 1, 1, 0, 0, 0)),
                          "\n".join(self.record) + "\n")
        self.zip.close()


def _package_files():
    root = os.path.join(HERE, PACKAGE)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "_libs"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                full = os.path.join(dirpath, name)
                yield full, os.path.relpath(full, HERE).replace(os.sep, "/")


def _licence_files():
    for name in ("LICENSE", "NOTICE"):
        for d in (HERE, REPO_ROOT):
            if os.path.isfile(os.path.join(d, name)):
                yield name, os.path.join(d, name)
                break


def _build(wheel_directory, config_settings, editable):
    project, version = _project(), _version()
    dist = _dist_name(project)
    library = None if editable else _library(config_settings)
    tag = "py3-none-%s" % _platform_tag() if library else "py3-none-any"
    wheel_name = "%s-%s-%s.whl" % (dist, version, tag)
    distinfo = "%s-%s.dist-info" % (dist, version)
    w = _Wheel(os.path.join(wheel_directory, wheel_name))
    if editable:
        # the source folder on sys.path: edits take effect without reinstalling
        w.add("__editable__.%s.pth" % dist, (HERE + "\n").encode())
    else:
        for full, arc in _package_files():
            with open(full, "rb") as f:
                w.add(arc, f.read())
        if library:
            with open(library, "rb") as f:
                w.add("%s/_libs/%s" % (PACKAGE, SONAME), f.read(), mode=0o755)
    w.add(distinfo + "/METADATA", _metadata(project, version).encode())
    w.add(distinfo + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: ferry_backend\nRoot-Is-Purelib: %s\nTag: %s\n"
                                % ("false" if library else "true", tag)).encode())
    for name, path in _licence_files():
        with open(path, "rb") as f:
            w.add("%s/licenses/%s" % (distinfo, name), f.read())
    w.close(distinfo + "/RECORD")
    return wheel_name


# ------------------------------------------------------------------ PEP 517 / 660 hooks
def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(wheel_directory, config_settings, editable=False)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(wheel_directory, config_settings, editable=True)


def build_sdist(sdist_directory, config_settings=None):
    import tarfile
    project, version = _project(), _version()
    base = "%s-%s" % (_dist_name(project), version)
    path = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(path, "w:gz") as tar:
        for name in ("pyproject.toml", "README.md"):
            tar.add(os.path.join(HERE, name), arcname="%s/%s" % (base, name))
        tar.add(os.path.abspath(__file__), arcname="%s/_build/ferry_backend.py" % base)
        for full, arc in _package_files():
            tar.add(full, arcname="%s/%s" % (base, arc))
        for name, full in _licence_files():
            tar.add(full, arcname="%s/%s" % (base, name))
        meta = _metadata(project, version).encode()
        info = tarfile.TarInfo("%s/PKG-INFO" % base)
        info.size = len(meta)
        import io
        tar.addfile(info, io.BytesIO(meta))
    return os.path.basename(path)
