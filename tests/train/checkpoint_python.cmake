# Trains 3 steps on 2 in-process ranks (ep 2) with a checkpoint, then lets check_checkpoint.py read
# it with the Python safetensors package. -DTRAIN -DPYTHON -DCHECK -DOUT
file(REMOVE_RECURSE ${OUT})
execute_process(COMMAND ${TRAIN} --ranks 2 --steps 3 --batch 2 --layers 2 --hidden 32 --heads 4 --seq 16 --ffn 64
                        --experts 4 --expert-ffn 32 --checkpoint-dir ${OUT} --quiet
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "scmoe-train failed (${rc}): ${err}")
endif()
execute_process(COMMAND ${PYTHON} ${CHECK} ${OUT} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(rc EQUAL 77)
  message("SKIPPED: the Python safetensors/numpy packages are not installed")
elseif(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_checkpoint.py failed (${rc})")
endif()
