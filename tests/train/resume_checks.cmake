# scmoe-train's resume checks (issue 26), end to end on 1 in-process rank: a run stopped at step 2,
# then resumed with a changed --lr (refused naming the field and both values, exit 3), with
# --allow-change lr (resumes, the change printed), and with `latest` deleted under --resume auto
# (resumes from step 2 saying so, instead of starting fresh over the old steps and truncating the
# metrics). -DTRAIN -DOUT
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

run(allowed 0 --resume auto --lr 1e-3 --allow-change lr)
expect("${allowed_out}" "# resume: allowed change \\(--allow-change lr\\): lr 0.003 in the checkpoint, 0.001 in this run"
       "an allowed change must be printed")
expect("${allowed_out}" "step +4/4" "the allowed run trains to the end")
