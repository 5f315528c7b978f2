# SPDX-License-Identifier: Apache-2.0
# test_crc32c (tests/test_crc32c.c): single-threaded, nothing for TSan.
# `test_crc32c --bench` prints the GB/s table of docs/BENCHMARKS.md.
if(TEST test_crc32c)
  set_tests_properties(test_crc32c PROPERTIES LABELS no-tsan)
endif()
