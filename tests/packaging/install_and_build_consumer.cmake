# Installs the scmoe build into a fresh prefix, configures and builds tests/consumer against it with
# find_package(scmoe), and runs the consumer. Any failing step fails the test.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("install" ${CMAKE_COMMAND} --install ${SCMOE_BUILD_DIR} --prefix ${prefix})
if(EXISTS ${prefix}/include/scmoe/kernels/cpu OR EXISTS ${prefix}/include/scmoe/moe/detail/moe_layer_buffers.h)
  message(FATAL_ERROR "private headers were installed")
endif()
run_step("configure consumer" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS})
run_step("build consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step("run consumer" ${WORK_DIR}/build/scmoe_consumer)
message(STATUS "consumer said: ${step_output}")
if(NOT step_output MATCHES "scmoe consumer ok")
  message(FATAL_ERROR "consumer output lacks 'scmoe consumer ok'")
endif()
