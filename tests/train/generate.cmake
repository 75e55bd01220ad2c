# scmoe-generate end to end (issue 27, item 1): trains a small model on 2 in-process ranks with a
# checkpoint, then generates from it and checks properties of the tokens, never speeds:
#  - greedy output is the prompt then max-new-tokens bytes, and the stats line is there;
#  - sampling is reproducible: the same seed gives the same text, another seed other text;
#  - 2 in-process expert-parallel ranks (and 2 mpirun processes, with -DMPIRUN) give 1 rank's text;
#  - a batch (--prompts FILE) gives each prompt the text it gets alone (greedy);
#  - the emulated backend says its times are predictions and its text meaningless;
#  - --experts blocking and prefetch (routed experts in host memory) give the resident text, a
#    prefetch cache of one expert too, on 1 rank;
#  - an untrained --preset decodes on emu, and --experts offloading lowers its predicted peak memory;
#    a dense one reports no MoE block latency;
#  - errors name the value: a missing or corrupted checkpoint, a prompt beyond seq_len, max-new-tokens
#    beyond the cache, an expert cache below one expert or outside prefetch, offloading on 2 ranks,
#    --preset off emu, an empty prompt, an unknown --backend, --device off cuda.
# -DGENERATE=scmoe-generate -DTRAIN=scmoe-train -DOUT=dir [-DMPIRUN="mpirun|-np|2|..."]
file(REMOVE_RECURSE ${OUT})
file(MAKE_DIRECTORY ${OUT})
set(shape --batch 4 --layers 2 --hidden 32 --heads 4 --seq 16 --ffn 64 --experts 4 --expert-ffn 32)
execute_process(COMMAND ${TRAIN} --ranks 2 --steps 8 ${shape} --checkpoint-dir ${OUT}/ck RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "scmoe-train failed (${rc}):\n${out}\n${err}")
endif()

# gen(<var> <args...>): runs scmoe-generate on the checkpoint, which must succeed; <var> = its text
# (stdout without the '# ' lines), <var>_all = all of stdout.
function(gen var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  string(REGEX REPLACE "(^|\n)# [^\n]*" "" text "${out}")
  string(REGEX REPLACE "^\n+" "" text "${text}")
  string(REGEX REPLACE "\n+$" "" text "${text}")
  message("${ARGN}:\n${out}")
  set(${var} "${text}" PARENT_SCOPE)
  set(${var}_all "${out}" PARENT_SCOPE)
endfunction()

# refused(<regex> <args...>): scmoe-generate must fail with stderr matching <regex>.
function(refused regex)
  execute_process(COMMAND ${GENERATE} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("refused? ${ARGN}: rc ${rc}: ${err}")
  if(rc EQUAL 0 OR NOT err MATCHES "${regex}")
    message(FATAL_ERROR "scmoe-generate ${ARGN}: expected a failure matching '${regex}', got rc ${rc}:\n${out}\n${err}")
  endif()
endfunction()

set(ck --resume ${OUT}/ck)
gen(greedy ${GENERATE} ${ck} --prompt "The " --max-new-tokens 10)
string(LENGTH "${greedy}" n)
if(NOT greedy MATCHES "^The " OR NOT n EQUAL 14 OR NOT greedy_all MATCHES "# 10 new tokens .* tokens/s; time to first token .* ms; per-token latency .* mean .* p50 .* p90 .* over 9 steps")
  message(FATAL_ERROR "greedy output: '${greedy}'")
endif()

set(sample --prompt "The " --max-new-tokens 12 --temperature 1 --top-k 40)
gen(s5 ${GENERATE} ${ck} ${sample} --seed 5)
gen(s5b ${GENERATE} ${ck} ${sample} --seed 5)
gen(s6 ${GENERATE} ${ck} ${sample} --seed 6)
if(NOT s5 STREQUAL s5b)
  message(FATAL_ERROR "seed 5 twice gave different text:\n'${s5}'\n'${s5b}'")
endif()
if(s5 STREQUAL s6)
  message(FATAL_ERROR "seeds 5 and 6 gave the same text '${s5}'")
endif()
gen(r2 ${GENERATE} ${ck} ${sample} --seed 5 --ranks 2)
gen(r2g ${GENERATE} ${ck} --prompt "The " --max-new-tokens 10 --ranks 2)
if(NOT r2 STREQUAL s5 OR NOT r2g STREQUAL greedy)
  message(FATAL_ERROR "2 ranks differ from 1:\n'${r2}' vs '${s5}'\n'${r2g}' vs '${greedy}'")
endif()
if(MPIRUN)
  string(REPLACE "|" ";" MPIRUN "${MPIRUN}")
  gen(mpi ${MPIRUN} ${GENERATE} ${ck} ${sample} --seed 5)
  if(NOT mpi STREQUAL s5)
    message(FATAL_ERROR "mpirun -np 2 differs from 1 rank: '${mpi}' vs '${s5}'")
  endif()
endif()

# Expert residency: the same text in every mode (the CPU's bits are the same, decoder residency_test).
foreach(mode blocking prefetch)
  gen(mode_text ${GENERATE} ${ck} --prompt "The " --max-new-tokens 10 --experts ${mode})
  if(NOT mode_text STREQUAL greedy OR NOT mode_text_all MATCHES "# experts ${mode}: routed experts in pinned host memory")
    message(FATAL_ERROR "--experts ${mode}: '${mode_text}' vs resident '${greedy}'
${mode_text_all}")
  endif()
endforeach()
# One expert here: [32, 32] + [32, 32] f32 = 8 KiB.
gen(one_slot ${GENERATE} ${ck} --prompt "The " --max-new-tokens 10 --experts prefetch --expert-cache-mib 0.0079)
if(NOT one_slot STREQUAL greedy OR NOT one_slot_all MATCHES "1 device slot")
  message(FATAL_ERROR "--expert-cache-mib of one expert: '${one_slot}' vs '${greedy}'
${one_slot_all}")
endif()

# A batch: each prompt's text is the one it gets alone.
file(WRITE ${OUT}/prompts.txt "The \nyou may\nx\n")
gen(batch ${GENERATE} ${ck} --prompts ${OUT}/prompts.txt --max-new-tokens 10)
set(i 0)
foreach(prompt "The " "you may" "x")
  gen(alone ${GENERATE} ${ck} --prompt "${prompt}" --max-new-tokens 10)
  string(LENGTH "${prompt}" plen)
  string(SUBSTRING "${alone}" ${plen} -1 completion)
  string(FIND "${batch_all}" "[${i}] ${prompt}|${completion}\n" at)
  if(at LESS 0)
    message(FATAL_ERROR "prompt ${i} '${prompt}': its batch line is not '[${i}] ${prompt}|${completion}':\n${batch_all}")
  endif()
  math(EXPR i "${i} + 1")
endforeach()

gen(emu ${GENERATE} ${ck} --prompt "The " --max-new-tokens 6 --backend emu --gpu a30)
# An untrained preset on emu: offloaded experts leave the device (lower predicted peak memory).
foreach(mode resident blocking)
  gen(preset_${mode} ${GENERATE} --preset gpt2-moe-small --variant scmoe-pos2 --backend emu --gpu a30 --prompt "The "
      --max-new-tokens 4 --experts ${mode})
  string(REGEX MATCH "peak ([0-9.]+) MiB" _ "${preset_${mode}_all}")
  set(peak_${mode} ${CMAKE_MATCH_1})
endforeach()
if(NOT peak_resident OR NOT peak_blocking OR NOT peak_blocking LESS peak_resident)
  message(FATAL_ERROR "predicted peak memory: resident '${peak_resident}' MiB, blocking '${peak_blocking}' MiB")
endif()
# A dense model (no MoE block) reports no MoE block latency, rather than a mean over 0 passes.
gen(preset_dense ${GENERATE} --preset gpt2-moe-small --variant dense --backend emu --gpu a30 --prompt "The "
    --max-new-tokens 2)
if(NOT preset_dense_all MATCHES "MoE block latency: none \\(the model has no MoE block\\)" OR
   preset_dense_all MATCHES "over 0 block passes" OR
   NOT preset_resident_all MATCHES "MoE block latency \\(its attention, experts and combine; decode steps\\) mean [0-9.]+ ms over [1-9][0-9]* block passes")
  message(FATAL_ERROR "MoE block latency lines:\n${preset_dense_all}\n${preset_resident_all}")
endif()
if(NOT emu_all MATCHES "the times are the emulator's predictions and the text is meaningless" OR
   NOT emu_all MATCHES "predicted \\(emu\\): 6 new tokens")
  message(FATAL_ERROR "emu output:\n${emu_all}")
endif()

# Errors, each naming the value.
refused("no checkpoint at ${OUT}/none" --resume ${OUT}/none --prompt x --max-new-tokens 4)
file(COPY ${OUT}/ck/step-00000008 DESTINATION ${OUT}/bad)
# One byte more in the copy's dense weights: its size and CRC no longer match manifest.json.
file(APPEND ${OUT}/bad/step-00000008/dense.safetensors "x")
refused("dense.safetensors: checksum mismatch" --resume ${OUT}/bad/step-00000008 --prompt x --max-new-tokens 4)
refused("prompt 0 is 17 bytes, longer than the model's seq_len 16" ${ck} --prompt "seventeen bytes!!")
refused("--max-new-tokens 15 .* at most 14 new tokens" ${ck} --prompt "abc" --max-new-tokens 15)
refused("--expert-cache-mib 0.001: smaller than one expert \\(0.0078125 MiB: w1 \\[32, 32\\] \\+ w2 \\[32, 32\\] f32\\)" ${ck} --prompt "abc" --max-new-tokens 4 --experts prefetch --expert-cache-mib 0.001)
refused("--expert-cache-mib 8: the expert cache is for --experts prefetch, not blocking" ${ck} --prompt "abc" --experts blocking --expert-cache-mib 8)
refused("--experts blocking: single rank only \\(2 expert-parallel ranks\\)" ${ck} --prompt "abc" --max-new-tokens 4 --experts blocking --ranks 2)
refused("--preset tiny: an untrained model is for --backend emu" --preset tiny --prompt "abc")
refused("give exactly one of --resume CKPT" ${ck} --preset tiny --prompt "abc" --backend emu)
refused("--backend tpu: expected cpu, cuda, emu or auto" ${ck} --prompt "abc" --backend tpu)
refused("--device is the GPU of --backend cuda \\(the backend is cpu\\)" ${ck} --prompt "abc" --device 0)
file(WRITE ${OUT}/empty_line.txt "abc\n\nxyz\n")
refused("prompt 1 is empty" ${ck} --prompts ${OUT}/empty_line.txt --max-new-tokens 4)
refused("--temperature -1" ${ck} --prompt "abc" --temperature -1)
