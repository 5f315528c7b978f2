# The round trips of test_transfer run over each transport: the plain test
# gets auto (shm between engines of one host), this one forces TCP.
add_test(NAME test_transfer_tcp COMMAND test_transfer)
set_tests_properties(test_transfer_tcp PROPERTIES TIMEOUT 300
  ENVIRONMENT "FERRY_TRANSPORT=tcp;FERRY_TEST_BIN_DIR=${CMAKE_BINARY_DIR};FERRY_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
