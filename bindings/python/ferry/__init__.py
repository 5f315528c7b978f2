# SPDX-License-Identifier: Apache-2.0
"""Ferry: a data transfer engine for disaggregated LLM inference (ctypes binding).

Two APIs over the same libferry.so:
  * ferry.TransferEngine (also ferry.engine.TransferEngine): Mooncake's Python
    API, returning 0 or a negative Ferry code;
  * ferry.Engine: pythonic and strict, raising ferry.FerryError subclasses.

ferry.errors has the code table (from the C library), strerror, retryable and
the calling thread's last error detail. The library is found through
$FERRY_LIBRARY, then the repository's build directories, then the system
loader, then the copy a wheel carries (ferry.library_path() says which).
"""

from . import errors
from ._lib import LibraryNotFound
from ._lib import path as library_path
from ._logging import route_logging
from .core import (CONFIG_FIELDS, MEM_LOCAL, MEM_REMOTE, MEM_REMOTE_READ, MEM_REMOTE_WRITE, READ,
                   STATUS_CANCELLED, STATUS_COMPLETED, STATUS_FAILED, STATUS_NAMES,
                   STATUS_PENDING, STATUS_TIMEOUT, STATUS_WAITING, WRITE, Batch, Engine,
                   Notification, PeerInfo, RequestStatus, Segment)
from .engine import TransferEngine, TransferNotify, TransferOpcode
from .errors import *  # noqa: F401,F403 - FerryError and its subclasses
from .errors import (FerryError, clear_last_error, last_error, last_error_code,
                     last_error_detail, retryable, strerror)

__version__ = "0.1.0"


def install_mooncake_shim():
    """Makes `from mooncake.engine import TransferEngine` give Ferry's, for
    programs (SGLang, vLLM) that import Mooncake by name. Call before they import it.
    When Mooncake itself is installed, its other modules (mooncake.store for
    SGLang's HiCache, mooncake.allocator, ...) still import from it: only
    mooncake.engine is Ferry's."""
    import importlib.util
    import sys
    import types
    from . import engine as _engine
    pkg = sys.modules.get("mooncake")
    if pkg is None:
        pkg = types.ModuleType("mooncake")
        pkg.__path__ = []
        try:
            spec = importlib.util.find_spec("mooncake")
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            pkg.__path__ = list(spec.submodule_search_locations)  # the real package's modules
        sys.modules["mooncake"] = pkg
        # `from mooncake import mooncake_vllm_adaptor` (the class's old name),
        # only where no real Mooncake package provides its own
        pkg.mooncake_vllm_adaptor = _engine.mooncake_vllm_adaptor
    pkg.engine = _engine
    sys.modules["mooncake.engine"] = _engine
    # vLLM 0.7's MooncakePipe: `import mooncake_vllm_adaptor as mva`, the
    # top-level module of Mooncake's first Python binding, unless one is installed.
    if "mooncake_vllm_adaptor" not in sys.modules:
        try:
            spec = importlib.util.find_spec("mooncake_vllm_adaptor")
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            mva = types.ModuleType("mooncake_vllm_adaptor")
            mva.mooncake_vllm_adaptor = _engine.mooncake_vllm_adaptor
            sys.modules["mooncake_vllm_adaptor"] = mva
    return _engine
