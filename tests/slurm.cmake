# Real single-node Slurms on this machine (munged + slurmctld + slurmd, PMIx), each
# started for the tests of label `slurm` that need it and stopped after them, even when
# they fail (CTest fixture cleanup). Everything of one lives in its directory under
# <build>/tests: config, munge key and socket, state, spool, logs; ports are picked free.
# Skipped (77) where Slurm or munge is missing, or not root.
set(DDP_SLURM_TOOLS ${PROJECT_SOURCE_DIR}/tools/slurm)

# ddp_add_slurm_cluster(fixture dir [start options]): tools/slurm/start dir [options]
# as test <fixture>_start (fixture setup) and tools/slurm/stop dir as <fixture>_stop.
function(ddp_add_slurm_cluster fixture dir)
  add_test(NAME ${fixture}_start COMMAND ${DDP_SLURM_TOOLS}/start ${dir} ${ARGN})
  set_tests_properties(${fixture}_start PROPERTIES FIXTURES_SETUP ${fixture} LABELS slurm TIMEOUT 90
                       SKIP_RETURN_CODE 77 RESOURCE_LOCK slurm_cluster)
  add_test(NAME ${fixture}_stop COMMAND ${DDP_SLURM_TOOLS}/stop ${dir})
  set_tests_properties(${fixture}_stop PROPERTIES FIXTURES_CLEANUP ${fixture} LABELS slurm TIMEOUT 60
                       RESOURCE_LOCK slurm_cluster)
endfunction()

# ddp_add_slurm_test(name script timeout [CLUSTER fixture dir]): tests/slurm/<script>
# CLUSTER JOBS DDP_TRAIN E2E PYTHON, run in the test directory (e2e_data/ is there), one
# at a time on the 2-CPU node; on the shared cluster (fixture slurm) unless CLUSTER names another.
function(ddp_add_slurm_test name script timeout)
  cmake_parse_arguments(PARSE_ARGV 3 arg "" "" CLUSTER)
  if(NOT arg_CLUSTER)
    set(arg_CLUSTER slurm ${DDP_SLURM_DIR})
  endif()
  list(GET arg_CLUSTER 0 fixture)
  list(GET arg_CLUSTER 1 dir)
  add_test(NAME slurm_${name}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm/${script} ${dir} ${PROJECT_SOURCE_DIR}/jobs
                   $<TARGET_FILE:ddp_train> ${CMAKE_CURRENT_SOURCE_DIR}/e2e ${DDP_PYTHON})
  set_tests_properties(slurm_${name} PROPERTIES FIXTURES_REQUIRED "${fixture};e2e_data" LABELS slurm
                       TIMEOUT ${timeout} SKIP_RETURN_CODE 77 RESOURCE_LOCK slurm_cluster PROCESSORS 2)
endfunction()

# The shared cluster: a plain node, as the CPU jobs see one.
set(DDP_SLURM_DIR ${CMAKE_CURRENT_BINARY_DIR}/slurm_cluster)
ddp_add_slurm_cluster(slurm ${DDP_SLURM_DIR})

# sbatch -n 2 jobs/cpu.sbatch: srun ddp_train with 2 tasks to completion.
ddp_add_slurm_test(cpu_job cpu_job.sh 240)
# SIGUSR1 through scancel --signal: checkpoint, requeue, resume, same result as
# an uninterrupted job. Needs ddp_train's checkpoint/resume/exit-75 contract.
ddp_add_slurm_test(requeue requeue.sh 600)
# Exit 75 from every task when one is slow to exit, under srun --kill-on-bad-exit:
# srun ends the step at the first exit 75 (SIGTERM, SIGKILL KillWait later); the
# slow task answers the SIGTERM with 75, and the checkpoint loads.
ddp_add_slurm_test(exit75 exit75.sh 180)
# A job array whose two tasks were given one input file: one trains, the other ends at
# start-up in one line naming the first's Slurm job <array>_<task> (the run directory's lock).
ddp_add_slurm_test(array_run_dir array_run_dir.sh 240)
# The job script of README.md's "On a cluster", read from the README: COMPLETED with
# ExitCode 0:0 when ddp_train exits 0; requeued when it exits 75 on SIGUSR1.
ddp_add_slurm_test(readme_job readme_job.sh 180)

# A second private Slurm whose jobs' memory is a consumable resource and a cgroup
# limit (tools/slurm/start --memory-cgroup), started and stopped around its one test:
# a preload under sbatch --mem=360M, one copy per node completes, a copy per rank is
# one line and exit 1, not an out-of-memory kill. Skipped (77) where cgroup v1's memory
# controller cannot be written.
set(DDP_SLURM_MEMORY_DIR ${CMAKE_CURRENT_BINARY_DIR}/slurm_memory_cluster)
ddp_add_slurm_cluster(slurm_memory ${DDP_SLURM_MEMORY_DIR} --memory-cgroup)
ddp_add_slurm_test(memory_limit memory_limit.sh 300 CLUSTER slurm_memory ${DDP_SLURM_MEMORY_DIR})

# A third whose node has 4 stand-in GPUs (tools/slurm/start --gpus=4), around its one
# test: jobs/gpu_node.sbatch, multi_node.sbatch (on one node) and requeue.sbatch with
# the CPU build; each task's CUDA_VISIBLE_DEVICES (all 4 GPUs) and the cores it may run
# on (its --cpus-per-task) as the task itself reads them, COMPLETED with ExitCode 0:0,
# and the requeue after ddp_train's exit 75.
set(DDP_SLURM_GPU_DIR ${CMAKE_CURRENT_BINARY_DIR}/slurm_gpu_cluster)
ddp_add_slurm_cluster(slurm_gpu ${DDP_SLURM_GPU_DIR} --gpus=4)
ddp_add_slurm_test(gpu_templates gpu_templates.sh 240 CLUSTER slurm_gpu ${DDP_SLURM_GPU_DIR})
