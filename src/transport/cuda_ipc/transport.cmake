# SPDX-License-Identifier: Apache-2.0
# The cuda_ipc transport: CUDA device memory between processes of one host,
# copied GPU to GPU through CUDA IPC handles. Always built: without CUDA
# support (FERRY_WITH_CUDA=OFF) it never offers itself (the driver calls of
# cuda_ipc_driver.c are then left out and it reports no usable driver). The
# driver is never linked: it is the one the process loaded
# (src/util/cuda_memory.c).
file(GLOB FERRY_CUDA_IPC_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.c)
target_sources(${FERRY_TRANSPORT_TARGET} PRIVATE ${FERRY_CUDA_IPC_SOURCES})
