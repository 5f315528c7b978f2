# SPDX-License-Identifier: Apache-2.0
# Optional features of the `ferry` library, each in its own block below.
# A feature is on when its FERRY_WITH_<X> option is ON and its libraries are
# found; it then adds its sources (FERRY_OPTIONAL_SOURCES, CMakeLists.txt) to `ferry_objects` (both libraries), links the
# libraries and defines FERRY_HAVE_<X>. A feature whose libraries are
# missing is skipped with a message, never a failed configure.

# ---- etcd metadata backend: libcurl + jansson (etcd v3 JSON gateway) ----
if(FERRY_WITH_ETCD)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(FERRY_CURL IMPORTED_TARGET libcurl)
    pkg_check_modules(FERRY_JANSSON IMPORTED_TARGET jansson)
  endif()
  if(FERRY_CURL_FOUND AND FERRY_JANSSON_FOUND)
    target_sources(ferry_objects PRIVATE ${CMAKE_SOURCE_DIR}/src/meta/etcd.c)
    set(FERRY_META_CURL ON)
    target_link_libraries(ferry_objects PRIVATE PkgConfig::FERRY_CURL PkgConfig::FERRY_JANSSON)
    target_compile_definitions(ferry_objects PRIVATE FERRY_HAVE_ETCD)
    message(STATUS "ferry: etcd metadata backend ON")
  else()
    message(STATUS "ferry: etcd metadata backend OFF (libcurl or jansson not found by pkg-config)")
  endif()
endif()

# ---- HTTP metadata backend (Mooncake's HTTP metadata server): libcurl ----
option(FERRY_WITH_HTTP_META "http:// metadata backend: Mooncake's HTTP metadata server (libcurl)" ON)
if(FERRY_WITH_HTTP_META)
  if(PKG_CONFIG_FOUND AND NOT TARGET PkgConfig::FERRY_CURL) # the etcd block may have it
    pkg_check_modules(FERRY_CURL IMPORTED_TARGET libcurl)
  endif()
  if(FERRY_CURL_FOUND)
    target_sources(ferry_objects PRIVATE ${CMAKE_SOURCE_DIR}/src/meta/http_meta.c)
    set(FERRY_META_CURL ON)
    target_link_libraries(ferry_objects PRIVATE PkgConfig::FERRY_CURL)
    target_compile_definitions(ferry_objects PRIVATE FERRY_HAVE_HTTP_META)
    message(STATUS "ferry: HTTP metadata backend ON")
  else()
    message(STATUS "ferry: HTTP metadata backend OFF (libcurl not found by pkg-config)")
  endif()
endif()

# The libcurl client both backends above share (src/meta/curl_client.h), and
# its URL parser for http:// metadata strings (src/meta/meta.c).
if(FERRY_META_CURL)
  target_sources(ferry_objects PRIVATE ${CMAKE_SOURCE_DIR}/src/meta/curl_client.c)
  target_compile_definitions(ferry_objects PRIVATE FERRY_HAVE_CURL_URL)
endif()

# ---- Redis metadata backend: hiredis ----
if(FERRY_WITH_REDIS)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(FERRY_HIREDIS IMPORTED_TARGET hiredis)
  endif()
  if(FERRY_HIREDIS_FOUND)
    target_sources(ferry_objects PRIVATE ${CMAKE_SOURCE_DIR}/src/meta/redis.c)
    target_link_libraries(ferry_objects PRIVATE PkgConfig::FERRY_HIREDIS)
    target_compile_definitions(ferry_objects PRIVATE FERRY_HAVE_REDIS)
    message(STATUS "ferry: Redis metadata backend ON")
  else()
    message(STATUS "ferry: Redis metadata backend OFF (hiredis not found by pkg-config)")
  endif()
endif()

# ---- Prometheus metrics endpoint: libmicrohttpd ----
option(FERRY_WITH_HTTP "metrics HTTP endpoint (libmicrohttpd)" ON)
if(FERRY_WITH_HTTP)
  pkg_check_modules(FERRY_MHD IMPORTED_TARGET libmicrohttpd)
  if(FERRY_MHD_FOUND)
    target_sources(ferry_objects PRIVATE ${CMAKE_SOURCE_DIR}/src/engine/metrics_http_server.c)
    target_link_libraries(ferry_objects PRIVATE PkgConfig::FERRY_MHD)
    target_compile_definitions(ferry_objects PRIVATE FERRY_HAVE_HTTP)
    message(STATUS "ferry: metrics HTTP endpoint ON")
  else()
    message(STATUS "ferry: metrics HTTP endpoint OFF (libmicrohttpd not found)")
  endif()
endif()

# The RDMA transport's verbs code is the transport's own affair:
# src/transport/rdma/transport.cmake.

# ---- CUDA device memory: src/util/cuda_memory.c -------------------------
# ON by default: it needs nothing at build time. The few CUDA driver API
# declarations used are in src/util/cuda_driver.h (cuda.h comes only with the
# whole toolkit), and nothing from CUDA is linked: libcuda.so.1 is dlopen'ed
# at run time, and only in a process that has loaded it already. Without a
# CUDA driver all memory is host memory (ferry_device_memory_supported says
# why). -DFERRY_WITH_CUDA=OFF leaves the code out.
set(FERRY_HAVE_CUDA OFF)
if(FERRY_WITH_CUDA)
  set(FERRY_HAVE_CUDA ON)
  target_sources(ferry_objects PRIVATE ${CMAKE_SOURCE_DIR}/src/util/cuda_memory.c)
  target_compile_definitions(ferry_objects PRIVATE FERRY_HAVE_CUDA=1)
  target_link_libraries(ferry_objects PRIVATE ${CMAKE_DL_LIBS})
  message(STATUS "ferry: CUDA device memory ON (driver API, libcuda.so.1 dlopen'ed at run time)")
else()
  message(STATUS "ferry: CUDA device memory OFF (FERRY_WITH_CUDA=OFF)")
endif()

# ---- CRC32C through ISA-L (src/util/crc32c.c): libisal ---------------------
# ISA-L's crc32_iscsi folds several streams of the CPU's CRC instructions at
# once, several times the speed of one stream. Without it crc32c.c uses the
# CPU's CRC instructions (SSE4.2, ARMv8 CRC) or slicing-by-8.
option(FERRY_WITH_ISAL "CRC32C through ISA-L's crc32_iscsi (libisal)" ON)
set(FERRY_HAVE_ISAL OFF)
if(FERRY_WITH_ISAL)
  pkg_check_modules(FERRY_ISAL IMPORTED_TARGET libisal)
  if(FERRY_ISAL_FOUND)
    set(FERRY_HAVE_ISAL ON)
    target_link_libraries(ferry_objects PRIVATE PkgConfig::FERRY_ISAL)
    target_compile_definitions(ferry_objects PRIVATE FERRY_HAVE_ISAL=1)
    message(STATUS "ferry: CRC32C through ISA-L ON (libisal ${FERRY_ISAL_VERSION})")
  else()
    message(STATUS "ferry: CRC32C through ISA-L OFF: libisal not found by pkg-config "
                   "(apt-get install libisal-dev); using the CPU's CRC instructions or slicing-by-8")
  endif()
else()
  message(STATUS "ferry: CRC32C through ISA-L OFF (FERRY_WITH_ISAL=OFF)")
endif()
