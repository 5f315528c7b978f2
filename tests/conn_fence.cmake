# Whole-connection fences: the silent-link proxy comes from the fault
# helpers (fault.cmake).
if(TARGET test_conn_fence)
  target_link_libraries(test_conn_fence PRIVATE ferry_fault_support)
endif()
