# Checkpoint crash safety (issue 26, item 2; scmoe/models/checkpoint.h's save protocol), with real
# processes: checkpoint_crash_test.py kills scmoe-train (SIGKILL, crash_shim.so via LD_PRELOAD) at
# every file-system call of the save of step 4, a first save and a re-save after a rollback (also
# without renameat2's RENAME_EXCHANGE, as on NFS), and
# checks that --resume auto then continues bitwise from step 2 or 4 with each step logged once; and
# two trainers on one directory (the second refused naming the holder, a killed holder's lock taken
# over).
# Included by tests/train/CMakeLists.txt (uses its _train). The shim cannot come before a
# sanitizer's runtime in the preload order: not in sanitizer builds.
if(NOT SCMOE_PYTHON3 OR SCMOE_SANITIZE)
  return()
endif()
add_library(scmoe_test_crash_shim MODULE crash_shim.cpp)
target_link_libraries(scmoe_test_crash_shim PRIVATE ${CMAKE_DL_LIBS})
foreach(scenario fresh resave resave-noexchange)
  add_test(NAME train_checkpoint_crash_sweep_${scenario}
           COMMAND ${SCMOE_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_crash_test.py --train ${_train}
                   --shim $<TARGET_FILE:scmoe_test_crash_shim> --scenario ${scenario}
                   --work ${CMAKE_CURRENT_BINARY_DIR}/crash_${scenario})
  set_tests_properties(train_checkpoint_crash_sweep_${scenario} PROPERTIES LABELS "train;ranks;slow" TIMEOUT 600
                       ENVIRONMENT SCMOE_COMM_TIMEOUT_S=60
                       PASS_REGULAR_EXPRESSION "crash points resumed bitwise \\((fresh|resave|resave-noexchange)\\): PASS")
endforeach()
add_test(NAME train_checkpoint_dir_locked_by_another_trainer
         COMMAND ${SCMOE_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_crash_test.py --train ${_train}
                 --shim $<TARGET_FILE:scmoe_test_crash_shim> --scenario lock
                 --work ${CMAKE_CURRENT_BINARY_DIR}/checkpoint_lock)
set_tests_properties(train_checkpoint_dir_locked_by_another_trainer PROPERTIES LABELS "train;ranks" TIMEOUT 300
                     ENVIRONMENT SCMOE_COMM_TIMEOUT_S=60 PASS_REGULAR_EXPRESSION "\\(lock\\): PASS")
