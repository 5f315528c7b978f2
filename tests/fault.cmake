# SPDX-License-Identifier: Apache-2.0
# Fault, security and fuzz tests (issue 4): helpers shared by them, the
# target-in-a-child-process program, and per-test properties.
add_library(ferry_fault_support STATIC ${CMAKE_CURRENT_SOURCE_DIR}/support/fault.c)
target_include_directories(ferry_fault_support PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/support
                                               PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(ferry_fault_support PUBLIC ferry Threads::Threads)
# The set-ups those tests share (fixtures.h), on top of fault.c and the harness.
add_library(ferry_fault_fixtures STATIC ${CMAKE_CURRENT_SOURCE_DIR}/support/fixtures.c)
target_include_directories(ferry_fault_fixtures PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(ferry_fault_fixtures PUBLIC ferry_fault_support ferry_harness)

add_executable(ferry_test_peer ${CMAKE_CURRENT_SOURCE_DIR}/support/peer_main.c)
target_link_libraries(ferry_test_peer PRIVATE ferry_harness ferry)

# libFuzzer targets (clang, -DFERRY_FUZZ=ON) and their replay drivers,
# which run in every build.
include(${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz.cmake)

foreach(t test_restart test_rogue test_auth test_integrity test_retry test_netns test_soak)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE ferry_fault_support)
    add_dependencies(${t} ferry_test_peer)
    set_property(TEST ${t} APPEND PROPERTY LABELS fault)
  endif()
endforeach()
foreach(t test_restart test_integrity test_retry)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE ferry_fault_fixtures)
  endif()
endforeach()
# Slow ones: bounded well under a minute each on 2 cores.
foreach(t test_netns test_soak)
  if(TARGET ${t})
    set_tests_properties(${t} PROPERTIES TIMEOUT 120 LABELS "fault;slow")
  endif()
endforeach()
# Pure, single-threaded parsing: nothing for TSan (scripts/test.sh: -LE no-tsan).
foreach(t test_wire fuzz_wire_replay)
  if(TEST ${t})
    set_property(TEST ${t} APPEND PROPERTY LABELS no-tsan)
  endif()
endforeach()
# Namespaces and nftables are machine-wide names: never two at once.
if(TARGET test_netns)
  set_tests_properties(test_netns PROPERTIES RUN_SERIAL TRUE)
endif()
