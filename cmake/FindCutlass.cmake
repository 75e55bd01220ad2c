# FindCutlass: provides Cutlass::cutlass, an INTERFACE target carrying CUTLASS's (header-only)
# include folder as a SYSTEM include, so CUTLASS's own headers cannot trip scmoe's -Werror.
# Search order: CUTLASS_HOME (variable or environment; a CUTLASS checkout or install, with
# include/cutlass/cutlass.h); the headers of the pip wheel nvidia-cutlass
# (cutlass_library/source/include), found through the Python interpreter on PATH.
# Sets Cutlass_FOUND and CUTLASS_FOUND, CUTLASS_INCLUDE_DIR, CUTLASS_VERSION.

set(_cutlass_hints)
if(DEFINED CUTLASS_HOME)
  list(APPEND _cutlass_hints ${CUTLASS_HOME})
endif()
if(DEFINED ENV{CUTLASS_HOME})
  list(APPEND _cutlass_hints $ENV{CUTLASS_HOME})
endif()
find_program(_cutlass_python NAMES python3 python)
mark_as_advanced(_cutlass_python)
if(_cutlass_python)
  execute_process(
    # find_spec locates the package without importing it (the wheel may be installed --no-deps).
    COMMAND ${_cutlass_python} -c
            "import importlib.util as u; print(u.find_spec('cutlass_library').submodule_search_locations[0])"
    OUTPUT_VARIABLE _cutlass_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _cutlass_rc)
  if(_cutlass_rc EQUAL 0 AND _cutlass_wheel)
    list(APPEND _cutlass_hints ${_cutlass_wheel}/source)
  endif()
endif()

find_path(CUTLASS_INCLUDE_DIR cutlass/cutlass.h HINTS ${_cutlass_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
if(NOT CUTLASS_INCLUDE_DIR)
  find_path(CUTLASS_INCLUDE_DIR cutlass/cutlass.h)  # system folders
endif()

if(CUTLASS_INCLUDE_DIR AND EXISTS "${CUTLASS_INCLUDE_DIR}/cutlass/version.h")
  file(STRINGS "${CUTLASS_INCLUDE_DIR}/cutlass/version.h" _cutlass_ver REGEX "^#define CUTLASS_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "CUTLASS_${_part} +([0-9]+)" _m "${_cutlass_ver}")
    set(_cutlass_${_part} ${CMAKE_MATCH_1})
  endforeach()
  set(CUTLASS_VERSION "${_cutlass_MAJOR}.${_cutlass_MINOR}.${_cutlass_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Cutlass REQUIRED_VARS CUTLASS_INCLUDE_DIR VERSION_VAR CUTLASS_VERSION)
set(CUTLASS_FOUND ${Cutlass_FOUND})
if(Cutlass_FOUND AND NOT TARGET Cutlass::cutlass)
  add_library(Cutlass::cutlass INTERFACE IMPORTED)
  # IMPORTED targets' include folders are SYSTEM for their consumers; say so anyway.
  set_target_properties(Cutlass::cutlass PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${CUTLASS_INCLUDE_DIR}"
                                                    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${CUTLASS_INCLUDE_DIR}")
endif()
mark_as_advanced(CUTLASS_INCLUDE_DIR)
