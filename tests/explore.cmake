# SPDX-License-Identifier: Apache-2.0
# The fault explorer (issue 20, tests/explore/README.md): every scenario,
# every frame in each direction, every fault, invariants checked on the
# target's memory. ctest -R explore runs the exhaustive deterministic mode.
add_executable(ferry_explore ${CMAKE_CURRENT_SOURCE_DIR}/explore/explore.c)
target_include_directories(ferry_explore PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(ferry_explore PRIVATE ferry_fault_support ferry_harness ferry Threads::Threads)
add_dependencies(ferry_explore ferry_test_peer)
# Epoch pinning (issue 20) where this tree has it; else that invariant is
# reported "not checkable".
file(READ ${CMAKE_SOURCE_DIR}/include/ferry/ferry.h FERRY_EXPLORE_HEADER)
string(FIND "${FERRY_EXPLORE_HEADER}" "ferry_session_pin(" FERRY_EXPLORE_PIN_AT)
if(NOT FERRY_EXPLORE_PIN_AT EQUAL -1)
  target_compile_definitions(ferry_explore PRIVATE FERRY_EXPLORE_HAVE_PIN=1)
endif()
add_test(NAME explore COMMAND ferry_explore)
# About 1 min under ASan on 2 cores (2 min at load 15; --ends, as before: +40 s). One proxy and one child
# target, sequential schedules: TSan adds nothing
# (the target's watcher races with placement on purpose).
set_tests_properties(explore PROPERTIES TIMEOUT 600 LABELS "fault;slow;no-tsan"
  ENVIRONMENT "FERRY_TEST_BIN_DIR=${CMAKE_BINARY_DIR};FERRY_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
# The same over shm: CMA_* frames through the proxy (explore.c, target_host),
# the copies by cross-memory attach. About 45 s (release) to 80 s (ASan).
add_test(NAME explore_shm COMMAND ferry_explore --transport shm)
set_tests_properties(explore_shm PROPERTIES TIMEOUT 600 LABELS "fault;slow;no-tsan"
  ENVIRONMENT "FERRY_TEST_BIN_DIR=${CMAKE_BINARY_DIR};FERRY_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
