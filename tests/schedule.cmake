# SPDX-License-Identifier: Apache-2.0
# How ctest -j (scripts/test.sh: CTEST_JOBS, 2) schedules the suite.
# COST: a clean clone has no Testing/Temporary/CTestCostData.txt, so ctest
# would start tests in name order and could leave the longest for last, alone
# on one core; these estimates (seconds under ASan, 2 cores) start the long
# ones first. Tests that must have the machine to themselves say RUN_SERIAL
# where they are defined (test_netns, cluster_*) or below.
set(_ferry_test_costs
  explore 100 explore_shm 70 python_bindings 47 test_hostile_evloop 25 test_meta 11 install_staging 11
  python_package 8 cli_bench 8 test_netns 8 cli 6 test_directory 6 test_destroy 6)
while(_ferry_test_costs)
  list(POP_FRONT _ferry_test_costs _name _cost)
  if(TEST ${_name})
    set_tests_properties(${_name} PROPERTIES COST ${_cost})
  endif()
endwhile()

# Timing-sensitive: each failed once under ctest -j2 at load 15 and passed
# when rerun, so each runs alone (flaky is worse than slow):
# test_fences needs its delay proxy's link to still hold over 1 MiB of a
# write when the write returns (TSan beside test_cancel: two of its tests
# lost that precondition; alone 24 s, passed); test_strided_windows'
# deadline_across_windows runs on 600 ms deadlines (TSan beside
# test_transfer_tcp: another code than TIMEOUT; rerun: passed);
# test_listener_fds measures
# the listener's CPU share and its refusals over fixed windows (ASan: no
# refusal counted; alone 3 of 3 passed); test_conn_fence's fence of 10,000
# pieces (TSan in CI: no answer within 3 s, 10,000 pieces unconfirmed).
foreach(t test_fences test_strided_windows test_listener_fds test_conn_fence)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES RUN_SERIAL TRUE)
  endif()
endforeach()
