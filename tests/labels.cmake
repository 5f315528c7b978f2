# SPDX-License-Identifier: Apache-2.0
# Pure, single-threaded modules: TSan adds nothing there, so the TSan stage
# skips them (scripts/test.sh runs ctest -LE no-tsan).
foreach(t test_errors test_rdma_wire test_kv_coalesce test_kv_layout test_kv_notice test_kv_tp)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS no-tsan)
  endif()
endforeach()
