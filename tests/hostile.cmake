# Hostile-input and concurrency tests (issue 15): the raw-peer helpers.
foreach(t test_hostile)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE ferry_fault_support)
    set_property(TEST ${t} APPEND PROPERTY LABELS fault)
  endif()
endforeach()
