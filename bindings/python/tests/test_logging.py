# SPDX-License-Identifier: Apache-2.0
"""Library messages reach Python's logging (logger "ferry", levels mapped)
through ferry_log_set_handler, and route_logging(False) gives stderr back."""

import logging
import unittest

from _support import requires_engine

import ferry

FAST = dict(timeout_ms=5000, connect_timeout_ms=2000, host="127.0.0.1", port=0)


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=1)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@requires_engine
class LoggingRoute(unittest.TestCase):
    def setUp(self):
        self.cap = Capture()
        self.logger = logging.getLogger("ferry")
        self.logger.addHandler(self.cap)
        self.old_level = self.logger.level
        self.logger.setLevel(1)

    def tearDown(self):
        self.logger.removeHandler(self.cap)
        self.logger.setLevel(self.old_level)
        ferry.route_logging(True)

    def forced_rdma_session(self):
        # A transport forced but unusable here (no RDMA device in loopback
        # tests) is a library warning: "rdma forced but unusable (...)".
        target = ferry.Engine(env=False, **FAST)
        initiator = ferry.Engine(env=False, transport="rdma", **FAST)
        try:
            initiator.open_session(target.name)
            return initiator.session_info(target.name)
        finally:
            initiator.close()
            target.close()

    def test_warning_reaches_logger(self):
        info = self.forced_rdma_session()
        if "forced" not in str(info):
            self.skipTest("RDMA is usable here: no fallback warning to route")
        warned = [r for r in self.cap.records if "forced but unusable" in r.getMessage()]
        self.assertTrue(warned, [r.getMessage() for r in self.cap.records])
        r = warned[0]
        self.assertEqual(r.name, "ferry")
        self.assertEqual(r.levelno, logging.WARNING)
        self.assertEqual(r.ferry_component, "transport")
        self.assertTrue(r.getMessage().startswith("transport: "))

    def test_route_off_restores_stderr(self):
        self.assertTrue(ferry.route_logging(False))
        self.forced_rdma_session()
        self.assertFalse([r for r in self.cap.records if "forced but unusable" in r.getMessage()])

    def test_levels_mapped(self):
        from ferry import _logging
        self.assertEqual([_logging._LEVELS[i] for i in range(5)],
                         [logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG, _logging.TRACE])


if __name__ == "__main__":
    unittest.main()
