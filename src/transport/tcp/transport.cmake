# SPDX-License-Identifier: Apache-2.0
# The tcp transport: bytes inline in the session's TCP frames. Needs nothing.
file(GLOB FERRY_TCP_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.c)
target_sources(${FERRY_TRANSPORT_TARGET} PRIVATE ${FERRY_TCP_SOURCES})
