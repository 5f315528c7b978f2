# SPDX-License-Identifier: Apache-2.0
# Peers that stall hold no serving thread past timeout_ms (issue 20, item
# 7): raw non-reading and stalling peers from the fault helpers (fault.cmake).
if(TARGET test_stall)
  target_link_libraries(test_stall PRIVATE ferry_fault_support)
  set_property(TEST test_stall APPEND PROPERTY LABELS fault)
endif()
