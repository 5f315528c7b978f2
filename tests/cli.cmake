# SPDX-License-Identifier: Apache-2.0
# The CLI end to end: tests/cli/test_cli.sh drives the ferry binary.
add_test(NAME cli COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_cli.sh $<TARGET_FILE:ferry_cli>)
set_tests_properties(cli PROPERTIES TIMEOUT 240)
