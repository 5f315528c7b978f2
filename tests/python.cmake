# SPDX-License-Identifier: Apache-2.0
# The Python binding's tests (bindings/python/tests, stdlib unittest) against
# this build's libferry.so, with Debian's /usr/bin/python3 when present (it
# has python3-numpy; numpy-specific tests skip elsewhere).
find_program(FERRY_TEST_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT FERRY_TEST_PYTHON)
  find_program(FERRY_TEST_PYTHON NAMES python3)
endif()

set(_ferry_py_env "FERRY_LIBRARY=$<TARGET_FILE:ferry_shared>")
set(_ferry_py_ok ON)
if(FERRY_SANITIZE STREQUAL "address")
  # An ASan library loads into an uninstrumented interpreter only when the
  # runtime is preloaded; CPython's own allocations are not leaks to report.
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
                  OUTPUT_VARIABLE _ferry_asan OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_ferry_asan AND EXISTS "${_ferry_asan}")
    list(APPEND _ferry_py_env "LD_PRELOAD=${_ferry_asan}"
         "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1")
  else()
    set(_ferry_py_ok OFF)
  endif()
elseif(FERRY_SANITIZE STREQUAL "thread")
  set(_ferry_py_ok OFF) # TSan in an uninstrumented CPython reports CPython itself
endif()

if(FERRY_TEST_PYTHON AND _ferry_py_ok)
  add_test(NAME python_bindings
           COMMAND ${FERRY_TEST_PYTHON} -m unittest discover -s ${CMAKE_SOURCE_DIR}/bindings/python/tests)
  set_tests_properties(python_bindings PROPERTIES TIMEOUT 600 LABELS python
                       ENVIRONMENT "${_ferry_py_env}")
endif()

# `pip install` of the package (no network) with the library from
# `cmake --install`: found by the system loader and by FERRY_LIBRARY.
if(FERRY_TEST_PYTHON AND _ferry_py_ok)
  add_test(NAME python_package
           COMMAND ${CMAKE_SOURCE_DIR}/tests/install/check_python_package.sh ${CMAKE_BINARY_DIR} ${FERRY_TEST_PYTHON})
  set_tests_properties(python_package PROPERTIES TIMEOUT 300 LABELS "python;install"
                       ENVIRONMENT "${_ferry_py_env}")
endif()
