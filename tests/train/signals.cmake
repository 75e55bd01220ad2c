# Stop signals (issue 26, item 3; launch/stop_signals.h), with real signals and real processes
# (signal_stop_test.py: a random point each run, its seed printed; --seed repeats it):
# - SIGTERM at a random step (2 in-process ranks): exit 4, the line naming SIGTERM and the saved
#   step, and --resume auto continues bitwise (every step's loss, lr, grad norm, the final eval loss);
# - SIGTERM inside a save (signal_shim.so, LD_PRELOAD, sends it at one of the save's file-system
#   calls): the save completes and the run stops at that step;
# - two SIGTERMs inside a save: the process dies by SIGTERM at once, the previous checkpoint stays
#   the latest and resumes bitwise;
# - --stop-signals SIGHUP,SIGTERM stops cleanly on SIGHUP; --stop-signals none leaves SIGTERM's
#   default action; without --checkpoint-dir the stop says nothing was saved;
# - under mpirun -np 2: SIGTERM to both ranks or to one (they agree), SIGUSR1 to mpirun (forwarded),
#   SIGTERM to launch/mpirun.sh (which passes SIGUSR1 to mpirun), two SIGTERMs inside each rank's
#   save (the job fails at once, the previous checkpoint resumes bitwise);
# - launch/slurm.sbatch with a fake srun and scontrol on PATH: USR1 to the script (Slurm's
#   --signal=B:USR1@300) stops the task with a save, the script requeues the job once, and the
#   requeued job resumes bitwise, completes and does not requeue.
# Included by tests/train/CMakeLists.txt (uses its _train and _mpirun).
add_test(NAME train_help_stop_signals COMMAND ${_train} --help)
set_tests_properties(train_help_stop_signals PROPERTIES LABELS "train" PASS_REGULAR_EXPRESSION
                     "--stop-signals.*SIGTERM,SIGINT,SIGUSR1")
add_test(NAME train_stop_signals_uncatchable COMMAND ${_train} --stop-signals SIGTERM,SIGKILL)
set_tests_properties(train_stop_signals_uncatchable PROPERTIES LABELS "train" PASS_REGULAR_EXPRESSION
                     "--stop-signals: 'SIGKILL' is not one of .*; SIGKILL cannot be caught")
if(NOT SCMOE_PYTHON3)
  return()
endif()
set(_signal_test ${SCMOE_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/signal_stop_test.py --train ${_train})
add_test(NAME train_signal_stop_at_random_step
         COMMAND ${_signal_test} --mode step --trials 2 --work ${CMAKE_CURRENT_BINARY_DIR}/signal_step)
set_tests_properties(train_signal_stop_at_random_step PROPERTIES LABELS "train;ranks" TIMEOUT 300
                     ENVIRONMENT SCMOE_COMM_TIMEOUT_S=60 PASS_REGULAR_EXPRESSION "2 of 2 trials passed")
add_test(NAME train_slurm_sbatch_stops_saves_requeues
         COMMAND ${_signal_test} --mode slurm --trials 1 --sbatch ${PROJECT_SOURCE_DIR}/launch/slurm.sbatch
                 --work ${CMAKE_CURRENT_BINARY_DIR}/signal_slurm)
set_tests_properties(train_slurm_sbatch_stops_saves_requeues PROPERTIES LABELS "train;ranks" TIMEOUT 300
                     ENVIRONMENT SCMOE_COMM_TIMEOUT_S=60 PASS_REGULAR_EXPRESSION "1 of 1 trials passed")
add_test(NAME train_signal_stop_options
         COMMAND ${_signal_test} --mode options --trials 1 --work ${CMAKE_CURRENT_BINARY_DIR}/signal_options)
set_tests_properties(train_signal_stop_options PROPERTIES LABELS "train;ranks" TIMEOUT 300
                     ENVIRONMENT SCMOE_COMM_TIMEOUT_S=60 PASS_REGULAR_EXPRESSION "1 of 1 trials passed")
# The shim cannot come before a sanitizer's runtime in the preload order: not in sanitizer builds.
if(NOT SCMOE_SANITIZE)
  add_library(scmoe_test_signal_shim MODULE signal_shim.cpp)
  target_link_libraries(scmoe_test_signal_shim PRIVATE ${CMAKE_DL_LIBS})
  set(_shim --shim $<TARGET_FILE:scmoe_test_signal_shim>)
  add_test(NAME train_signal_during_save_completes_it
           COMMAND ${_signal_test} --mode save --trials 3 ${_shim} --work ${CMAKE_CURRENT_BINARY_DIR}/signal_save)
  add_test(NAME train_signal_second_exits_at_once_keeps_checkpoint
           COMMAND ${_signal_test} --mode second --trials 3 ${_shim} --work ${CMAKE_CURRENT_BINARY_DIR}/signal_second)
  set_tests_properties(train_signal_during_save_completes_it train_signal_second_exits_at_once_keeps_checkpoint
                       PROPERTIES LABELS "train;ranks" TIMEOUT 300 ENVIRONMENT SCMOE_COMM_TIMEOUT_S=60
                       PASS_REGULAR_EXPRESSION "3 of 3 trials passed")
endif()
if(SCMOE_MPI_ENABLED)
  string(JOIN " " _signal_mpirun ${_mpirun})
  add_test(NAME train_mpi_np2_signal_stop_at_random_step
           COMMAND ${_signal_test} --mode mpi-step --trials 2 --mpirun ${_signal_mpirun}
                   --work ${CMAKE_CURRENT_BINARY_DIR}/signal_mpi_step)
  add_test(NAME train_mpi_np2_signal_usr1_to_mpirun
           COMMAND ${_signal_test} --mode mpi-usr1 --trials 1 --mpirun ${_signal_mpirun}
                   --work ${CMAKE_CURRENT_BINARY_DIR}/signal_mpi_usr1)
  set(_signal_mpi_tests train_mpi_np2_signal_stop_at_random_step train_mpi_np2_signal_usr1_to_mpirun)
  if(SCMOE_OPEN_MPI)  # launch/mpirun.sh is for Open MPI
    add_test(NAME train_mpi_np2_signal_to_mpirun_sh
             COMMAND ${_signal_test} --mode mpirun-sh --trials 1 --mpirun ${_signal_mpirun}
                     --mpirun-sh ${PROJECT_SOURCE_DIR}/launch/mpirun.sh --work ${CMAKE_CURRENT_BINARY_DIR}/signal_mpirun_sh)
    set_tests_properties(train_mpi_np2_signal_to_mpirun_sh PROPERTIES PASS_REGULAR_EXPRESSION "1 of 1 trials passed")
    list(APPEND _signal_mpi_tests train_mpi_np2_signal_to_mpirun_sh)
  endif()
  if(NOT SCMOE_SANITIZE)
    add_test(NAME train_mpi_np2_signal_second_exits_at_once_keeps_checkpoint
             COMMAND ${_signal_test} --mode mpi-second --trials 1 ${_shim} --mpirun ${_signal_mpirun}
                     --work ${CMAKE_CURRENT_BINARY_DIR}/signal_mpi_second)
    set_tests_properties(train_mpi_np2_signal_second_exits_at_once_keeps_checkpoint PROPERTIES
                         PASS_REGULAR_EXPRESSION "1 of 1 trials passed")
    list(APPEND _signal_mpi_tests train_mpi_np2_signal_second_exits_at_once_keeps_checkpoint)
  endif()
  set_tests_properties(train_mpi_np2_signal_stop_at_random_step PROPERTIES PASS_REGULAR_EXPRESSION "2 of 2 trials passed")
  set_tests_properties(train_mpi_np2_signal_usr1_to_mpirun PROPERTIES PASS_REGULAR_EXPRESSION "1 of 1 trials passed")
  set_tests_properties(${_signal_mpi_tests} PROPERTIES LABELS "train;mpi" TIMEOUT 300 RUN_SERIAL TRUE
                       ENVIRONMENT "${SCMOE_MPI_TEST_ENV};SCMOE_COMM_TIMEOUT_S=60")
endif()
