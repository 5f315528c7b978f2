# SPDX-License-Identifier: Apache-2.0
# Runs one command and checks both its exit status and its output, which a
# plain add_test cannot do at once (PASS_REGULAR_EXPRESSION ignores the exit
# status; WILL_FAIL ignores the output).
#   cmake -DCMD=<program> -DARGS="<arguments, space separated>"
#         -DEXPECT_RC=<0|nonzero|N> -DEXPECT_REGEX=<regex on stdout+stderr>
#         [-DREJECT_REGEX=<regex that must not appear>] [-DTIMEOUT=<s>]
#         [-DAGAIN_REGEX=<regex> -DATTEMPTS=<n>] -P expect_run.cmake
# AGAIN_REGEX: a run whose output matches it had nothing to check (a fault
# injected at a moment that happened to touch no request) and is run again,
# up to ATTEMPTS runs in all; the last one is checked.
if(NOT DEFINED CMD OR NOT DEFINED EXPECT_RC OR NOT DEFINED EXPECT_REGEX)
  message(FATAL_ERROR "expect_run.cmake: CMD, EXPECT_RC and EXPECT_REGEX are required")
endif()
if(NOT DEFINED TIMEOUT)
  set(TIMEOUT 120)
endif()
if(NOT DEFINED ATTEMPTS)
  set(ATTEMPTS 1)
endif()
separate_arguments(args UNIX_COMMAND "${ARGS}")
foreach(attempt RANGE 1 ${ATTEMPTS})
  execute_process(COMMAND ${CMD} ${args}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT ${TIMEOUT})
  set(all "${out}${err}")
  message("---- ${CMD} ${ARGS}\n---- exit: ${rc} (run ${attempt} of at most ${ATTEMPTS})\n${all}")
  if(NOT DEFINED AGAIN_REGEX OR NOT all MATCHES "${AGAIN_REGEX}")
    break()
  endif()
endforeach()
if(NOT rc MATCHES "^-?[0-9]+$")
  message(FATAL_ERROR "the command did not exit normally: ${rc}")
endif()
if(EXPECT_RC STREQUAL "nonzero")
  if(rc EQUAL 0)
    message(FATAL_ERROR "expected a non-zero exit status, got 0")
  endif()
elseif(NOT rc EQUAL EXPECT_RC)
  message(FATAL_ERROR "expected exit status ${EXPECT_RC}, got ${rc}")
endif()
if(NOT all MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "the output does not match: ${EXPECT_REGEX}")
endif()
if(DEFINED REJECT_REGEX AND all MATCHES "${REJECT_REGEX}")
  message(FATAL_ERROR "the output matches what it must not: ${REJECT_REGEX}")
endif()
