# SPDX-License-Identifier: Apache-2.0
# A transport only this test's build has, made the way README's "Adding a
# transport" says: one new file (the test itself) and one table entry, which
# transport.c compiles in under FERRY_TEST_TRANSPORT_EXTRA. The test links
# its own copy of transport.c (the archive's is then never pulled in), so the
# library, libferry.so included, stays as it is and exports nothing more.
if(TEST test_transport_extra)
  target_sources(test_transport_extra PRIVATE ${CMAKE_SOURCE_DIR}/src/link/transport.c)
  target_compile_definitions(test_transport_extra PRIVATE FERRY_TEST_TRANSPORT_EXTRA=1)
endif()
