# SPDX-License-Identifier: Apache-2.0
# A hostile same-host peer speaking the shared-pool map protocol: raw
# frames from tests/support/fault.c.
if(TARGET test_pool_hostile)
  target_link_libraries(test_pool_hostile PRIVATE ferry_fault_support)
  set_property(TEST test_pool_hostile APPEND PROPERTY LABELS fault)
endif()
