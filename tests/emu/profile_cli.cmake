# A profile from a measurement, end to end: scmoe-bench gemm (and layer) on the CPU (-J),
# launch/make_profile.py --cpu turns each report into a profile, scmoe-bench --backend emu --gpu PROFILE
# runs on it.
#   cmake -DBENCH=... -DPYTHON=... -DSCRIPT=.../make_profile.py -DOUT=dir -P profile_cli.cmake
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
execute_process(COMMAND "${BENCH}" gemm --backend cpu --tokens 256 --hidden 64 --ffn 128 -E 4 --loads balanced -n 2 -w 1
                        -J "${OUT}/gemm.json" RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "scmoe-bench gemm --backend cpu failed (${rc})")
endif()
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" --cpu --name ci-cpu --cores 2 --memcpy-gbps 5 "${OUT}/gemm.json"
                OUTPUT_FILE "${OUT}/cpu.json" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_profile.py failed (${rc})")
endif()
execute_process(COMMAND "${BENCH}" gemm --backend emu --gpu "${OUT}/cpu.json" --tokens 256 --hidden 64 --ffn 128 -E 4
                        --loads balanced -n 1 -w 0
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "ci-cpu: a CPU as an emulated device")
  message(FATAL_ERROR "scmoe-bench on the profile (${rc}):\n${out}")
endif()
# The same from a layer report: its expert GEMMs' rate becomes the profile's.
execute_process(COMMAND "${BENCH}" layer --backend cpu --tokens 64 --hidden 64 --ffn 128 -E 4 --shared-expert -n 1 -w 1
                        -J "${OUT}/layer.json" RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "scmoe-bench layer --backend cpu failed (${rc})")
endif()
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" --cpu --name ci-layer --memcpy-gbps 5 "${OUT}/layer.json"
                OUTPUT_FILE "${OUT}/layer_cpu.json" RESULT_VARIABLE rc)
file(READ "${OUT}/layer_cpu.json" profile)
if(NOT rc EQUAL 0 OR NOT profile MATCHES "layer's expert GEMMs")
  message(FATAL_ERROR "make_profile.py on a layer report (${rc}):\n${profile}")
endif()
execute_process(COMMAND "${BENCH}" layer --backend emu --gpu "${OUT}/layer_cpu.json" --tokens 64 --hidden 64 --ffn 128 -E 4
                        --shared-expert -n 1 -w 0
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "ci-layer: a CPU as an emulated device")
  message(FATAL_ERROR "scmoe-bench layer on the layer profile (${rc}):\n${out}")
endif()
message(STATUS "profile from a measurement: ok")
