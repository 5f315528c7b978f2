# SPDX-License-Identifier: Apache-2.0
# Strided batches (issue 11): the raw-peer helpers for the hostile compact frames.
if(TARGET test_strided)
  target_link_libraries(test_strided PRIVATE ferry_fault_support)
endif()
