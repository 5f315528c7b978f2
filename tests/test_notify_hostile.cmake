# SPDX-License-Identifier: Apache-2.0
# Lying and flooding notification senders: raw frames from tests/support/fault.c.
if(TARGET test_notify_hostile)
  target_link_libraries(test_notify_hostile PRIVATE ferry_fault_support)
  set_property(TEST test_notify_hostile APPEND PROPERTY LABELS fault)
endif()
