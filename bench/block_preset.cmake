# scmoe-bench block --preset swinv2-moe-s-stage3 (and stages 1 and 4) on emulated GPUs: the preset's
# shape as stated in bench/block_presets.cpp (SwinV2-MoE-S, the ScMoE paper's Table 9) reaches the run, the
# emulated run completes with rows for its variants, the report states the preset's assumptions, a
# flag overrides the preset, and 16 ranks (2 nodes) take 16 experts.
#   cmake -DBENCH=/path/to/scmoe-bench -DOUT_DIR=/tmp/out -P block_preset.cmake
cmake_minimum_required(VERSION 3.25)
file(MAKE_DIRECTORY ${OUT_DIR})

function(expect_field text key want)
  string(JSON got GET "${text}" args ${key})
  if(NOT got STREQUAL "${want}")
    message(FATAL_ERROR "args.${key} = ${got}, expected ${want}")
  endif()
endfunction()

# run(name expected-rows args...): runs the block bench on emulated GPUs, sets json_text and out_text.
function(run name rows)
  set(json ${OUT_DIR}/${name}.json)
  file(REMOVE ${json})
  execute_process(COMMAND ${BENCH} block --backend emu ${ARGN} -n 1 -w 0 -J ${json}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: scmoe-bench exited with ${rc}")
  endif()
  file(READ ${json} text)
  string(JSON n LENGTH "${text}" rows)
  if(NOT n EQUAL ${rows})
    message(FATAL_ERROR "${name}: ${n} rows, expected ${rows}")
  endif()
  set(json_text "${text}" PARENT_SCOPE)
  set(out_text "${out}" PARENT_SCOPE)
endfunction()

# One node of 8 emulated A30s (the paper's Table 1 / Fig. 1), the Fig. 8 variants.
run(swin_a30 2 --gpu a30 --ranks 8 --preset swinv2-moe-s-stage3 --variants top2,scmoe-pos2)
expect_field("${json_text}" preset swinv2-moe-s-stage3)
expect_field("${json_text}" hidden 384)
expect_field("${json_text}" ffn 1536)
expect_field("${json_text}" heads 12)
expect_field("${json_text}" kv_heads 12)
expect_field("${json_text}" seq 144)
expect_field("${json_text}" experts 8)
expect_field("${json_text}" activation gelu)
expect_field("${json_text}" capacity_factor 1.25)
expect_field("${json_text}" bidirectional ON)
string(JSON tokens GET "${json_text}" args tokens_per_rank 0)
if(NOT tokens EQUAL 18432)
  message(FATAL_ERROR "tokens per rank ${tokens}, expected 18432 = 128 images x 144")
endif()
foreach(note "preset swinv2-moe-s-stage3: SwinV2-MoE-S stage 3" "preset assumption: 18432 tokens per rank"
        "preset omission: Swin's continuous position bias over the scores is costed only under the paper-swin")
  string(FIND "${out_text}" "${note}" at)
  if(at LESS 0)
    message(FATAL_ERROR "the report does not state '${note}'")
  endif()
endforeach()
# Its attention is bidirectional now: the old omission is gone.
string(FIND "${out_text}" "attention runs causal" at)
if(NOT at LESS 0)
  message(FATAL_ERROR "the report still says the preset's attention runs causal")
endif()

# A flag given overrides the preset's value; 16 ranks on 2 nodes take the paper's 16 experts.
run(swin_2x8 1 --gpu a800 --cluster a800-2x8 --ranks 16 --preset swinv2-moe-s-stage3 --variants scmoe-pos2
    --tokens 1440)
expect_field("${json_text}" experts 16)
expect_field("${json_text}" hidden 384)
string(JSON tokens GET "${json_text}" args tokens_per_rank 0)
if(NOT tokens EQUAL 1440)
  message(FATAL_ERROR "--tokens 1440 did not override the preset: ${tokens}")
endif()
# --bidirectional=false overrides the preset's bidirectional attention.
run(swin_causal 1 --gpu a30 --ranks 8 --preset swinv2-moe-s-stage3 --variants top2 --tokens 1440
    --bidirectional=false)
expect_field("${json_text}" bidirectional OFF)
# The other stages (the whole model, for paper_table.py's Table 1): stage 1 dense at 48x48 patches in
# 12x12 windows, stage 4 with its MoE at 6x6 patches in one 6x6 window. Each: variant, hidden, heads,
# ffn, seq, tokens per rank (128 images x the map).
foreach(stage "1;dense;96;3;384;144;294912" "4;top2;768;24;3072;36;4608")
  list(GET stage 0 s)
  list(GET stage 1 variant)
  run(swin_stage${s} 1 --gpu a30 --ranks 8 --preset swinv2-moe-s-stage${s} --variants ${variant})
  set(i 2)
  foreach(key hidden heads ffn seq)
    list(GET stage ${i} want)
    expect_field("${json_text}" ${key} ${want})
    math(EXPR i "${i} + 1")
  endforeach()
  list(GET stage 6 want)
  string(JSON tokens GET "${json_text}" args tokens_per_rank 0)
  if(NOT tokens EQUAL want)
    message(FATAL_ERROR "stage ${s}: tokens per rank ${tokens}, expected ${want}")
  endif()
endforeach()
message(STATUS "swinv2-moe-s-stage1..4: shapes as stated, emulated runs complete")
