# FindNCCL: provides NCCL::nccl.
# Search order: NCCL's own package config; NCCL_HOME (variable or environment); the CUDA toolkit's
# include/lib folders; the include/lib folders of a pip-installed NCCL wheel (nvidia-nccl-cu*), found
# through the Python interpreter on PATH.
# Sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION.

find_package(NCCL CONFIG QUIET)
if(TARGET NCCL::nccl)
  set(NCCL_FOUND TRUE)
  return()
endif()

set(_nccl_hints)
if(DEFINED NCCL_HOME)
  list(APPEND _nccl_hints ${NCCL_HOME})
endif()
if(DEFINED ENV{NCCL_HOME})
  list(APPEND _nccl_hints $ENV{NCCL_HOME})
endif()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_dir ${CUDAToolkit_INCLUDE_DIRS})
    get_filename_component(_root ${_dir} DIRECTORY)
    list(APPEND _nccl_hints ${_root})
  endforeach()
endif()
find_program(_nccl_python NAMES python3 python)
if(_nccl_python)
  execute_process(
    COMMAND ${_nccl_python} -c "import importlib.util as u; print(u.find_spec('nvidia.nccl').submodule_search_locations[0])"
    OUTPUT_VARIABLE _nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _nccl_rc)
  if(_nccl_rc EQUAL 0 AND _nccl_wheel)
    list(APPEND _nccl_hints ${_nccl_wheel})
  endif()
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _m "${_nccl_ver}")
    set(_nccl_${_part} ${CMAKE_MATCH_1})
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
