# SPDX-License-Identifier: Apache-2.0
# test_tcp_vec: the raw-peer helpers, to trickle a WRITEV by hand.
if(TARGET test_tcp_vec)
  target_link_libraries(test_tcp_vec PRIVATE ferry_fault_support)
endif()
