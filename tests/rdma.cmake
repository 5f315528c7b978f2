# SPDX-License-Identifier: Apache-2.0
# RDMA and CUDA tests (branch rdma).
# test_rdma_fake and test_rdma_group run the transport on a software HCA
# (support/rdma_fake.c); they need verbs.h and are reduced to a skip when the
# verbs code is not built.
if(FERRY_HAVE_RDMA)
  foreach(t test_rdma_fake test_rdma_group)
    target_sources(${t} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support/rdma_fake.c)
    target_compile_definitions(${t} PRIVATE FERRY_HAVE_RDMA=1)
    target_include_directories(${t} PRIVATE ${FERRY_IBVERBS_INCLUDE_DIR})
  endforeach()
endif()
# libferry must not need libibverbs to load: it is dlopen'ed at run time.
find_program(FERRY_READELF readelf)
if(FERRY_READELF)
  add_test(NAME rdma_not_linked
           COMMAND sh -c "! ${FERRY_READELF} -d $<TARGET_FILE:ferry_shared> | grep -q libibverbs")
endif()
