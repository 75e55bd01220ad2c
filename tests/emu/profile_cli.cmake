# A profile from a measurement, end to end: scmoe-bench gemm on the CPU (-J), launch/make_profile.py
# --cpu turns its report into a profile, scmoe-bench gemm --backend emu --gpu PROFILE runs on it and
# predicts the dense GEMM the report measured.
#   cmake -DBENCH=... -DPYTHON=... -DSCRIPT=.../make_profile.py -DOUT=dir -P profile_cli.cmake
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
execute_process(COMMAND "${BENCH}" gemm --backend cpu -t 256 --hidden 64 --ffn 128 -E 4 --loads balanced -n 2 -w 1
                        -J "${OUT}/gemm.json" RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "scmoe-bench gemm --backend cpu failed (${rc})")
endif()
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" --cpu --name ci-cpu --cores 2 --memcpy-gbps 5 "${OUT}/gemm.json"
                OUTPUT_FILE "${OUT}/cpu.json" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_profile.py failed (${rc})")
endif()
execute_process(COMMAND "${BENCH}" gemm --backend emu --gpu "${OUT}/cpu.json" -t 256 --hidden 64 --ffn 128 -E 4
                        --loads balanced -n 1 -w 0
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "ci-cpu: a CPU as an emulated device")
  message(FATAL_ERROR "scmoe-bench on the profile (${rc}):\n${out}")
endif()
message(STATUS "profile from a measurement: ok")
