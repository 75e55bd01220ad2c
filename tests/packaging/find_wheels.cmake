# cmake -DSCMOE_SOURCE_DIR=... -DWORK_DIR=... -DPYTHON=... -P find_wheels.cmake
# Lays out CUDA 13-style wheels (site-packages/nvidia/{nccl,cudnn}/{include,lib}, no __init__.py:
# a namespace package) and a cuDNN frontend folder, then configures find_wheels/ with that
# site-packages on PYTHONPATH and no CUDA toolkit hints.
set(wheels ${WORK_DIR}/site-packages)
file(REMOVE_RECURSE ${WORK_DIR})
file(WRITE ${wheels}/nvidia/nccl/include/nccl.h "#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 9\n")
file(WRITE ${wheels}/nvidia/nccl/lib/libnccl.so.2 "")
file(WRITE ${wheels}/nvidia/cudnn/include/cudnn.h "")
file(WRITE ${wheels}/nvidia/cudnn/include/cudnn_version.h
     "#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 19\n#define CUDNN_PATCHLEVEL 0\n")
file(WRITE ${wheels}/nvidia/cudnn/lib/libcudnn.so.9 "")
file(WRITE ${WORK_DIR}/frontend/include/cudnn_frontend.h "")
execute_process(COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${wheels} CUDNN_FRONTEND_HOME=${WORK_DIR}/frontend
                        ${CMAKE_COMMAND} -S ${SCMOE_SOURCE_DIR}/tests/packaging/find_wheels -B ${WORK_DIR}/build
                        -DSCMOE_CMAKE_DIR=${SCMOE_SOURCE_DIR}/cmake -DWHEELS=${wheels}
                        -DPython3_EXECUTABLE=${PYTHON}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the Find modules did not find the namespace wheels (exit ${rc})")
endif()
