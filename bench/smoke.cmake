# Runs scmoe-bench gemm, layer, attention and a2a at tiny sizes with --check 1 and -J, and checks that each exits 0,
# writes JSON with rows and reports no wrong elements.
#   cmake -DBENCH=/path/to/scmoe-bench -DOUT_DIR=/tmp/out [-DGROUP=single|ranks] -P smoke.cmake
# GROUP single: one rank (gemm, layer, attention); ranks: several in-process ranks (a2a --ranks, layer --ep);
# unset: both.
cmake_minimum_required(VERSION 3.25)
file(MAKE_DIRECTORY ${OUT_DIR})

function(run_bench name)
  set(json ${OUT_DIR}/${name}.json)
  file(REMOVE ${json})
  execute_process(COMMAND ${BENCH} ${ARGN} -J ${json} --check 1 --backend cpu
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: scmoe-bench exited with ${rc}")
  endif()
  file(READ ${json} text)
  string(JSON num_rows LENGTH "${text}" rows)
  string(JSON wrong GET "${text}" wrong)
  string(JSON benchmark GET "${text}" benchmark)
  if(num_rows LESS 1 OR NOT wrong EQUAL 0)
    message(FATAL_ERROR "${name}: ${json} has ${num_rows} rows and wrong = ${wrong}")
  endif()
  message(STATUS "${name}: ${benchmark}, ${num_rows} rows, wrong = 0")
  set(json_text "${text}" PARENT_SCOPE)
endfunction()

# The expert-parallel layer rows carry the all-to-all time and its share of the layer.
function(check_a2a_share name)
  string(JSON share GET "${json_text}" rows 0 a2a_share_pct)
  string(JSON ep GET "${json_text}" rows 0 ep)
  if(share LESS_EQUAL 0 OR share GREATER 100 OR ep LESS 2)
    message(FATAL_ERROR "${name}: a2a_share_pct = ${share}, ep = ${ep}")
  endif()
endfunction()

if(NOT DEFINED GROUP OR GROUP STREQUAL "single")
  run_bench(gemm gemm --tokens 64,100 --hidden 32 --ffn 48 --experts 4 --top-k 2 --loads balanced,zipf
            --provider auto,loop -n 2 -w 1)
  run_bench(layer layer --tokens 40,64 --hidden 32 --ffn 48 --experts 4 --top-k 2 --dispatch capacity,dropless
            --shared-expert --cg -n 2 -w 1)
  run_bench(layer_gelu layer -b 16 -e 64 -f 4 --hidden 16 --ffn 24 --experts 3 --top-k 1 --activation gelu -n 1 -w 0)
  run_bench(layer_top3 layer --tokens 40,64 --hidden 32 --ffn 48 --experts 4 --top-k 3 --dispatch capacity,dropless
            --capacity-factor 1.25 -n 2 -w 1)
  run_bench(attention attention --batch 2 --seq 33,64 --heads 2 --head-dim 8,16 --provider auto,own -n 2 -w 1)
  # Grouped-query attention: 4 query heads on 2 K/V heads, checked against the CPU op.
  run_bench(attention_gqa attention --batch 2 --seq 33 --heads 4 --kv-heads 2 --head-dim 8 --provider auto,own -n 2 -w 1)
endif()

if(NOT DEFINED GROUP OR GROUP STREQUAL "ranks")
  # Expert-parallel layer, in-process ranks: checked against the single-rank layer.
  run_bench(layer_ep2_ranks layer --ep 2 --tokens 40,64 --hidden 32 --ffn 48 --experts 4 --top-k 2
            --dispatch capacity,dropless --shared-expert --cg -n 2 -w 1)
  check_a2a_share(layer_ep2_ranks)
  run_bench(layer_ep2_ranks_top3 layer --ep 2 --tokens 40,64 --hidden 32 --ffn 48 --experts 4 --top-k 3
            --dispatch capacity,dropless --capacity-factor 1.25 --shared-expert --cg -n 2 -w 1)
  run_bench(layer_ep2_ranks_pcie4 layer --ep 2 --tokens 64 --hidden 32 --ffn 48 --experts 4 --link pcie4 -n 2 -w 1)
  check_a2a_share(layer_ep2_ranks_pcie4)
  run_bench(layer_ep4_ranks_custom_link layer --ep 4 --tokens 16,24 --hidden 16 --ffn 24 --experts 8 --top-k 1
            --activation gelu --dispatch dropless --link-gbyte-s 2 --link-latency-us 50 -n 1 -w 0)
  run_bench(a2a_ranks2 a2a -b 8 -e 256K -f 8 --ranks 2 -n 2 -w 1)
  run_bench(a2a_ranks4 a2a -b 8 -e 256K -f 8 --ranks 4 -n 2 -w 1)
  run_bench(a2a_ranks2_pcie4 a2a -b 8 -e 256K -f 8 --ranks 2 -n 2 -w 1 --link pcie4)
  run_bench(a2a_ranks4_custom_link a2a -b 1K -e 64K -f 8 --ranks 4 -n 2 -w 1 --link-gbyte-s 2 --link-latency-us 50)
endif()
