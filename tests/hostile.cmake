# SPDX-License-Identifier: Apache-2.0
# Hostile-input and concurrency tests (issue 15): the raw-peer helpers.
foreach(t test_hostile)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE ferry_fault_support)
    set_property(TEST ${t} APPEND PROPERTY LABELS fault)
  endif()
endforeach()
# The metadata client shared by threads needs the etcd / Redis servers.
if(TEST test_concurrency_meta)
  set_tests_properties(test_concurrency_meta PROPERTIES LABELS "meta;services" TIMEOUT 180)
endif()
# Parsing the metadata records is single-threaded: nothing for TSan.
if(TEST fuzz_meta_replay)
  set_property(TEST fuzz_meta_replay APPEND PROPERTY LABELS no-tsan)
endif()
