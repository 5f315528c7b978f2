# Installation: `cmake --install BUILD [--prefix P]` (or `make install PREFIX=P`).
#   include/ferry/*.h                     the public headers
#   lib/libferry.so.X.Y.Z, .so.X, .so     shared library, SONAME libferry.so.X
#   lib/libferry.a                        static library
#   lib/cmake/ferry/                      find_package(ferry) -> ferry::ferry, ferry::ferry_static
#   lib/pkgconfig/ferry.pc                pkg-config ferry [--static]
#   bin/ferry                             the CLI
include(CMakePackageConfigHelpers)

set(FERRY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)

file(GLOB FERRY_PUBLIC_HEADERS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/include/ferry/*.h)
install(FILES ${FERRY_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ferry COMPONENT dev)
install(TARGETS ferry_shared EXPORT ferryTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ferry ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(TARGETS ferry_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT bin)

install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION ${FERRY_CMAKE_DIR} COMPONENT dev)
# The ABI promise of docs/ABI.md: every release of one MAJOR (the SONAME's)
# runs the programs built against an earlier one, 0.x included.
set(_ferry_compat SameMajorVersion)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ferryConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY ${_ferry_compat})

# ferry.pc: the shared library needs nothing more from its users; a static
# link (pkg-config --static) needs what libferry.a was built against:
# the pkg-config modules found at configure time, and plain libraries.
set(FERRY_PC_REQUIRES_PRIVATE "libcrypto jansson")
set(FERRY_PC_LIBS_PRIVATE "-pthread")
if(FERRY_CURL_FOUND AND FERRY_JANSSON_FOUND)
  string(APPEND FERRY_PC_REQUIRES_PRIVATE " libcurl")
endif()
if(FERRY_HIREDIS_FOUND)
  string(APPEND FERRY_PC_REQUIRES_PRIVATE " hiredis")
endif()
if(FERRY_MHD_FOUND)
  string(APPEND FERRY_PC_REQUIRES_PRIVATE " libmicrohttpd")
endif()
set(FERRY_STATIC_EXTRA_LIBS "")
if((FERRY_HAVE_RDMA OR FERRY_HAVE_CUDA) AND CMAKE_DL_LIBS)
  string(APPEND FERRY_PC_LIBS_PRIVATE " -l${CMAKE_DL_LIBS}")
  set(FERRY_STATIC_EXTRA_LIBS ${CMAKE_DL_LIBS})
endif()
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
