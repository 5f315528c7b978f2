# SPDX-License-Identifier: Apache-2.0
# Hostile input against the event loop's incremental parsing: the raw-peer
# helpers (fault.cmake).
if(TARGET test_hostile_evloop)
  target_link_libraries(test_hostile_evloop PRIVATE ferry_fault_support)
  set_property(TEST test_hostile_evloop APPEND PROPERTY LABELS fault)
endif()
