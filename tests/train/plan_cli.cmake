# scmoe-plan's command line end to end (issue 25): what it prints, and its printed commands accepted
# as is by scmoe-train and scmoe-bench.
#   cmake -DPLAN=... -DTRAIN=... -DBENCH=... -DOUT=dir -DCHECK=<name> -P plan_cli.cmake
file(MAKE_DIRECTORY "${OUT}")
set(tiny --preset tiny --steps 2)

function(run_plan out_var)
  execute_process(COMMAND "${PLAN}" ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "scmoe-plan ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

function(expect text regex what)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "${what}: no match for '${regex}' in:\n${text}")
  endif()
endfunction()

function(expect_not text regex what)
  if(text MATCHES "${regex}")
    message(FATAL_ERROR "${what}: '${regex}' matched in:\n${text}")
  endif()
endfunction()

# A printed line "<prefix>: <program> <args...>" -> the arguments as a list (they hold no spaces).
function(command_args text prefix out_var)
  string(REGEX MATCH "\n${prefix}: [^\n]*" line "${text}")
  if(line STREQUAL "")
    message(FATAL_ERROR "no '${prefix}:' line in:\n${text}")
  endif()
  string(REGEX REPLACE "^\n${prefix}: " "" line "${line}")
  separate_arguments(args UNIX_COMMAND "${line}")
  set(${out_var} ${args} PARENT_SCOPE)
endfunction()

# scmoe-train parses the flags after `marker` on the printed line "<prefix>: ..." (an unknown flag
# fails before --help is read).
function(expect_train_takes text prefix marker what)
  command_args("${text}" "${prefix}" args)
  list(FIND args "${marker}" at)
  math(EXPR at "${at} + 1")
  list(SUBLIST args ${at} -1 args)
  execute_process(COMMAND "${TRAIN}" ${args} --help OUTPUT_QUIET ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "scmoe-train does not take ${what}'s flags ${args}:\n${err}")
  endif()
endfunction()

# Runs the plan's "replay-train:" command in scmoe-train: it must succeed, print `marker`, and
# predict the tokens/s of the plan's first row (the same configuration on the same emulator).
function(expect_train_replay text marker)
  command_args("${text}" "replay-train" targs)
  list(POP_FRONT targs program)
  execute_process(COMMAND "${TRAIN}" ${targs} OUTPUT_VARIABLE tout ERROR_VARIABLE terr RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT tout MATCHES "${marker}")
    message(FATAL_ERROR "scmoe-train ${targs} (${rc}), expected '${marker}':\n${tout}\n${terr}")
  endif()
  string(REGEX MATCH "\n +1  ([a-z0-9-]+) +[0-9]+ +[0-9]+ +[a-z0-9]+ [a-z]+ +[0-9.-]+ +[0-9]+ +[0-9.]+ +([0-9]+)" m "${text}")
  set(plan_tps "${CMAKE_MATCH_2}")
  if(plan_tps STREQUAL "")
    message(FATAL_ERROR "no first row with tokens/s in the plan:\n${text}")
  endif()
  if(NOT tout MATCHES " ${plan_tps} ")
    message(FATAL_ERROR "the plan's ${plan_tps} tokens/s is not scmoe-train's replay:\n${tout}")
  endif()
endfunction()

if(CHECK STREQUAL "replay")
  # Two nodes of 4 GPUs made from the a800-2x8 preset on PCIe with 200 Gb/s NICs: the header says
  # what the cluster is; the replay commands run in scmoe-train and scmoe-bench as printed; the
  # cluster command places 4 ranks per node, and the Slurm line asks for 2 nodes of 4 tasks.
  run_plan(out ${tiny} --gpu a800 --cluster a800-2x8 --gpus-per-node 4 --fabric pcie --nic-gbit-s 200
           --variants top2,scmoe-pos2 --ep 4 --batches 2 --dispatch capacity)
  expect("${out}" "scmoe-plan on a800-2x8[^\n]*: 2 nodes x 4 a800; PCIe" "topology text")
  expect("${out}" "200 Gb/s \\(25 GB/s\\)" "NIC rate in both units")
  expect_not("${out}" "NVLink [0-9]" "no NVLink on --fabric pcie")
  expect_not("${out}" "assumed: one 100 Gb/s" "the overridden NIC's assumption")
  expect("${out}" "assumed: 1 PCIe switch of 4 GPUs per node" "the override's own assumption")
  expect("${out}" "best: mpirun -np 8 --map-by ppr:4:node scmoe-train --backend cuda" "rank placement")
  expect("${out}" "slurm: sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 launch/slurm.sbatch" "slurm")
  expect_train_replay("${out}" "2 nodes x 4 a800; PCIe")
  command_args("${out}" "replay-bench" bargs)
  list(POP_FRONT bargs program)
  execute_process(COMMAND "${BENCH}" ${bargs} -n 1 -w 0 OUTPUT_VARIABLE bout ERROR_VARIABLE berr RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT bout MATCHES "2 nodes x 4 a800; PCIe")
    message(FATAL_ERROR "scmoe-bench ${bargs} (${rc}):\n${bout}\n${berr}")
  endif()
  # The cluster command's and the Slurm line's scmoe-train flags: scmoe-train parses every one (an
  # unknown flag fails before --help is read).
  expect_train_takes("${out}" "best" "scmoe-train" "the cluster command")
  expect_train_takes("${out}" "slurm" "launch/slurm.sbatch" "the Slurm line")
elseif(CHECK STREQUAL "sweep")
  # A NIC-speed sweep: one search per speed and a summary; a faster network is never predicted slower.
  run_plan(out ${tiny} --experts 16 --gpu a800 --cluster a800-2x8 --nic-gbit-s 100,800 --variants top2 --ep 16 --batches 2
           --dispatch capacity -J "${OUT}/sweep.json")
  expect("${out}" "NIC 100 Gb/s \\(12.5 GB/s\\) per node.*NIC 800 Gb/s \\(100 GB/s\\) per node.*NIC-speed sweep" "sweep")
  file(READ "${OUT}/sweep.json" j)
  string(JSON slow GET "${j}" summary 0 tokens_per_s)
  string(JSON fast GET "${j}" summary 1 tokens_per_s)
  string(JSON slow_comm GET "${j}" summary 0 comm_pct)
  string(JSON fast_comm GET "${j}" summary 1 comm_pct)
  if(NOT fast GREATER slow OR NOT fast_comm LESS slow_comm)
    message(FATAL_ERROR "800 Gb/s (${fast} tokens/s, comm ${fast_comm}%) vs 100 Gb/s (${slow}, ${slow_comm}%)")
  endif()
elseif(CHECK STREQUAL "routing")
  # --routing zipf shows in capacity mode: the same configuration drops tokens that balanced routing
  # keeps (capacity factor 1.0), and its dropless run is slower.
  foreach(routing balanced zipf:0.6)
    string(REPLACE ":" "_" tag "${routing}")
    run_plan(out ${tiny} --gpu a800 --variants top2 --ep 8 --batches 4 --capacity-factors 1.0
             --routing ${routing} -J "${OUT}/routing_${tag}.json")
    file(READ "${OUT}/routing_${tag}.json" j)
    string(JSON n LENGTH "${j}" cases)
    math(EXPR last "${n} - 1")
    foreach(i RANGE ${last})
      string(JSON d GET "${j}" cases ${i} dispatch)
      string(JSON dropped_${tag}_${d} GET "${j}" cases ${i} dropped_tokens_per_step)
      string(JSON ms_${tag}_${d} GET "${j}" cases ${i} step_ms)
    endforeach()
  endforeach()
  if(NOT dropped_zipf_0.6_capacity GREATER dropped_balanced_capacity)
    message(FATAL_ERROR "zipf drops ${dropped_zipf_0.6_capacity} per step, balanced ${dropped_balanced_capacity}")
  endif()
  if(NOT dropped_zipf_0.6_dropless EQUAL 0 OR NOT ms_zipf_0.6_dropless GREATER ms_balanced_dropless)
    message(FATAL_ERROR "dropless: zipf ${ms_zipf_0.6_dropless} ms (${dropped_zipf_0.6_dropless} dropped), "
                        "balanced ${ms_balanced_dropless} ms")
  endif()
elseif(CHECK STREQUAL "memory")
  # The headroom marks a candidate that fits the emulated GPU but not beside what it leaves out; the
  # default batch search grows until memory ends and warns at its own limit.
  execute_process(COMMAND "${PLAN}" ${tiny} --gpu a800 --variants top2 --ep 8 --batches 2 --dispatch capacity
                          --memory-headroom 0.999 OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 1)
    message(FATAL_ERROR "scmoe-plan with no candidate that fits: exit ${rc}, expected 1:\n${out}")
  endif()
  expect("${out}" "out of memory with the headroom: peak [0-9.]+ GiB > 0.08 GiB" "headroom")
  expect("${out}" "no candidate fits" "headroom")
  run_plan(out ${tiny} --gpu a800 --variants top2 --ep 8 --dispatch capacity --max-batch 8)
  expect("${out}" "batch 4: [0-9.]+ ms/step.*batch 8: [0-9.]+ ms/step" "the batch search")
  expect("${out}" "warning: the winner's micro-batch 8 is the largest the search tries \\(max 8\\)" "edge warning")
  expect("${out}" "error band -19%\\.\\.\\+69%" "the error band")
elseif(CHECK STREQUAL "slices")
  # One expert per GPU (8 experts, ep 8): a forced piece count is a slice count of the expert's rows,
  # kept as asked (up to 4), not cut to the one local expert, and the printed commands carry it.
  run_plan(out ${tiny} --gpu a800 --experts 8 --variants top2 --ep 8 --batches 2 --chunks 2,4 --dispatch capacity)
  expect("${out}" "replay-train: [^\n]*--chunks 2" "2 slices kept")
  expect("${out}" "\n +[0-9]+ +top2 +8 +1 +4 " "4 slices in the table")
elseif(CHECK STREQUAL "stack")
  # A plan under --stack paper replays under the same stack: the replay commands carry it, and
  # scmoe-train's replay predicts the plan's tokens/s (under the default stack it would not).
  run_plan(out ${tiny} --gpu a800 --variants top2 --ep 8 --batches 2 --dispatch capacity --stack paper)
  expect("${out}" "replay-train: [^\n]* --stack paper[ \n]" "the stack in the train replay")
  expect("${out}" "replay-bench: [^\n]* --stack paper[ \n]" "the stack in the bench replay")
  expect_train_replay("${out}" "stack paper")
else()
  message(FATAL_ERROR "CHECK=${CHECK}: replay, sweep, routing, memory, slices or stack")
endif()
message(STATUS "plan ${CHECK}: ok")
