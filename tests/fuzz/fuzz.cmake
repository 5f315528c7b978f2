# SPDX-License-Identifier: Apache-2.0
# Fuzz targets for the wire parser, the target's serve path (handshake
# first), the initiator against a hostile target, a whole session as a
# sequence of well-framed frames (stateful), metadata records read
# back from etcd / Redis, and the RDMA group commit's frames.
# - Every build: fuzz_<t>_replay runs the target on its seeds, their
#   prefixes and deterministic mutations (ctest, label fuzz).
# - -DFERRY_FUZZ=ON with clang: fuzz_<t> is a libFuzzer binary (see
#   scripts/fuzz.sh, which builds them and runs each for a bounded time).
set(FERRY_FUZZ_DIR ${CMAKE_CURRENT_SOURCE_DIR}/fuzz)
set(FERRY_FUZZ_REPLAY_wire 20000)
set(FERRY_FUZZ_REPLAY_handshake 2000)
set(FERRY_FUZZ_REPLAY_initiator 1000)
set(FERRY_FUZZ_REPLAY_session 2000)
set(FERRY_FUZZ_REPLAY_meta 5000)
set(FERRY_FUZZ_REPLAY_rdma_group 20000)
foreach(t wire handshake initiator session meta rdma_group)
  add_executable(fuzz_${t}_replay ${FERRY_FUZZ_DIR}/fuzz_${t}.c ${FERRY_FUZZ_DIR}/seeds.c
                                  ${FERRY_FUZZ_DIR}/replay_main.c)
  target_include_directories(fuzz_${t}_replay PRIVATE ${CMAKE_SOURCE_DIR}/src ${FERRY_FUZZ_DIR})
  target_link_libraries(fuzz_${t}_replay PRIVATE ferry Threads::Threads)
  add_test(NAME fuzz_${t}_replay COMMAND fuzz_${t}_replay --mutations ${FERRY_FUZZ_REPLAY_${t}})
  set_tests_properties(fuzz_${t}_replay PROPERTIES LABELS fuzz TIMEOUT 300)
  if(FERRY_FUZZ)
    add_executable(fuzz_${t} ${FERRY_FUZZ_DIR}/fuzz_${t}.c ${FERRY_FUZZ_DIR}/seeds.c)
    target_include_directories(fuzz_${t} PRIVATE ${CMAKE_SOURCE_DIR}/src ${FERRY_FUZZ_DIR})
    target_compile_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
    target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(fuzz_${t} PRIVATE ferry Threads::Threads)
  endif()
endforeach()
