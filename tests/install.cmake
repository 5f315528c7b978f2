# SPDX-License-Identifier: Apache-2.0
# `cmake --install` into a temporary prefix, then a user's program built
# against it through pkg-config (shared and --static) and find_package(ferry),
# each running a transfer between two engines on loopback.
find_program(FERRY_PKG_CONFIG_BIN pkg-config)
if(FERRY_PKG_CONFIG_BIN)
  add_test(NAME install_consume
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/check_install.sh ${CMAKE_BINARY_DIR} "${FERRY_SANITIZE}")
  set_tests_properties(install_consume PROPERTIES TIMEOUT 300 LABELS "install;no-tsan"
                       ENVIRONMENT "CC=${CMAKE_C_COMPILER}")
endif()

# A packager's install (tests/install/check_staging.sh): BUILD_TESTING=OFF
# without cmocka, prefix /usr into a DESTDIR, pkg-config with only ferry.pc,
# man ferry-bench, bash completion, and an uninstall that leaves nothing.
# Its own release build of the library and CLI, quick through ccache.
if(FERRY_PKG_CONFIG_BIN)
  add_test(NAME install_staging COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/check_staging.sh ${CMAKE_SOURCE_DIR})
  set_tests_properties(install_staging PROPERTIES TIMEOUT 600 LABELS "install;no-tsan")
endif()

# The committed man pages (man/) match what the CLI prints (scripts/man.sh).
find_program(FERRY_HELP2MAN help2man)
if(FERRY_HELP2MAN)
  add_test(NAME man_pages COMMAND ${CMAKE_SOURCE_DIR}/tests/install/check_man_pages.sh
           $<TARGET_FILE:ferry_cli> ${CMAKE_SOURCE_DIR})
  set_tests_properties(man_pages PROPERTIES LABELS "install;no-tsan" TIMEOUT 120)
endif()
