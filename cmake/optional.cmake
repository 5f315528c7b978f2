# Optional pieces of libferry. Sources named *_opt_<feature>.c are left out
# of the default glob (CMakeLists.txt) and added here, one block per feature.
# Each block says in the configure output whether it is on and why not.

# ---- RDMA transport (branch rdma): src/transport/rdma_opt_rdma.c ----------
# Needs only <infiniband/verbs.h> at build time (Debian: libibverbs-dev).
# libibverbs is NOT linked: the transport dlopen()s libibverbs.so.1 at an
# engine's first probe, and only when sysfs lists an RDMA device, so the
# library runs on machines without rdma-core and never loads it there.
set(FERRY_HAVE_RDMA OFF)
if(FERRY_WITH_RDMA)
  find_path(FERRY_IBVERBS_INCLUDE_DIR infiniband/verbs.h)
  if(FERRY_IBVERBS_INCLUDE_DIR)
    set(FERRY_HAVE_RDMA ON)
    target_sources(ferry PRIVATE ${CMAKE_SOURCE_DIR}/src/transport/rdma_opt_rdma.c)
    target_include_directories(ferry PRIVATE ${FERRY_IBVERBS_INCLUDE_DIR})
    target_compile_definitions(ferry PRIVATE FERRY_HAVE_RDMA=1)
    target_link_libraries(ferry PRIVATE ${CMAKE_DL_LIBS})
    message(STATUS "ferry: RDMA transport ON (verbs.h in ${FERRY_IBVERBS_INCLUDE_DIR}; libibverbs is dlopen'ed at run time)")
  else()
    message(STATUS "ferry: RDMA transport OFF: infiniband/verbs.h not found (apt-get install libibverbs-dev)")
  endif()
else()
  message(STATUS "ferry: RDMA transport OFF (FERRY_WITH_RDMA=OFF)")
endif()

# ---- CUDA device memory (branch rdma): src/core/cuda_opt_cuda.c -----------
# OFF by default. With -DFERRY_WITH_CUDA=ON the CUDA toolkit is required
# (find_package(CUDAToolkit): nvcc in PATH, CUDAToolkit_ROOT, or
# /usr/local/cuda); the library links the CUDA runtime (libcudart) and runs
# without a GPU or driver, treating all memory as host memory then.
set(FERRY_HAVE_CUDA OFF)
if(FERRY_WITH_CUDA)
  find_package(CUDAToolkit)
  if(NOT CUDAToolkit_FOUND)
    message(FATAL_ERROR "ferry: FERRY_WITH_CUDA=ON but the CUDA toolkit was not found "
                        "(set -DCUDAToolkit_ROOT=/usr/local/cuda or put nvcc in PATH)")
  endif()
  set(FERRY_HAVE_CUDA ON)
  target_sources(ferry PRIVATE ${CMAKE_SOURCE_DIR}/src/core/cuda_opt_cuda.c)
  target_compile_definitions(ferry PRIVATE FERRY_HAVE_CUDA=1)
  target_link_libraries(ferry PRIVATE CUDA::cudart)
  message(STATUS "ferry: CUDA device memory ON (CUDA ${CUDAToolkit_VERSION}, ${CUDAToolkit_INCLUDE_DIRS})")
endif()
