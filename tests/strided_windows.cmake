# SPDX-License-Identifier: Apache-2.0
# Strided descriptors run window by window: the slow-link proxy comes from
# the fault helpers (fault.cmake); a million pieces take a while under the
# sanitizers.
if(TARGET test_strided_windows)
  target_link_libraries(test_strided_windows PRIVATE ferry_fault_support)
  set_tests_properties(test_strided_windows PROPERTIES TIMEOUT 900)
endif()
