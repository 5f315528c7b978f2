# SPDX-License-Identifier: Apache-2.0
# The cluster of issue 13, short: 8 engines (4 prefill, 4 decode) and a
# probe, each in its own network namespace on a bridge, links shaped with
# tbf, a private etcd; one decode engine killed (kill -9) and restarted on
# its address, etcd stopped and restarted. Fails on any corrupted or stale
# byte, a request failing with a code that no fault in progress explains,
# a request or engine that hangs (every wait in the script is bounded and
# ctest's TIMEOUT bounds the rest), or an engine that exits with an error.
# Skipped (77) where network namespaces cannot be created (not root).
# The deadline is 10 s, not the 2 s of the benchmark runs: this machine can
# stall every process for seconds (seen: 6.5 s), which must not read as a
# TIMEOUT no fault explains. A kill is noticed by a closed or refused
# connection, not by the deadline, so the codes are checked all the same.
# Namespaces, nftables and 9 engines on 2 cores: run alone, never in TSan
# (the engines are processes of their own; nothing in-process to check).
add_test(NAME cluster_short
         COMMAND ${CMAKE_SOURCE_DIR}/scripts/cluster.sh --ferry $<TARGET_FILE:ferry_cli>
                 --engines 8 --pattern pairs --rate 100mbit --warmup 3 --duration 20 --churn short
                 --timeout-ms 10000)
set_tests_properties(cluster_short PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE
                     LABELS "cluster;slow;no-tsan")

# The checks can fail: a flipped byte, bytes written into pages their request
# no longer owns, and failures that no logged fault explains (4 engines, 3 s).
set(FERRY_CLUSTER_TINY "--ferry $<TARGET_FILE:ferry_cli> --engines 4 --rate 100mbit --warmup 1 --duration 3")
# A silent kill finds something to catch only when the killed decode had a
# request in flight (usually; not in one CI run: 348 sent, 348 confirmed):
# a run that saw no failed request at all is run again, up to 3 runs (the
# extra arguments of ferry_cluster_catches).
function(ferry_cluster_catches name inject regex)
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} -DCMD=${CMAKE_SOURCE_DIR}/scripts/cluster.sh
                   "-DARGS=${FERRY_CLUSTER_TINY} --inject ${inject}" -DEXPECT_RC=1 "-DEXPECT_REGEX=${regex}"
                   ${ARGN} -DTIMEOUT=150 -P ${CMAKE_CURRENT_SOURCE_DIR}/support/expect_run.cmake)
  set_tests_properties(${name} PROPERTIES TIMEOUT 180 RUN_SERIAL TRUE LABELS "cluster;no-tsan"
                       SKIP_REGULAR_EXPRESSION "cluster: SKIP: ")
endfunction()
ferry_cluster_catches(cluster_catches_corruption corrupt "VIOLATION: 1 corrupted bytes")
ferry_cluster_catches(cluster_catches_stray_write stray "VIOLATION: [0-9]+ (corrupted bytes|stale or stray bytes in free pages)")
ferry_cluster_catches(cluster_catches_unexplained_failure silent-kill
                      "VIOLATION: 10[.]77[.]0[.][0-9]+:17000 -> 10[.]77[.]0[.][0-9]+:17000 failed with [A-Z_]+ at [+][0-9.]+ s: no fault in progress explains that code"
                      "-DAGAIN_REGEX=failed requests by code: none" -DATTEMPTS=3)

# The full mesh (every engine asks every other and serves them): 4 engines,
# 12 sessions, every byte verified; its checks fail on a flipped byte too;
# churn is refused (a mesh engine is everyone's sender).
add_test(NAME cluster_mesh_tiny
         COMMAND ${CMAKE_COMMAND} -DCMD=${CMAKE_SOURCE_DIR}/scripts/cluster.sh
                 "-DARGS=${FERRY_CLUSTER_TINY} --pattern mesh" -DEXPECT_RC=0
                 "-DEXPECT_REGEX=sessions of all engines together: 12.*OK: 0 violations"
                 -DTIMEOUT=150 -P ${CMAKE_CURRENT_SOURCE_DIR}/support/expect_run.cmake)
set_tests_properties(cluster_mesh_tiny PROPERTIES TIMEOUT 180 RUN_SERIAL TRUE LABELS "cluster;no-tsan"
                     SKIP_REGULAR_EXPRESSION "cluster: SKIP: ")
ferry_cluster_catches(cluster_mesh_catches_corruption "corrupt --pattern mesh" "VIOLATION: 1 corrupted bytes")
add_test(NAME cluster_mesh_refuses_churn
         COMMAND ${CMAKE_COMMAND} -DCMD=${CMAKE_SOURCE_DIR}/scripts/cluster.sh
                 "-DARGS=--ferry $<TARGET_FILE:ferry_cli> --pattern mesh --churn short" -DEXPECT_RC=1
                 "-DEXPECT_REGEX=--pattern mesh runs without churn"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/support/expect_run.cmake)
set_tests_properties(cluster_mesh_refuses_churn PROPERTIES LABELS "cluster;no-tsan")
