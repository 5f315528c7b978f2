# SPDX-License-Identifier: Apache-2.0
# The binary interface of libferry.so (docs/ABI.md): it exports exactly the
# public API of tests/abi/exported.txt, and its SONAME carries the major version.
find_program(FERRY_NM nm)
if(FERRY_NM)
  add_test(NAME abi_exports
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/abi/check_exports.sh $<TARGET_FILE:ferry_shared>
                   ${CMAKE_CURRENT_SOURCE_DIR}/abi/exported.txt ${CMAKE_SOURCE_DIR}/include)
  set_tests_properties(abi_exports PROPERTIES LABELS "abi;no-tsan")
endif()
find_program(FERRY_ABI_READELF readelf)
if(FERRY_ABI_READELF)
  add_test(NAME abi_soname
           COMMAND sh -c "${FERRY_ABI_READELF} -d $<TARGET_FILE:ferry_shared> | grep -F 'Library soname: [libferry.so.${PROJECT_VERSION_MAJOR}]'")
  set_tests_properties(abi_soname PROPERTIES LABELS "abi;no-tsan")
endif()
