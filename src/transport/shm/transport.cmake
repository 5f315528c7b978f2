# SPDX-License-Identifier: Apache-2.0
# The shm transport: cross-memory attach and shared pools between processes
# of one host. Needs nothing beyond Linux.
file(GLOB FERRY_SHM_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.c)
target_sources(${FERRY_TRANSPORT_TARGET} PRIVATE ${FERRY_SHM_SOURCES})
