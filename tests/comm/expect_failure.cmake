# Runs COMMAND (a ;-list) and passes only if it exits non-zero and its output matches EXPECT.
# Used for fault tests, where a zero exit or a missing error message are both failures.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit, got 0")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "exit ${rc}, but the output lacks: ${EXPECT}")
endif()
message("ok: exit ${rc} with the expected error")
