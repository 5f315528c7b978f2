# Optional features of the `ferry` library, each in its own block below.
# A feature is on when its FERRY_WITH_<X> option is ON and its libraries are
# found; it then adds its src/**/*_opt_<x>.c files to `ferry`, links the
# libraries and defines FERRY_HAVE_<X>. A feature whose libraries are
# missing is skipped with a message, never a failed configure.

# ---- etcd metadata backend: libcurl + jansson (etcd v3 JSON gateway) ----
if(FERRY_WITH_ETCD)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(FERRY_CURL IMPORTED_TARGET libcurl)
    pkg_check_modules(FERRY_JANSSON IMPORTED_TARGET jansson)
  endif()
  if(FERRY_CURL_FOUND AND FERRY_JANSSON_FOUND)
    target_sources(ferry PRIVATE ${CMAKE_SOURCE_DIR}/src/meta/etcd_opt_etcd.c)
    target_link_libraries(ferry PRIVATE PkgConfig::FERRY_CURL PkgConfig::FERRY_JANSSON)
    target_compile_definitions(ferry PRIVATE FERRY_HAVE_ETCD)
    message(STATUS "ferry: etcd metadata backend ON")
  else()
    message(STATUS "ferry: etcd metadata backend OFF (libcurl or jansson not found by pkg-config)")
  endif()
endif()

# ---- Redis metadata backend: hiredis ----
if(FERRY_WITH_REDIS)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(FERRY_HIREDIS IMPORTED_TARGET hiredis)
  endif()
  if(FERRY_HIREDIS_FOUND)
    target_sources(ferry PRIVATE ${CMAKE_SOURCE_DIR}/src/meta/redis_opt_redis.c)
    target_link_libraries(ferry PRIVATE PkgConfig::FERRY_HIREDIS)
    target_compile_definitions(ferry PRIVATE FERRY_HAVE_REDIS)
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
    target_sources(ferry PRIVATE ${CMAKE_SOURCE_DIR}/src/core/metrics_http_opt_http.c)
    target_link_libraries(ferry PRIVATE PkgConfig::FERRY_MHD)
    target_compile_definitions(ferry PRIVATE FERRY_HAVE_HTTP)
    message(STATUS "ferry: metrics HTTP endpoint ON")
  else()
    message(STATUS "ferry: metrics HTTP endpoint OFF (libmicrohttpd not found)")
  endif()
endif()
