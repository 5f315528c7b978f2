# SPDX-License-Identifier: Apache-2.0
# Installation: `cmake --install BUILD [--prefix P]` (or `make install PREFIX=P`).
#   include/ferry/*.h                     the public headers
#   lib/libferry.so.X.Y.Z, .so.X, .so     shared library, SONAME libferry.so.X
#   lib/libferry.a                        static library
#   lib/cmake/ferry/                      find_package(ferry) -> ferry::ferry, ferry::ferry_static
#   lib/pkgconfig/ferry.pc                pkg-config ferry [--static]
#   bin/ferry                             the CLI
#   share/man/man1/ferry*.1               its man pages (man/, scripts/man.sh)
#   share/bash-completion/completions/ferry   its bash completion
#   share/doc/ferry/LICENSE, NOTICE       Apache-2.0
# (lib is GNUInstallDirs' libdir: lib/x86_64-linux-gnu under /usr on Debian.)
# `make uninstall` removes the files and the folders the install created
# (build/install_dirs.txt, written below before anything is installed).
include(CMakePackageConfigHelpers)

set(FERRY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)
set(FERRY_BASH_COMPLETION_DIR ${CMAKE_INSTALL_DATADIR}/bash-completion/completions CACHE STRING
    "where the bash completion goes, relative to the prefix (bash-completion looks in \${datadir}/bash-completion/completions)")

# Before the first file: note each folder on the way to an install folder
# that does not exist yet, so that uninstall can remove what install made.
set(_ferry_install_dirs ${CMAKE_INSTALL_INCLUDEDIR}/ferry ${FERRY_CMAKE_DIR} ${CMAKE_INSTALL_LIBDIR}/pkgconfig
    ${CMAKE_INSTALL_BINDIR} ${CMAKE_INSTALL_MANDIR}/man1 ${FERRY_BASH_COMPLETION_DIR} ${CMAKE_INSTALL_DOCDIR})
install(CODE "
  set(_top \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}\")
  set(_made \"\")
  # what an earlier install into this same place created (re-installing
  # finds those folders present); entries of other places are dropped
  if(EXISTS \"${CMAKE_BINARY_DIR}/install_dirs.txt\")
    file(STRINGS \"${CMAKE_BINARY_DIR}/install_dirs.txt\" _before)
    foreach(_dir IN LISTS _before)
      string(FIND \"\${_top}/\" \"\${_dir}/\" _above)
      string(FIND \"\${_dir}/\" \"\${_top}/\" _below)
      if(_above EQUAL 0 OR _below EQUAL 0)
        list(APPEND _made \"\${_dir}\")
      endif()
    endforeach()
  endif()
  foreach(_rel ${_ferry_install_dirs})
    set(_dir \"\${_top}/\${_rel}\")
    while(NOT EXISTS \"\${_dir}\" AND NOT _dir STREQUAL \"/\" AND NOT _dir STREQUAL \"\")
      list(APPEND _made \"\${_dir}\")
      get_filename_component(_dir \"\${_dir}\" DIRECTORY)
    endwhile()
  endforeach()
  list(REMOVE_DUPLICATES _made)
  string(REPLACE \";\" \"\\n\" _made \"\${_made}\")
  file(WRITE \"${CMAKE_BINARY_DIR}/install_dirs.txt\" \"\${_made}\\n\")
" COMPONENT lib)

file(GLOB FERRY_PUBLIC_HEADERS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/include/ferry/*.h)
install(FILES ${FERRY_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ferry COMPONENT dev)
install(TARGETS ferry_shared EXPORT ferryTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ferry ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(TARGETS ferry_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT bin)
file(GLOB FERRY_MAN_PAGES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/man/*.1)
# `cmake --build build --target man` regenerates man/ from the CLI's help
# (help2man); ctest man_pages fails until it is run after a help change.
add_custom_target(man COMMAND ${CMAKE_SOURCE_DIR}/scripts/man.sh $<TARGET_FILE:ferry_cli> ${CMAKE_SOURCE_DIR}/man
                  DEPENDS ferry_cli VERBATIM)
install(FILES ${FERRY_MAN_PAGES} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT bin)
install(FILES ${CMAKE_SOURCE_DIR}/completion/ferry.bash DESTINATION ${FERRY_BASH_COMPLETION_DIR}
        RENAME ferry COMPONENT bin)
install(FILES ${CMAKE_SOURCE_DIR}/LICENSE ${CMAKE_SOURCE_DIR}/NOTICE DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT lib)

install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION ${FERRY_CMAKE_DIR} COMPONENT dev)
# The ABI promise of docs/ABI.md: every release of one MAJOR (the SONAME's)
# runs the programs built against an earlier one, 0.x included.
set(_ferry_compat SameMajorVersion)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ferryConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY ${_ferry_compat})

# ferry.pc: the shared library needs nothing more from its users; a static
# link (pkg-config --static) needs what libferry.a was built against. They
# go in Libs.private as plain -l flags, not as Requires.private modules:
# pkg-config resolves Requires.private even for a shared link, so it would
# fail wherever one of the backends' -dev packages is absent.
set(FERRY_PC_LIBS_PRIVATE "")
set(FERRY_STATIC_LINK_NAMES "") # the same libraries by name, for ferryConfig.cmake
foreach(_mod CRYPTO JANSSON FERRY_CURL FERRY_HIREDIS FERRY_MHD FERRY_ISAL)
  if(${_mod}_FOUND)
    foreach(_dir IN LISTS ${_mod}_LIBRARY_DIRS)
      if(NOT _dir MATCHES "^(/usr)?/lib" AND NOT " ${FERRY_PC_LIBS_PRIVATE} " MATCHES " -L${_dir} ")
        string(APPEND FERRY_PC_LIBS_PRIVATE " -L${_dir}")
      endif()
    endforeach()
    foreach(_lib IN LISTS ${_mod}_LIBRARIES)
      if(NOT _lib IN_LIST FERRY_STATIC_LINK_NAMES)
        string(APPEND FERRY_PC_LIBS_PRIVATE " -l${_lib}")
        list(APPEND FERRY_STATIC_LINK_NAMES ${_lib})
      endif()
    endforeach()
  endif()
endforeach()
string(APPEND FERRY_PC_LIBS_PRIVATE " -pthread")
set(FERRY_STATIC_EXTRA_LIBS "")
if((FERRY_HAVE_RDMA OR FERRY_HAVE_CUDA) AND CMAKE_DL_LIBS)
  string(APPEND FERRY_PC_LIBS_PRIVATE " -l${CMAKE_DL_LIBS}")
  set(FERRY_STATIC_EXTRA_LIBS ${CMAKE_DL_LIBS})
endif()
string(STRIP "${FERRY_PC_LIBS_PRIVATE}" FERRY_PC_LIBS_PRIVATE)
# prefix relative to the .pc file: the tree may be installed with
# `cmake --install --prefix P` (another prefix than configured) or moved,
# and is still found where it lands.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "ferry.pc needs CMAKE_INSTALL_LIBDIR and CMAKE_INSTALL_INCLUDEDIR relative to the prefix")
endif()
file(RELATIVE_PATH FERRY_PC_PREFIX_FROM_PCDIR /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" FERRY_PC_PREFIX_FROM_PCDIR "${FERRY_PC_PREFIX_FROM_PCDIR}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/ferry.pc.in ${CMAKE_BINARY_DIR}/ferry.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/ferry.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# The CMake package; ferryConfig.cmake also defines ferry::ferry_static
# from the same dependency lists as ferry.pc.
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/ferryConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/ferryConfig.cmake
                              INSTALL_DESTINATION ${FERRY_CMAKE_DIR})
install(FILES ${CMAKE_BINARY_DIR}/ferryConfig.cmake ${CMAKE_BINARY_DIR}/ferryConfigVersion.cmake
        DESTINATION ${FERRY_CMAKE_DIR} COMPONENT dev)
