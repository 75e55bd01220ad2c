# cmake -DPYTHON=<python with torch> -DSCMOE_BUILD_DIR=<build> -DEXAMPLE_SOURCE_DIR=<examples/libtorch>
#       -DWORK_DIR=<scratch> -P libtorch_example.cmake
# examples/libtorch as an outside user builds it: installs the scmoe build into a fresh prefix, configures
# the example against that prefix and the torch wheel's CMake package (torch.utils.cmake_prefix_path of
# PYTHON), builds it, checks --help, runs it and checks that it reports agreement with its libtorch
# reference. Without torch in PYTHON it prints "skipped: torch is not importable by <python>" (the test's
# SKIP_REGULAR_EXPRESSION) and stops.
execute_process(COMMAND ${PYTHON} -c "import sys, torch; sys.stdout.write(torch.utils.cmake_prefix_path + ';' + torch.__version__)"
                RESULT_VARIABLE rc OUTPUT_VARIABLE torch_info ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  string(REGEX MATCH "[^\n]+\n?$" last_line "${err}")
  string(STRIP "${last_line}" last_line)
  message("skipped: torch is not importable by ${PYTHON} (${last_line}); configure with "
          "-DSCMOE_TORCH_PYTHON=<a python with torch> to run the libtorch example")
  return()
endif()
list(GET torch_info 0 torch_prefix)
list(GET torch_info 1 torch_version)
message(STATUS "torch ${torch_version} (${PYTHON}): ${torch_prefix}")

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
include(${CMAKE_CURRENT_LIST_DIR}/run_step.cmake)

run_step("install scmoe" ${CMAKE_COMMAND} --install ${SCMOE_BUILD_DIR} --prefix ${prefix})
if(NOT EXISTS ${prefix}/include/scmoe/interop/dlpack.h OR NOT EXISTS ${prefix}/include/scmoe/third_party/dlpack/dlpack.h
   OR NOT EXISTS ${prefix}/include/scmoe/third_party/dlpack/LICENSE)
  message(FATAL_ERROR "the install lacks scmoe/interop/dlpack.h or the vendored DLPack header and its LICENSE")
endif()
# torch's package by Torch_DIR (a list in CMAKE_PREFIX_PATH would be split by run_step's ARGN).
# A CUDA build of torch makes its package look for the CUDA toolkit; TORCH_CUDA_ARCH_LIST skips its GPU
# probe (the example links torch's CPU library only: examples/libtorch/CMakeLists.txt).
set(cuda_hint)
if(EXISTS /usr/local/cuda)
  set(cuda_hint -DCUDAToolkit_ROOT=/usr/local/cuda)
endif()
run_step("configure examples/libtorch" ${CMAKE_COMMAND} -S ${EXAMPLE_SOURCE_DIR} -B ${WORK_DIR}/build
         -DCMAKE_PREFIX_PATH=${prefix} -DTorch_DIR=${torch_prefix}/Torch -DTORCH_CUDA_ARCH_LIST=9.0 ${cuda_hint})
run_step("build examples/libtorch" ${CMAKE_COMMAND} --build ${WORK_DIR}/build --parallel 2)
set(exe ${WORK_DIR}/build/scmoe_libtorch_moe)
run_step("scmoe_libtorch_moe --help" ${exe} --help)
if(NOT step_output MATCHES "Usage:.*--optimizer.*--rtol")
  message(FATAL_ERROR "scmoe_libtorch_moe --help lacks its usage:\n${step_output}")
endif()
execute_process(COMMAND ${exe} --steps 5 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "\nscmoe libtorch example ok: ")
  message(FATAL_ERROR "scmoe_libtorch_moe: exit ${rc}; its outputs or gradients do not match the libtorch reference "
                      "(table above)")
endif()
foreach(row "y" "grad x" "grad gate_w" "grad expert_w1" "grad expert_w2")
  if(NOT out MATCHES "\n ${row} +[0-9.e+-]+ +[0-9.e+-]+ +[0-9.e+-]+ +ok\n")
    message(FATAL_ERROR "scmoe_libtorch_moe printed no agreement row for '${row}'")
  endif()
endforeach()
