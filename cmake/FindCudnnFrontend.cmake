# FindCudnnFrontend: provides CudnnFrontend::CudnnFrontend (the header-only cuDNN frontend C++ API;
# links cuDNN, the CUDA runtime and NVRTC) and CUDNN::cudnn (libcudnn). Call after find_package(CUDAToolkit).
#
# Frontend headers (cudnn_frontend.h), in order: CUDNN_FRONTEND_HOME (CMake variable or environment;
# the folder holding include/cudnn_frontend.h, or that include folder itself); the include folder of
# the pip wheel nvidia-cudnn-frontend, found through the Python interpreter on PATH
# (`pip install nvidia-cudnn-frontend`).
# cuDNN (cudnn.h, libcudnn.so), in order: CUDNN_HOME or CUDNN_ROOT (variable or environment); the
# CUDA toolkit's include/lib folders; the system's; a pip wheel nvidia-cudnn-cu* (import nvidia.cudnn).
#
# Sets CudnnFrontend_FOUND, CUDNN_FRONTEND_INCLUDE_DIR, CUDNN_FRONTEND_VERSION, CUDNN_INCLUDE_DIR,
# CUDNN_LIBRARY, CUDNN_VERSION. Imported targets' include folders are SYSTEM for their consumers,
# so the frontend's headers are compiled without scmoe's -Werror warnings. cuDNN 9 or newer.

# ---- The frontend headers ------------------------------------------------------------------
set(_cfe_hints)
foreach(_home "${CUDNN_FRONTEND_HOME}" "$ENV{CUDNN_FRONTEND_HOME}")
  if(_home)
    list(APPEND _cfe_hints ${_home})
  endif()
endforeach()
find_program(_cfe_python NAMES python3 python)
mark_as_advanced(_cfe_python)
if(_cfe_python)
  # The wheel installs its headers as <site-packages>/include/...: ask pip's metadata where.
  execute_process(
    COMMAND ${_cfe_python} -c
            "import importlib.metadata as m, os; d = m.distribution('nvidia-cudnn-frontend'); \
f = [p for p in (d.files or []) if str(p).replace(os.sep, '/').endswith('include/cudnn_frontend.h')]; \
print(os.path.dirname(os.path.dirname(str(d.locate_file(f[0])))) if f else '')"
    OUTPUT_VARIABLE _cfe_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _cfe_rc)
  if(_cfe_rc EQUAL 0 AND _cfe_wheel)
    list(APPEND _cfe_hints ${_cfe_wheel})
  endif()
endif()
find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${_cfe_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h)
if(CUDNN_FRONTEND_INCLUDE_DIR AND NOT EXISTS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend.h")
  set(CUDNN_FRONTEND_INCLUDE_DIR CUDNN_FRONTEND_INCLUDE_DIR-NOTFOUND)  # a stale or mistyped cache entry
endif()
if(CUDNN_FRONTEND_INCLUDE_DIR AND EXISTS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h")
  file(STRINGS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h" _cfe_ver
       REGEX "^#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "CUDNN_FRONTEND_${_part}_VERSION +([0-9]+)" _m "${_cfe_ver}")
    set(_cfe_${_part} ${CMAKE_MATCH_1})
  endforeach()
  set(CUDNN_FRONTEND_VERSION "${_cfe_MAJOR}.${_cfe_MINOR}.${_cfe_PATCH}")
endif()

# ---- cuDNN ---------------------------------------------------------------------------------
set(_cudnn_hints)
foreach(_home "${CUDNN_HOME}" "$ENV{CUDNN_HOME}" "${CUDNN_ROOT}" "$ENV{CUDNN_ROOT}")
  if(_home)
    list(APPEND _cudnn_hints ${_home})
  endif()
endforeach()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _cudnn_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
foreach(_dir ${CUDAToolkit_INCLUDE_DIRS})
  get_filename_component(_root ${_dir} DIRECTORY)
  list(APPEND _cudnn_hints ${_root})
endforeach()
if(_cfe_python)
  execute_process(
    COMMAND ${_cfe_python} -c "import importlib.util as u; print(u.find_spec('nvidia.cudnn').submodule_search_locations[0])"
    OUTPUT_VARIABLE _cudnn_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _cudnn_rc)
  if(_cudnn_rc EQUAL 0 AND _cudnn_wheel)
    list(APPEND _cudnn_hints ${_cudnn_wheel})
  endif()
endif()
find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${_cudnn_hints} PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 NAMES_PER_DIR HINTS ${_cudnn_hints}
             PATH_SUFFIXES lib lib64 lib/x64 lib/x86_64-linux-gnu)
if(CUDNN_INCLUDE_DIR)
  foreach(_header cudnn_version.h cudnn.h)
    if(NOT CUDNN_VERSION AND EXISTS "${CUDNN_INCLUDE_DIR}/${_header}")
      file(STRINGS "${CUDNN_INCLUDE_DIR}/${_header}" _cudnn_ver REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
      if(_cudnn_ver)
        foreach(_part MAJOR MINOR PATCHLEVEL)
          string(REGEX MATCH "CUDNN_${_part} +([0-9]+)" _m "${_cudnn_ver}")
          set(_cudnn_${_part} ${CMAKE_MATCH_1})
        endforeach()
        set(CUDNN_VERSION "${_cudnn_MAJOR}.${_cudnn_MINOR}.${_cudnn_PATCHLEVEL}")
      endif()
    endif()
  endforeach()
endif()
set(_cfe_reason_failure)
if(CUDNN_VERSION AND CUDNN_VERSION VERSION_LESS 9)
  set(_cfe_reason_failure "cuDNN ${CUDNN_VERSION} at ${CUDNN_INCLUDE_DIR} is older than 9")
  set(CUDNN_LIBRARY CUDNN_LIBRARY-NOTFOUND)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CudnnFrontend
  REQUIRED_VARS CUDNN_FRONTEND_INCLUDE_DIR CUDNN_INCLUDE_DIR CUDNN_LIBRARY
  VERSION_VAR CUDNN_FRONTEND_VERSION
  REASON_FAILURE_MESSAGE "${_cfe_reason_failure} (frontend: set CUDNN_FRONTEND_HOME or \
pip install nvidia-cudnn-frontend, cuDNN: set CUDNN_HOME)")

if(CudnnFrontend_FOUND)
  if(NOT TARGET CUDNN::cudnn)
    add_library(CUDNN::cudnn UNKNOWN IMPORTED)
    set_target_properties(CUDNN::cudnn PROPERTIES IMPORTED_LOCATION "${CUDNN_LIBRARY}"
                                                  INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
  endif()
  if(NOT TARGET CudnnFrontend::CudnnFrontend)
    add_library(CudnnFrontend::CudnnFrontend INTERFACE IMPORTED)
    set_target_properties(CudnnFrontend::CudnnFrontend PROPERTIES
                          INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_FRONTEND_INCLUDE_DIR}"
                          INTERFACE_LINK_LIBRARIES CUDNN::cudnn)
    # The frontend's headers call the CUDA runtime and NVRTC (its runtime-compiled engines) directly.
    foreach(_cuda_lib CUDA::cudart CUDA::nvrtc)
      if(TARGET ${_cuda_lib})
        set_property(TARGET CudnnFrontend::CudnnFrontend APPEND PROPERTY INTERFACE_LINK_LIBRARIES ${_cuda_lib})
      endif()
    endforeach()
  endif()
endif()
mark_as_advanced(CUDNN_FRONTEND_INCLUDE_DIR CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
