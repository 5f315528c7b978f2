# SPDX-License-Identifier: Apache-2.0
# Forks target processes after the initiator's engine threads exist (the
# peer restart case), which TSan does not support; the threaded mapped path
# runs under TSan in test_pool (shared_pool_round_trip_and_revoke: two
# engines in one process).
set_tests_properties(test_shm_pool PROPERTIES LABELS no-tsan)
