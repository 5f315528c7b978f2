# SPDX-License-Identifier: Apache-2.0
# 10,000 idle connections into one engine (issue 13, item 1): raw
# handshaken connections come from the fault helpers.
if(TARGET test_idle_conns)
  target_link_libraries(test_idle_conns PRIVATE ferry_fault_support)
  set_property(TEST test_idle_conns APPEND PROPERTY LABELS fault)
endif()
