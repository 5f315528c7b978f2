# SPDX-License-Identifier: Apache-2.0
# `ferry demo`, the README's first command, on small shapes: it must verify
# every byte and exit 0; with a fault injected it must catch it, explain it
# and exit non-zero. Each test checks the exit status and the output
# together (tests/support/expect_run.cmake).
set(FERRY_DEMO_SMALL "--layers 4 --requests 3 --tokens-min 100 --tokens-max 300")
set(FERRY_DEMO_EXPECT ${CMAKE_CURRENT_SOURCE_DIR}/support/expect_run.cmake)

function(ferry_demo_test name args rc regex)
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} -DCMD=$<TARGET_FILE:ferry_cli> "-DARGS=demo ${args}"
                   -DEXPECT_RC=${rc} "-DEXPECT_REGEX=${regex}" ${ARGN} -P ${FERRY_DEMO_EXPECT})
  set_tests_properties(${name} PROPERTIES TIMEOUT 150 LABELS demo)
endfunction()

# Success (over shm: the ranks are processes of one host): 1:1, then
# mismatched tensor parallelism both ways (staging on the
# decode side, gathering on the prefill side), and the JSON summary.
ferry_demo_test(demo_small "${FERRY_DEMO_SMALL}" 0
                "verified: [1-9][0-9]* bytes, 0 mismatches.*ferry demo: OK" "-DREJECT_REGEX=FAILED")
ferry_demo_test(demo_tp_2_to_1 "${FERRY_DEMO_SMALL} --prefill-tp 2 --decode-tp 1" 0
                "prefill 1 -> decode 0: shm.*verified: [1-9][0-9]* bytes, 0 mismatches")
ferry_demo_test(demo_tp_1_to_2 "${FERRY_DEMO_SMALL} --prefill-tp 1 --decode-tp 2 --quiet" 0
                "prefill 0 -> decode 1: shm.*verified: [1-9][0-9]* bytes, 0 mismatches")
# The paged-KV extremes: one-token pages (every page its own piece, moved
# in vector frames), and the MLA shape (one 1,152 B latent a token and layer,
# one buffer, every TP rank holding it whole) with mismatched TP.
ferry_demo_test(demo_page_1 "${FERRY_DEMO_SMALL} --page 1 --quiet" 0
                "verified: [1-9][0-9]* bytes, 0 mismatches.*ferry demo: OK")
ferry_demo_test(demo_mla "${FERRY_DEMO_SMALL} --mla --page 1 --prefill-tp 2 --decode-tp 1" 0
                "MLA: one 576-element latent.*verified: [1-9][0-9]* bytes, 0 mismatches.*ferry demo: OK")
# The old pipelined schedule (--overlap: transfers start while the ranks
# still fill and check other requests) verifies the same way.
ferry_demo_test(demo_overlap "${FERRY_DEMO_SMALL} --page 1 --overlap --inflight 3" 0
                "timing    transfers overlap.*verified: [1-9][0-9]* bytes, 0 mismatches.*ferry demo: OK")
ferry_demo_test(demo_json "${FERRY_DEMO_SMALL} --json --quiet" 0
                "\"ok\": true.*\"mismatches\": 0.*\"errors\": \\[\\]")

# The verifier can fail: a flipped bit, named by request, layer and page...
ferry_demo_test(demo_catches_corruption "${FERRY_DEMO_SMALL} --quiet --inject corrupt --inject-request 1" nonzero
                "request 1: on arrival, its KV differs from the reference prefill wrote: layer 2 V page [0-9]+ .*expected 0x[0-9a-f]+, got 0x[0-9a-f]+; 1 bytes differ.*verified before stopping: [0-9]+ bytes, 1 mismatches")
# ...a page written over another request's pages...
ferry_demo_test(demo_catches_stray_write "${FERRY_DEMO_SMALL} --quiet --inject stray --inject-request 2" nonzero
                "request 1: .*layer 0 K page [0-9]+ ")
# ...a rank dying mid-transfer (no hang: explained, non-zero)...
ferry_demo_test(demo_decode_dies "${FERRY_DEMO_SMALL} --quiet --inject kill-decode" nonzero
                "FAILED.*decode rank 0 \\(pid [0-9]+, 127.0.0.1:[0-9]+\\): killed by signal 9")
ferry_demo_test(demo_prefill_dies "${FERRY_DEMO_SMALL} --quiet --inject kill-prefill" nonzero
                "FAILED.*prefill rank 0 \\(pid [0-9]+, 127.0.0.1:[0-9]+\\): killed by signal 9")
# ...or stopping (SIGSTOP): the prefill's send times out, or, when the
# prefill is the one stopped, the orchestrator's watchdog (timeout + 5 s)...
ferry_demo_test(demo_decode_freezes "${FERRY_DEMO_SMALL} --quiet --timeout-ms 1000 --inject freeze-decode" nonzero
                "prefill rank 0 \\(pid [0-9]+, 127.0.0.1:[0-9]+\\): (TIMEOUT \\(-400\\)|CANCEL_UNCONFIRMED \\(-412\\)): kv send request [0-9]+ to 127.0.0.1:[0-9]+(#[0-9a-f]+)?: ")
ferry_demo_test(demo_prefill_freezes "${FERRY_DEMO_SMALL} --quiet --timeout-ms 1000 --inject freeze-prefill" nonzero
                "TIMEOUT \\(-400\\): no word from any rank for [0-9.]+ s while transferring.*prefill rank 0 \\(pid [0-9]+, [^)]*\\) is stopped")
# ...and a rank that cannot start reports Ferry's code and detail.
ferry_demo_test(demo_engine_error "${FERRY_DEMO_SMALL} --quiet --transport bogus" nonzero
                "decode rank 0 \\(pid [0-9]+\\): INVALID_ARGUMENT \\(-1\\): config: unknown transport 'bogus'")
ferry_demo_test(demo_bad_shape "--prefill-tp 3" 2 "--prefill-tp 3 and --decode-tp 1 must each divide --heads 8")
