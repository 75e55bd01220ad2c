# Trains 8 steps on 2 in-process ranks with the held-out loss every 4 steps and a checkpoint, then
# evaluates the checkpoint with --eval-only: its eval loss must be the training run's final one, to
# the last digit (the metrics' 17 significant digits, and the printed line). -DTRAIN -DOUT
file(REMOVE_RECURSE ${OUT})
file(MAKE_DIRECTORY ${OUT})
set(shape --ranks 2 --batch 4 --layers 2 --hidden 32 --heads 4 --seq 16 --ffn 64 --experts 4 --expert-ffn 32
          --eval-data default)

# run(<name> <args...>): runs scmoe-train; sets <name>_out to its stdout.
function(run name)
  execute_process(COMMAND ${TRAIN} ${shape} --metrics ${OUT}/${name}.jsonl ${ARGN} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "scmoe-train ${ARGN} failed (${rc}):\n${err}")
  endif()
  set(${name}_out "${out}" PARENT_SCOPE)
endfunction()

# last_eval(<metrics file> <var>): "step:eval_loss" of the last line that has an eval_loss.
function(last_eval file var)
  file(STRINGS ${file} lines)
  set(result "")
  foreach(line IN LISTS lines)
    string(JSON loss ERROR_VARIABLE missing GET "${line}" eval_loss)
    if(NOT missing)
      string(JSON step GET "${line}" step)
      set(result "${step}:${loss}")
    endif()
  endforeach()
  set(${var} "${result}" PARENT_SCOPE)
endfunction()

run(train --steps 8 --eval-every 4 --checkpoint-dir ${OUT}/ck)
run(eval --steps 8 --resume ${OUT}/ck --eval-only)
last_eval(${OUT}/train.jsonl trained)
last_eval(${OUT}/eval.jsonl evaluated)
string(REGEX MATCH "eval step 8: loss [0-9.]+  ppl [0-9.]+" trained_line "${train_out}")
string(REGEX MATCH "eval step [0-9]+: loss [0-9.]+  ppl [0-9.]+" evaluated_line "${eval_out}")
message("training run's final eval: ${trained} (${trained_line})\n--eval-only:               ${evaluated} (${evaluated_line})")
if(trained STREQUAL "" OR NOT trained MATCHES "^8:")
  message(FATAL_ERROR "the training run wrote no eval line for step 8")
endif()
if(NOT trained STREQUAL evaluated OR trained_line STREQUAL "" OR NOT trained_line STREQUAL evaluated_line)
  message(FATAL_ERROR "--eval-only differs from the training run's final eval:\n  ${trained} '${trained_line}'\n"
                      "  ${evaluated} '${evaluated_line}'")
endif()
if(eval_out MATCHES "^step|\nstep ")
  message(FATAL_ERROR "--eval-only trained")
endif()
