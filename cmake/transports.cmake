# SPDX-License-Identifier: Apache-2.0
# Transports: each is a folder src/transport/<name>/ whose transport.cmake
# adds its sources (and its optional dependencies) to the target named by
# FERRY_TRANSPORT_TARGET, and whose code defines
#   const ferry_transport_ops_t ferry_transport_<name>
# (src/link/transport.h). The table the library chooses from,
# ferry_transports[], is generated from a list of names (FERRY_TRANSPORTS in
# CMakeLists.txt) into the build tree, as an object of its own: a test links
# a table of its own instead (tests/transport_extra/), and the archive's is
# then never pulled in. README, "Adding a transport".

# ferry_transport_table(<target> FALLBACK <name> TRANSPORTS <name>...)
# Makes the object library <target> holding ferry_transports[] (the names in
# that order, the order "auto" prefers) and ferry_transport_fallback.
function(ferry_transport_table target)
  cmake_parse_arguments(T "" "FALLBACK" "TRANSPORTS" ${ARGN})
  if(NOT T_TRANSPORTS OR NOT T_FALLBACK)
    message(FATAL_ERROR "ferry_transport_table(${target}): give TRANSPORTS and FALLBACK")
  endif()
  list(FIND T_TRANSPORTS ${T_FALLBACK} at)
  if(at LESS 0)
    message(FATAL_ERROR "ferry_transport_table(${target}): fallback ${T_FALLBACK} is not in the list")
  endif()
  set(FERRY_TABLE_DECLS "")
  set(FERRY_TABLE_ENTRIES "")
  foreach(t ${T_TRANSPORTS})
    if(NOT t MATCHES "^[a-z][a-z0-9_]*$")
      message(FATAL_ERROR "ferry_transport_table(${target}): '${t}' is not a transport name")
    endif()
    string(APPEND FERRY_TABLE_DECLS "extern const ferry_transport_ops_t ferry_transport_${t};\n")
    string(APPEND FERRY_TABLE_ENTRIES "    &ferry_transport_${t},\n")
  endforeach()
  set(FERRY_TABLE_TARGET ${target})
  string(REPLACE ";" " " FERRY_TABLE_LIST "${T_TRANSPORTS}")
  set(FERRY_TABLE_FALLBACK ${T_FALLBACK})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${target}.c)
  configure_file(${CMAKE_SOURCE_DIR}/cmake/transport_table.c.in ${out} @ONLY)
  add_library(${target} OBJECT ${out})
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
  set_target_properties(${target} PROPERTIES C_VISIBILITY_PRESET hidden)
endfunction()

# Each transport of the library's list adds its own sources to the library.
set(FERRY_TRANSPORT_TARGET ferry_objects)
foreach(t ${FERRY_TRANSPORTS})
  if(NOT EXISTS ${CMAKE_SOURCE_DIR}/src/transport/${t}/transport.cmake)
    message(FATAL_ERROR "transport ${t} (FERRY_TRANSPORTS) has no src/transport/${t}/transport.cmake")
  endif()
  include(${CMAKE_SOURCE_DIR}/src/transport/${t}/transport.cmake)
endforeach()
ferry_transport_table(ferry_transport_table FALLBACK ${FERRY_TRANSPORT_FALLBACK} TRANSPORTS ${FERRY_TRANSPORTS})
