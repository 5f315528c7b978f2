# SPDX-License-Identifier: Apache-2.0
# The RDMA transport. Always built: its settings, the device probe through
# sysfs, its frames and codecs, and what an engine without RDMA answers to
# RDMA frames (*.c but *_opt_rdma.c). The verbs code (*_opt_rdma.c) needs
# only <infiniband/verbs.h> at build time (Debian: libibverbs-dev).
# libibverbs is NOT linked: the transport dlopen()s libibverbs.so.1 at an
# engine's first probe, and only when sysfs lists an RDMA device, so the
# library runs on machines without rdma-core and never loads it there.
file(GLOB FERRY_RDMA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.c)
list(FILTER FERRY_RDMA_SOURCES EXCLUDE REGEX "_opt_[a-z]+\\.c$")
target_sources(${FERRY_TRANSPORT_TARGET} PRIVATE ${FERRY_RDMA_SOURCES})
set(FERRY_HAVE_RDMA OFF)
if(FERRY_WITH_RDMA)
  find_path(FERRY_IBVERBS_INCLUDE_DIR infiniband/verbs.h)
  if(FERRY_IBVERBS_INCLUDE_DIR)
    set(FERRY_HAVE_RDMA ON)
    file(GLOB FERRY_RDMA_VERBS_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*_opt_rdma.c)
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
