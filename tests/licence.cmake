# SPDX-License-Identifier: Apache-2.0
# Every git-tracked source file carries its SPDX-License-Identifier line
# (scripts/spdx.sh --check lists those that lack it; --fix adds it).
add_test(NAME spdx_headers COMMAND ${CMAKE_SOURCE_DIR}/scripts/spdx.sh --check)
set_tests_properties(spdx_headers PROPERTIES LABELS "licence;no-tsan" TIMEOUT 60)
# The script itself on a small tree: what --check lists, what --fix writes.
add_test(NAME spdx_script COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/licence/check_spdx_script.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(spdx_script PROPERTIES LABELS "licence;no-tsan" TIMEOUT 60)
