# Installs the scmoe build into a fresh prefix, then builds and runs tests/consumer against it twice:
#   1. core only, with find_package(CUDAToolkit / NCCL / MPI) disabled: a CPU-only embedder needs
#      none of them, even when the installed build has the CUDA backend and MPI;
#   2. with the models component (and mpi / nccl when the build has them): the language model.
# Any failing step fails the test.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

include(${CMAKE_CURRENT_LIST_DIR}/run_step.cmake)

run_step("install" ${CMAKE_COMMAND} --install ${SCMOE_BUILD_DIR} --prefix ${prefix})
if(EXISTS ${prefix}/include/scmoe/kernels/cpu OR EXISTS ${prefix}/include/scmoe/moe/detail/moe_layer_buffers.h)
  message(FATAL_ERROR "private headers were installed")
endif()
if(NOT EXISTS ${prefix}/include/scmoe/models/lm.h)
  message(FATAL_ERROR "the language model's headers (models/) were not installed")
endif()

# Configures tests/consumer into WORK_DIR/<dir> with the extra arguments, builds it, runs `exe` and
# checks it printed `expected`.
function(build_and_run_consumer dir exe expected)
  run_step("configure consumer (${dir})" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/${dir}
           -DCMAKE_PREFIX_PATH=${prefix} ${ARGN})
  run_step("build consumer (${dir})" ${CMAKE_COMMAND} --build ${WORK_DIR}/${dir})
  run_step("run ${exe}" ${WORK_DIR}/${dir}/${exe})
  message(STATUS "${exe} said: ${step_output}")
  if(NOT step_output MATCHES "${expected}")
    message(FATAL_ERROR "${exe}'s output lacks '${expected}'")
  endif()
endfunction()

# 1. The core library alone.
build_and_run_consumer(core scmoe_consumer "scmoe consumer ok" -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
                       -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON)

# 2. With components.
set(components models)
if(WITH_MPI)
  list(APPEND components mpi)
endif()
if(WITH_CUDA)
  list(APPEND components nccl)
endif()
string(REPLACE ";" "," components_arg "${components}")
build_and_run_consumer(components scmoe_consumer_lm "scmoe lm consumer ok" "-DSCMOE_CONSUMER_COMPONENTS=${components_arg}")
