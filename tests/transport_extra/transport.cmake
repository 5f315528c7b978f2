# SPDX-License-Identifier: Apache-2.0
# The transport "extra", a folder like src/transport/<name>/: its sources,
# added to the target named by FERRY_TRANSPORT_TARGET (cmake/transports.cmake).
target_sources(${FERRY_TRANSPORT_TARGET} PRIVATE ${CMAKE_CURRENT_LIST_DIR}/extra.c)
