# The installed executables and Python helpers start from a prefix, as a user runs them: installs
# the build into WORK_DIR/prefix, moves the prefix elsewhere (so nothing can rely on where it was
# installed, nor on the build folder), and runs each tool there with a clean environment (env -i:
# no LD_LIBRARY_PATH, PATH or anything else the build's shell had): `--help`, then one short real
# run of scmoe-bench, scmoe-train, scmoe-generate, scmoe-plan and make_profile.py. Also checks that no installed
# binary's run path names the build folder.
#   cmake -DSCMOE_BUILD_DIR=... -DWORK_DIR=... -P installed_tools.cmake
file(REMOVE_RECURSE ${WORK_DIR})
set(installed ${WORK_DIR}/installed)
set(prefix ${WORK_DIR}/moved/prefix)

include(${CMAKE_CURRENT_LIST_DIR}/run_step.cmake)

# Runs `env -i <tool> <args...>` in WORK_DIR; fails unless it exits 0 and prints `expected`.
function(run_clean tool expected)
  string(REPLACE ";" " " args "${ARGN}")
  run_step("env -i ${tool} ${args}" env -i ${tool} ${ARGN})
  set(step_output "${step_output}${step_stderr}")
  if(NOT step_output MATCHES "${expected}")
    message(FATAL_ERROR "env -i ${tool} ${args}: its output lacks '${expected}':\n${step_output}")
  endif()
  string(REGEX MATCH "[^\n]*${expected}[^\n]*" line "${step_output}")
  message(STATUS "env -i ${tool} ${args}: ok: ${line}")
endfunction()

run_step("install" ${CMAKE_COMMAND} --install ${SCMOE_BUILD_DIR} --prefix ${installed})
file(MAKE_DIRECTORY ${WORK_DIR}/moved)
file(RENAME ${installed} ${prefix})

set(bin ${prefix}/bin)
set(tools ${prefix}/share/scmoe/tools)
file(GLOB executables ${bin}/*)
file(GLOB scripts ${tools}/*.py)
list(FILTER scripts EXCLUDE REGEX "/torch_peer\\.py$")  # a module the peers import, not a tool
foreach(required scmoe-train scmoe-generate scmoe-bench scmoe-plan)
  if(NOT EXISTS ${bin}/${required})
    message(FATAL_ERROR "${required} was not installed into ${bin}")
  endif()
endforeach()
foreach(required plan_chart.py make_profile.py soak.py torch_peer.py)
  if(NOT EXISTS ${tools}/${required})
    message(FATAL_ERROR "the Python helper ${required} was not installed into ${tools}")
  endif()
endforeach()

# Run paths: relative to the binary ($ORIGIN), never the build folder.
find_program(READELF readelf)
if(READELF)
  file(GLOB libraries ${prefix}/lib*/libscmoe*.so*)
  foreach(binary ${executables} ${libraries})
    if(IS_SYMLINK ${binary})
      continue()
    endif()
    execute_process(COMMAND ${READELF} -d ${binary} OUTPUT_VARIABLE step_output)
    string(REGEX MATCH "\\((RUNPATH|RPATH)\\)[^\n]*" runpath "${step_output}")
    if(NOT runpath MATCHES "\\$ORIGIN")
      message(FATAL_ERROR "${binary}: its run path is not relative to itself: '${runpath}'")
    endif()
    if(runpath MATCHES "${SCMOE_BUILD_DIR}")
      message(FATAL_ERROR "${binary}: its run path names the build folder: '${runpath}'")
    endif()
  endforeach()
endif()

# --help of every installed executable and helper, from a clean environment.
foreach(tool ${executables} ${scripts})
  run_clean(${tool} "[Uu]sage|usage:" --help)
endforeach()

# One short real run of each executable, and make_profile.py on the benchmark's report.
set(out ${WORK_DIR}/runs)
file(MAKE_DIRECTORY ${out})
run_clean(${bin}/scmoe-bench "# Avg train tokens/s *: [0-9]+" layer --backend cpu --tokens 64 --hidden 64
          --ffn 128 -E 4 -n 1 -w 1 -J ${out}/layer.json)
run_clean(${tools}/make_profile.py "\"name\": \"installed-cpu\"" --cpu --name installed-cpu --memcpy-gbps 5
          ${out}/layer.json)
run_clean(${bin}/scmoe-train "scmoe-pos2 +3 +[0-9.]+ +[0-9.]+" --backend cpu --steps 3 --batch 4 --layers 2 --hidden 32 --heads 4
          --seq 16 --ffn 64 --experts 4 --expert-ffn 32 --metrics ${out}/metrics.jsonl --checkpoint-dir ${out}/ck)
run_clean(${bin}/scmoe-generate "# 4 new tokens .* tokens/s" --resume ${out}/ck --prompt abc --max-new-tokens 4)
run_clean(${bin}/scmoe-plan "best: " --preset tiny --gpu a30 --variants top2 --ep 4 -J ${out}/plan.json)
message(STATUS "every installed tool started from the moved prefix ${prefix} with env -i")
