# SPDX-License-Identifier: Apache-2.0
# Epoch pinning (issue 20): targets restarted in child processes, as the
# fault tests do.
if(TARGET test_pin)
  target_link_libraries(test_pin PRIVATE ferry_fault_support ferry_fault_fixtures)
  add_dependencies(test_pin ferry_test_peer)
  set_property(TEST test_pin APPEND PROPERTY LABELS fault)
endif()
