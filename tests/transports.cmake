# SPDX-License-Identifier: Apache-2.0
# The round trips and error cases of the core suite run over each transport:
# the plain tests get auto (shm between engines of one host), these force TCP
# (the harness applies FERRY_TRANSPORT).
foreach(t test_transfer test_failures)
  if(TEST ${t})
    add_test(NAME ${t}_tcp COMMAND ${t})
    set_tests_properties(${t}_tcp PROPERTIES TIMEOUT 300
      ENVIRONMENT "FERRY_TRANSPORT=tcp;FERRY_TEST_BIN_DIR=${CMAKE_BINARY_DIR};FERRY_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  endif()
endforeach()
