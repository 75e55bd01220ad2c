# run_step(<what> <command...>): runs the command; fails the script naming <what>, the exit status
# and both outputs unless it exits 0. Sets step_output (stdout) and step_stderr in the caller.
# Included by the packaging scripts (install_and_build_consumer, installed_tools, libtorch_example).
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
  set(step_stderr "${err}" PARENT_SCOPE)
endfunction()
