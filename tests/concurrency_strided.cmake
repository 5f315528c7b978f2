# Strided batches and the event loop under 8 threads: raw slow peers come
# from the fault helpers (fault.cmake).
if(TARGET test_concurrency_strided)
  target_link_libraries(test_concurrency_strided PRIVATE ferry_fault_support)
  set_tests_properties(test_concurrency_strided PROPERTIES TIMEOUT 600)
endif()
