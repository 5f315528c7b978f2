# SPDX-License-Identifier: Apache-2.0
# Strided batches and the event loop under 8 threads: raw slow peers come
# from the fault helpers (fault.cmake).
if(TARGET test_concurrency_strided)
  target_link_libraries(test_concurrency_strided PRIVATE ferry_fault_support)
  set_tests_properties(test_concurrency_strided PROPERTIES TIMEOUT 600)
endif()
# The same from threads over RDMA group commits, on the software HCA
# (support/rdma_fake.c, as tests/rdma.cmake); a skip without the verbs code.
if(FERRY_HAVE_RDMA AND TARGET test_concurrency_rdma)
  target_sources(test_concurrency_rdma PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support/rdma_fake.c)
  target_compile_definitions(test_concurrency_rdma PRIVATE FERRY_HAVE_RDMA=1)
  target_include_directories(test_concurrency_rdma PRIVATE ${FERRY_IBVERBS_INCLUDE_DIR})
endif()
