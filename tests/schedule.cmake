# SPDX-License-Identifier: Apache-2.0
# How ctest -j (scripts/test.sh: CTEST_JOBS, 2) schedules the suite.
# COST: a clean clone has no Testing/Temporary/CTestCostData.txt, so ctest
# would start tests in name order and could leave the longest for last, alone
# on one core; these estimates (seconds under ASan, 2 cores) start the long
# ones first. Tests that must have the machine to themselves say RUN_SERIAL
# where they are defined (test_netns, cluster_*) or below.
set(_ferry_test_costs
  explore 100 python_bindings 47 test_hostile_evloop 25 test_meta 11 install_staging 11
  python_package 8 cli_bench 8 test_netns 8 cli 6 test_directory 6 test_destroy 6)
while(_ferry_test_costs)
  list(POP_FRONT _ferry_test_costs _name _cost)
  if(TEST ${_name})
    set_tests_properties(${_name} PROPERTIES COST ${_cost})
  endif()
endwhile()

# Needs its delay proxy's link to still hold over 1 MiB of a write when the
# write returns (the case under test), and its first write to keep its one
# connection busy: with a TSan neighbour on 2 cores neither held (ctest -j2,
# load 15: 2 of its tests failed their precondition).
if(TEST test_fences)
  set_tests_properties(test_fences PROPERTIES RUN_SERIAL TRUE)
endif()
