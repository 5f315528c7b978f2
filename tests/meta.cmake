# SPDX-License-Identifier: Apache-2.0
# test_meta talks to etcd and Redis: FERRY_TEST_ETCD / FERRY_TEST_REDIS from
# `scripts/services.sh start DIR` (source DIR/services.env before ctest).
# It also starts private servers of its own for the outage tests.
set_tests_properties(test_meta PROPERTIES LABELS "meta;services" TIMEOUT 180)
