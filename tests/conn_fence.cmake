# SPDX-License-Identifier: Apache-2.0
# Whole-connection fences: the silent-link proxy comes from the fault
# helpers (fault.cmake); it and the per-request fence and cancel tests
# speak frame by frame with the raw-peer helpers (raw_send_frame, ...).
foreach(t test_conn_fence test_fences test_cancel)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE ferry_fault_support)
  endif()
endforeach()
