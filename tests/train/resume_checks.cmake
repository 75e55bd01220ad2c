# scmoe-train's resume checks (issue 26), end to end on 1 in-process rank: a run stopped at step 2,
# then resumed with a changed --lr (refused naming the field and both values, exit 3), with
# --allow-change lr (resumes, the change printed), and with `latest` deleted under --resume auto
# (resumes from step 2 saying so, instead of starting fresh over the old steps and truncating the
# metrics); a resume from a step before the last one logged (the newest checkpoint lost) logs each
# step once; a fresh run over the checkpoints is refused, and with --overwrite deletes them;
# --eval-only of a checkpoint takes other training settings (it trains nothing).
# -DTRAIN -DOUT
file(REMOVE_RECURSE ${OUT})
file(MAKE_DIRECTORY ${OUT})
set(shape --steps 4 --batch 4 --layers 2 --hidden 32 --heads 4 --seq 16 --ffn 64 --experts 4 --expert-ffn 32
          --log-every 1 --checkpoint-dir ${OUT}/ck --metrics ${OUT}/metrics.jsonl)

# run(<name> <expected exit> <args...>): runs scmoe-train; sets <name>_out to its stdout and stderr.
function(run name expected)
  execute_process(COMMAND ${TRAIN} ${shape} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL expected)
    message(FATAL_ERROR "scmoe-train ${ARGN}: exit ${rc}, expected ${expected}")
  endif()
  set(${name}_out "${out}${err}" PARENT_SCOPE)
endfunction()

# expect(<text> <regex> <why>)
function(expect text regex why)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "${why}: no match for '${regex}'")
  endif()
endfunction()

run(first 0 --stop-at 2)
run(changed_lr 3 --resume auto --lr 1e-3)
expect("${changed_lr_out}" "the training settings differ: lr 0.003 in the checkpoint, 0.001 in this run: refusing to resume \\(to change them on purpose: --allow-change lr\\)"
       "a changed --lr must be refused naming it and both values")
run(bad_name 2 --resume auto --allow-change lr,bogus)
expect("${bad_name_out}" "--allow-change bogus: not a setting a checkpoint records" "an unknown --allow-change name")

file(REMOVE ${OUT}/ck/latest)
run(no_latest 0 --resume auto --stop-at 3)
expect("${no_latest_out}" "# resume: .*latest is missing: resuming from the newest complete, verified step, [^\n]*step-00000002"
       "--resume auto without `latest` must fall back to the newest step and say so")
expect("${no_latest_out}" "step +3/4" "the resumed run continues at step 3")
if(no_latest_out MATCHES "step +1/4")
  message(FATAL_ERROR "--resume auto without `latest` started fresh")
endif()
file(STRINGS ${OUT}/metrics.jsonl lines)
list(LENGTH lines n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "metrics.jsonl has ${n} lines after steps 1-2 and 3, expected 3 (truncated?)")
endif()

run(eval_only 0 --resume auto --eval-only --eval-data default --lr 1e-3 --batch 2)
expect("${eval_only_out}" "eval step 3: loss [0-9.]+" "--eval-only with other training settings evaluates")
run(allowed 0 --resume auto --lr 1e-3 --allow-change lr)
expect("${allowed_out}" "# resume: allowed change \\(--allow-change lr\\): lr 0.003 in the checkpoint, 0.001 in this run"
       "an allowed change must be printed")
expect("${allowed_out}" "step +4/4" "the allowed run trains to the end")

# metrics.jsonl has steps 1-4; the newest checkpoint (step 4) is lost: the resume from step 3 logs
# step 4 again, and its old line goes.
file(REMOVE_RECURSE ${OUT}/ck/step-00000004)
file(REMOVE ${OUT}/ck/latest)
run(again 0 --resume auto)
expect("${again_out}" "resumed from [^\n]*step-00000003 at step 3" "the fallback to step 3")
file(STRINGS ${OUT}/metrics.jsonl lines)
set(steps "")
foreach(line IN LISTS lines)
  string(JSON eval ERROR_VARIABLE no_eval GET "${line}" eval_loss)
  if(no_eval)  # a step's line (the --eval-only run above added an eval line)
    string(JSON step GET "${line}" step)
    list(APPEND steps ${step})
  endif()
endforeach()
if(NOT steps STREQUAL "1;2;3;4")
  message(FATAL_ERROR "metrics.jsonl steps after the resume: ${steps}, expected 1;2;3;4 (each once)")
endif()

# A fresh run in the directory: refused before any step, naming what is there; --overwrite.
run(fresh 3 --stop-at 1)
expect("${fresh_out}" "the checkpoint directory holds checkpoints \\(step-00000004, step-00000003 of run [0-9a-f]+\\): a fresh run would overwrite them"
       "a fresh run over old checkpoints must be refused")
if(fresh_out MATCHES "step +1/4")
  message(FATAL_ERROR "the refused fresh run trained")
endif()
run(overwrite 0 --stop-at 1 --overwrite)
expect("${overwrite_out}" "# checkpoint dir: --overwrite: deleted the checkpoints in [^\n]*ck \\(step-00000004, step-00000003 of run"
       "--overwrite must say what it deleted")
if(EXISTS ${OUT}/ck/step-00000004 OR NOT EXISTS ${OUT}/ck/step-00000001)
  message(FATAL_ERROR "--overwrite: the old steps must go and the new one be there")
endif()
