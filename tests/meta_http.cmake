# SPDX-License-Identifier: Apache-2.0
# test_meta_http starts its own HTTP metadata server (tests/http_meta_server.py,
# Mooncake's protocol) with python3; no shared services needed.
set_tests_properties(test_meta_http PROPERTIES LABELS "meta" TIMEOUT 180)
