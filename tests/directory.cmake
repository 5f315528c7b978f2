# SPDX-License-Identifier: Apache-2.0
# test_directory talks to the etcd and Redis servers of scripts/services.sh
# (FERRY_TEST_ETCD / FERRY_TEST_REDIS) and starts a private redis-server.
set_tests_properties(test_directory PROPERTIES LABELS "meta;services" TIMEOUT 180)
