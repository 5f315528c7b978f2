# SPDX-License-Identifier: Apache-2.0
"""Library messages to Python's `logging`: the C library's log handler
(ferry_log_set_handler) is set when the library loads, so that its messages
go to the logger "ferry" instead of stderr, with levels mapped:

    Ferry   error    warn      info  debug  trace
    logging ERROR    WARNING   INFO  DEBUG  TRACE (5, below DEBUG)

Each record carries the library's component ("tcp", "shm", "meta", ...) as
`record.ferry_component`, and the message reads "component: text". The
library filters first, by FERRY_LOG / Config.log_level (warn by default):
set FERRY_LOG=3 to see debug messages at all. route_logging(False) gives
the library's own stderr lines back.
"""

import atexit
import ctypes
import logging
import threading

__all__ = ["LOGGER_NAME", "TRACE", "route_logging"]

LOGGER_NAME = "ferry"
TRACE = 5
logging.addLevelName(TRACE, "TRACE")
_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG, 4: TRACE}

_HANDLER_T = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p)
_logger = logging.getLogger(LOGGER_NAME)
_lock = threading.Lock()
_installed = None  # the ctypes callback while set (kept alive here)
_atexit_registered = False


def _deliver(level, component, message, _ctx):
    # Called on the library's threads (ctypes takes the GIL); an exception
    # must not cross back into C.
    try:
        comp = component.decode("utf-8", "replace") if component else "ferry"
        text = message.decode("utf-8", "replace") if message else ""
        py_level = _LEVELS.get(level, logging.ERROR)
        if _logger.isEnabledFor(py_level):
            _logger.log(py_level, "%s: %s", comp, text, extra={"ferry_component": comp})
    except Exception:  # noqa: BLE001 - logging must never break a transfer
        pass


_callback = _HANDLER_T(_deliver)


def _set(handle, enable):
    global _installed, _atexit_registered
    if not hasattr(handle, "ferry_log_set_handler"):
        return False  # a library older than the handler: its messages stay on stderr
    fn = handle.ferry_log_set_handler
    fn.restype = ctypes.c_int
    fn.argtypes = [_HANDLER_T, ctypes.c_void_p]
    with _lock:
        # CDLL calls release the GIL: setting waits for messages in flight,
        # which may need the GIL to finish.
        fn(_callback if enable else _HANDLER_T(), None)
        _installed = _callback if enable else None
        if enable and not _atexit_registered:
            # Before the interpreter goes, the library's threads must stop
            # calling into it.
            atexit.register(_set, handle, False)
            _atexit_registered = True
    return True


def route_logging(enable=True):
    """Routes the library's messages to logging.getLogger("ferry") (the
    default once the library loads), or with enable=False back to stderr.
    Returns False when the loaded library has no log handler (older than
    0.1's ferry_log_set_handler)."""
    from . import _lib
    return _set(_lib.lib(), enable)
