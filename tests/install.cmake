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
