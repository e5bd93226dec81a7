# NCCL between 2 and 4 ranks on the one GPU of a machine: tools/nccl_one_gpu makes each
# rank a host of its own to NCCL (NCCL_HOSTID per rank, NCCL's sockets on loopback), so
# NCCL and ddp_train's comm.backend = 'nccl' take them on one GPU. Real ddp_train runs
# on the tiny set (e2e_data), kept short (an MLP, 10 to 30 steps): the GPU is
# time-sliced between the ranks and the bytes go through sockets. GPU build only; labels gpu, e2e and nccl;
# skipped (77) where nvidia-smi sees no device. `tools/gpu_check nccl` runs them.
# The CPU build runs one of them with itself standing in (below).
set(_nccl_launcher ${PROJECT_SOURCE_DIR}/tools/nccl_one_gpu)
set(_nccl_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
set(_nccl_tiny ${_nccl_e2e}/tiny.nml)
set(_nccl_runs ${DDP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/gpu/nccl_runs.py)
# Unbound ranks (Open MPI binds each of 2 ranks to a core): a rank's main thread, its
# watchdog, NCCL's proxy and socket threads and CUDA's own share no single core while
# the GPU is time-sliced between the ranks (nccl_runs.py and hang.py do the same).
set(_nccl_unbound --bind-to none)
if(DDP_ENABLE_CUDA)
  # ddp_add_nccl_test(name NP n [TIMEOUT t] COMMAND ...): gpu_nccl_<name>, the command
  # under the GPU prefix (exit 77 without a device).
  function(ddp_add_nccl_test name)
    cmake_parse_arguments(T "" "NP;TIMEOUT" "COMMAND" ${ARGN})
    if(NOT T_TIMEOUT)
      set(T_TIMEOUT 300)
    endif()
    add_test(NAME gpu_nccl_${name} COMMAND ${DDP_WITH_GPU} ${T_COMMAND})
    set_tests_properties(gpu_nccl_${name} PROPERTIES FIXTURES_REQUIRED e2e_data LABELS "gpu;e2e;nccl"
                         TIMEOUT ${T_TIMEOUT} PROCESSORS ${T_NP} SKIP_RETURN_CODE 77)
  endfunction()

  # First, the cheapest: gpu_selftest's NCCL checks (all-reduce, broadcast, reduce-
  # scatter, all-gather and the bucketed all-reduce against MPI's) between 2 ranks,
  # its single-rank checks (gpu_selftest_np1's) left out.
  ddp_add_nccl_test(selftest_np2 NP 2 TIMEOUT 180
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${DDP_MPIEXEC_PREFLAGS} ${_nccl_unbound}
            ${_nccl_launcher} $<TARGET_FILE:gpu_selftest> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(gpu_nccl_selftest_np2 PROPERTIES ENVIRONMENT DDP_SELFTEST_ONLY=collectives)
  foreach(np 2 4)
    # tests/gpu/nccl_runs.py's cases (its docstring: what each compares, bitwise or within
    # its stated tolerance): NCCL twice, against MPI staged through pinned memory, and
    # comm.zero = 1, 2 on both paths (equal); the step and its NCCL all-reduces as a CUDA
    # graph (graph); the validation sums against --evaluate on 1 and on np ranks
    # (validation); a NaN gradient on rank 1 skipped by every rank (skip); fp16's loss
    # scale agreed (fp16).
    foreach(case equal graph validation skip fp16)
      # equal is 7 runs (up to 120 s each): more than the default's 300 s where 4 ranks
      # share the GPU.
      set(_limit 300)
      if(case STREQUAL "equal")
        set(_limit 600)
      endif()
      ddp_add_nccl_test(${case}_np${np} NP ${np} TIMEOUT ${_limit}
        COMMAND ${_nccl_runs} ${case} ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:ddp_train> ${_nccl_tiny}
                runs/gpu_nccl_${case}_np${np} --np ${np} --launcher ${_nccl_launcher})
    endforeach()
    # The same NaN gradient with train.nonfinite = 'stop': every rank stops together, in
    # one error line and through MPI_Finalize (tests/e2e/expect_error.sh).
    ddp_add_nccl_test(nonfinite_stop_np${np} NP ${np} TIMEOUT 120
      COMMAND ${_nccl_e2e}/expect_error.sh
              "^error: non-finite gradient at step 3 of epoch 1 \\([0-9]+ values\\) while every rank's loss is finite: the model has diverged"
              -- ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${DDP_MPIEXEC_PREFLAGS} ${_nccl_unbound}
              ${_nccl_launcher} $<TARGET_FILE:ddp_train> ${_nccl_tiny} "model.layers=linear(256),relu,linear(256),relu,linear(3)"
              train.batch_size=4 comm.backend=nccl io.run_dir=runs/gpu_nccl_nonfinite_stop_np${np})
    set_tests_properties(gpu_nccl_nonfinite_stop_np${np} PROPERTIES ENVIRONMENT DDP_INJECT_FAULT=nan_gradient@rank1:step2)
    # A rank stopped (SIGSTOP; the last, then rank 0) mid-run: the watchdog ends the job
    # within comm.timeout_s = 15 plus 12 s (the MPI path's 5, up to 5 for the abort
    # hooks' ncclCommAbort, and 2 for ranks time-sliced on one GPU), its line naming the
    # stopped rank as not arrived; a rank killed (SIGKILL; on 2 ranks the last, on 4
    # rank 0): the job ends as soon, the dead rank named; no rank left running either
    # way (tests/e2e/hang.py). comm.timeout_s also bounds ncclCommInitRank and each
    # first collective's connecting, slower with 4 ranks on one GPU: 15, not the MPI
    # tests' 5.
    set(_hang ${DDP_PYTHON} ${_nccl_e2e}/hang.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:ddp_train> ${_nccl_tiny})
    set(_hang_nccl --np ${np} --timeout-s 15 --slack-s 12 --gpu-build --launcher ${_nccl_launcher} --backend nccl)
    ddp_add_nccl_test(hang_np${np} NP ${np} TIMEOUT 240 COMMAND ${_hang} runs/gpu_nccl_hang_np${np} ${_hang_nccl})
    if(np EQUAL 2)
      set(_killed 1)
    else()
      set(_killed 0)
    endif()
    ddp_add_nccl_test(killed_np${np} NP ${np} TIMEOUT 180
      COMMAND ${_hang} runs/gpu_nccl_killed_np${np} ${_hang_nccl} --kill --stop-rank ${_killed})
  endforeach()
  # Rank 1 stuck at the end of the run before it ends its NCCL communicator
  # (DDP_INJECT_FAULT=stall_end): the job ends within comm.timeout_s, the watchdog's
  # line naming rank 1 as not arrived, wherever rank 0 waits for it: in its own
  # ncclCommDestroy where NCCL waits for the peers of its host, or in the collective
  # closing of the data files after it. Under nccl_one_gpu each rank is a host of
  # its own to NCCL, whose destroy then returns: the closing is where rank 0 waits.
  ddp_add_nccl_test(stall_end_np2 NP 2 TIMEOUT 120
    COMMAND ${_nccl_e2e}/expect_error.sh --one-rank
            "^rank 0 \\([^)]*\\): hang: waited [0-9]+ s \\(comm.timeout_s = 10\\) in (the NCCL communicator's end \\(ncclCommDestroy\\)|the closing of the data files \\(HDF5 through MPI-IO\\)) \\(during the end of the run\\) at step [0-9]+[;] not arrived: rank 1 "
            -- ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${DDP_MPIEXEC_PREFLAGS} ${_nccl_unbound}
            ${_nccl_launcher} $<TARGET_FILE:ddp_train> ${_nccl_tiny} train.epochs=1 comm.backend=nccl comm.timeout_s=10
            io.run_dir=runs/gpu_nccl_stall_end_np2)
  set_tests_properties(gpu_nccl_stall_end_np2 PROPERTIES ENVIRONMENT DDP_INJECT_FAULT=stall_end@rank1)
  # Stopped by SIGUSR1 (exit 75) on one rank count, resumed on another: bitwise where a
  # straight run's checkpoint of the same step, resumed on as many, ends.
  foreach(pair "2;4" "4;3")
    list(GET pair 0 from)
    list(GET pair 1 to)
    ddp_add_nccl_test(resume_np${from}_np${to} NP 4
      COMMAND ${_nccl_runs} resume ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:ddp_train> ${_nccl_tiny}
              runs/gpu_nccl_resume_np${from}_np${to} --np ${from} --np-after ${to} --launcher ${_nccl_launcher})
  endforeach()
else()
  # The CPU build runs nccl_runs.py's resume case with itself standing in (--cpu-build:
  # MPI without the shared window for NCCL), through the launcher: no CPU test holds a
  # stop's checkpoint bitwise to a straight run's of the same step, nor both resumed on
  # another rank count to each other; and CI sees the GPU tests' driver run. Its other
  # cases run by hand there (their paths are zero_equal's, evaluate's, nonfinite's).
  add_test(NAME nccl_runs_cpu_resume_np2_np3
           COMMAND ${_nccl_runs} resume ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:ddp_train> ${_nccl_tiny}
                   runs/nccl_runs_cpu_resume_np2_np3 --np 2 --np-after 3 --launcher ${_nccl_launcher} --cpu-build)
  set_tests_properties(nccl_runs_cpu_resume_np2_np3 PROPERTIES FIXTURES_REQUIRED e2e_data LABELS "e2e;checkpoint"
                       TIMEOUT 120 PROCESSORS 3)
endif()
# Both builds: the launcher's rank (NCCL's host) from the launcher that started it,
# Slurm's only where no other says it (tests/e2e/nccl_one_gpu_rank.sh).
add_test(NAME nccl_one_gpu_rank COMMAND ${_nccl_e2e}/nccl_one_gpu_rank.sh ${_nccl_launcher})
set_tests_properties(nccl_one_gpu_rank PROPERTIES LABELS unit TIMEOUT 30)
