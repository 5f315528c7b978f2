# SPDX-License-Identifier: Apache-2.0
# ferry bench end to end (tests/cli/test_bench.sh): every mode, briefly.
add_test(NAME cli_bench COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_bench.sh $<TARGET_FILE:ferry_cli>)
set_tests_properties(cli_bench PROPERTIES TIMEOUT 120 LABELS no-tsan)
