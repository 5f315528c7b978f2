# SPDX-License-Identifier: Apache-2.0
# The RDMA transport. Always built: its settings, the device probe through
# sysfs, its frames and codecs, and what an engine without RDMA answers to
# RDMA frames (rdma.c, rdma_wire.c). The verbs code (FERRY_RDMA_VERBS_SOURCES) needs
# only <infiniband/verbs.h> at build time (Debian: libibverbs-dev).
# libibverbs is NOT linked: the transport dlopen()s libibverbs.so.1 at an
# engine's first probe, and only when sysfs lists an RDMA device, so the
# library runs on machines without rdma-core and never loads it there.
set(FERRY_RDMA_VERBS_SOURCES rdma_verbs.c rdma_ep.c rdma_run.c rdma_commit.c rdma_serve.c)
list(TRANSFORM FERRY_RDMA_VERBS_SOURCES PREPEND ${CMAKE_CURRENT_LIST_DIR}/)
file(GLOB FERRY_RDMA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.c)
list(REMOVE_ITEM FERRY_RDMA_SOURCES ${FERRY_RDMA_VERBS_SOURCES})
target_sources(${FERRY_TRANSPORT_TARGET} PRIVATE ${FERRY_RDMA_SOURCES})
set(FERRY_HAVE_RDMA OFF)
if(FERRY_WITH_RDMA)
  find_path(FERRY_IBVERBS_INCLUDE_DIR infiniband/verbs.h)
  if(FERRY_IBVERBS_INCLUDE_DIR)
    set(FERRY_HAVE_RDMA ON)
    target_sources(${FERRY_TRANSPORT_TARGET} PRIVATE ${FERRY_RDMA_VERBS_SOURCES})
    target_include_directories(${FERRY_TRANSPORT_TARGET} PRIVATE ${FERRY_IBVERBS_INCLUDE_DIR})
    target_compile_definitions(${FERRY_TRANSPORT_TARGET} PRIVATE FERRY_HAVE_RDMA=1)
    target_link_libraries(${FERRY_TRANSPORT_TARGET} PRIVATE ${CMAKE_DL_LIBS})
    message(STATUS "ferry: RDMA transport ON (verbs.h in ${FERRY_IBVERBS_INCLUDE_DIR}; libibverbs is dlopen'ed at run time)")
  else()
    message(STATUS "ferry: RDMA transport OFF: infiniband/verbs.h not found (apt-get install libibverbs-dev)")
  endif()
else()
  message(STATUS "ferry: RDMA transport OFF (FERRY_WITH_RDMA=OFF)")
endif()
