# SPDX-License-Identifier: Apache-2.0
# CUDA tests: test_cuda is a skip unless built with FERRY_WITH_CUDA (the
# default); it needs no GPU. Its driver is tests/support/cuda_stub.c, built
# here as two shared libraries that the test dlopen()s as an application
# would load libcuda.so.1 (FERRY_CUDA_STUB, FERRY_CUDA_STUB_PARTIAL); the
# Python binding's tests find build/tests/libcuda_stub.so next to libferry.so.
if(FERRY_HAVE_CUDA)
  foreach(stub cuda_stub cuda_stub_partial)
    add_library(${stub} SHARED ${CMAKE_CURRENT_SOURCE_DIR}/support/cuda_stub.c)
    target_include_directories(${stub} PRIVATE ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(${stub} PRIVATE Threads::Threads)
  endforeach()
  target_compile_definitions(cuda_stub_partial PRIVATE CUDA_STUB_PARTIAL=1)
  # The stub answers to the real driver's soname, so that a process that has
  # loaded it is found by the default name, libcuda.so.1, as the real one.
  set_target_properties(cuda_stub PROPERTIES NO_SONAME ON)
  target_link_options(cuda_stub PRIVATE "LINKER:-soname,libcuda.so.1")
  target_compile_definitions(test_cuda PRIVATE FERRY_HAVE_CUDA=1)
  target_link_libraries(test_cuda PRIVATE ${CMAKE_DL_LIBS} ferry_fault_support) # raw peers (fault.h)
  add_dependencies(test_cuda cuda_stub cuda_stub_partial)
  # Where a toolkit's cuda.h is at hand, the test checks the driver API
  # values Ferry declares itself (src/util/cuda_driver.h) against it.
  find_path(FERRY_CUDA_H_DIR cuda.h PATHS /usr/local/cuda/include ENV CUDA_HOME PATH_SUFFIXES include)
  if(FERRY_CUDA_H_DIR)
    target_compile_definitions(test_cuda PRIVATE FERRY_TEST_CUDA_H=1)
    target_include_directories(test_cuda SYSTEM PRIVATE ${FERRY_CUDA_H_DIR})
  endif()
  set_property(TEST test_cuda APPEND PROPERTY ENVIRONMENT
    "FERRY_CUDA_STUB=$<TARGET_FILE:cuda_stub>" "FERRY_CUDA_STUB_PARTIAL=$<TARGET_FILE:cuda_stub_partial>")
endif()
# libferry links nothing from CUDA (the driver is dlopen'ed), and exports
# none of its CUDA functions.
find_program(FERRY_READELF readelf)
if(FERRY_HAVE_CUDA AND FERRY_READELF)
  add_test(NAME cuda_not_linked
           COMMAND sh -c "! ${FERRY_READELF} -dW --dyn-syms $<TARGET_FILE:ferry_shared> | grep -Eq 'libcuda|libcudart|ferry_cuda_'")
endif()
# The CUDA IPC transport between two processes, over the same stub driver.
if(FERRY_HAVE_CUDA)
  target_compile_definitions(test_cuda_ipc PRIVATE FERRY_HAVE_CUDA=1)
  target_link_libraries(test_cuda_ipc PRIVATE ${CMAKE_DL_LIBS} ferry_fault_support) # raw peers (fault.h)
  add_dependencies(test_cuda_ipc cuda_stub)
  set_property(TEST test_cuda_ipc APPEND PROPERTY ENVIRONMENT "FERRY_CUDA_STUB=$<TARGET_FILE:cuda_stub>")
endif()
