# SPDX-License-Identifier: Apache-2.0
# Exactly-once placement and target-enforced deadlines (issue 20): the
# frame-fault proxy and peer processes come from the fault helpers. The
# test's "reuser" thread reads target memory while the target writes it
# (on purpose: a decode acting on data), which TSan would report: no-tsan.
foreach(t test_exactly_once)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE ferry_fault_support ferry_fault_fixtures)
    add_dependencies(${t} ferry_test_peer)
    set_tests_properties(${t} PROPERTIES LABELS "fault;no-tsan" TIMEOUT 120)
  endif()
endforeach()
