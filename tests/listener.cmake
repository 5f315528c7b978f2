# SPDX-License-Identifier: Apache-2.0
# The listener's limits (issue 15, item 6) and the metrics endpoint's
# (item 7): raw rogue clients come from the fault helpers (fault.cmake).
foreach(t test_listener test_listener_fds)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE ferry_fault_support)
    set_property(TEST ${t} APPEND PROPERTY LABELS fault)
  endif()
endforeach()
