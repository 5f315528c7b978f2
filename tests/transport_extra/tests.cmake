# SPDX-License-Identifier: Apache-2.0
# A transport only these tests have, added the way README's "Adding a
# transport" says: a folder (this one: the transport in extra.c, its
# fragment transport.cmake) and a name in a table list, here the tests' own
# table. The library, libferry.so included, stays as it is: each test links
# its own table (ferry_transport_table), so the archive's is never pulled in.
set(EXTRA_DIR ${CMAKE_CURRENT_LIST_DIR})
ferry_transport_table(test_extra_table FALLBACK tcp TRANSPORTS ${FERRY_TRANSPORTS} extra)

# test_transport_extra: the transport at work; test_transport_frames_extra:
# the frame, bit and key checks of test_transport_frames on the tests' table.
foreach(name test_transport_extra test_transport_frames_extra)
  if(name STREQUAL test_transport_extra)
    add_executable(${name} ${EXTRA_DIR}/test_transport_extra.c $<TARGET_OBJECTS:test_extra_table>)
  else()
    add_executable(${name} ${CMAKE_CURRENT_SOURCE_DIR}/test_transport_frames.c $<TARGET_OBJECTS:test_extra_table>)
  endif()
  set(FERRY_TRANSPORT_TARGET ${name})
  include(${EXTRA_DIR}/transport.cmake)
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src ${EXTRA_DIR})
  target_link_libraries(${name} PRIVATE ferry_harness ferry PkgConfig::CMOCKA Threads::Threads m)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300
    ENVIRONMENT "FERRY_TEST_BIN_DIR=${CMAKE_BINARY_DIR};FERRY_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endforeach()
