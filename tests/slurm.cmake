# A real single-node Slurm on this machine (munged + slurmctld + slurmd, PMIx),
# started once for the tests of label `slurm` and stopped after them, even when
# they fail (CTest fixture cleanup). Everything lives in <build>/tests/slurm_cluster:
# config, munge key and socket, state, spool, logs; ports are picked free.
# Skipped (77) where Slurm or munge is missing, or not root.
set(DDP_SLURM_DIR ${CMAKE_CURRENT_BINARY_DIR}/slurm_cluster)
set(DDP_SLURM_TOOLS ${PROJECT_SOURCE_DIR}/tools/slurm)

add_test(NAME slurm_start COMMAND ${DDP_SLURM_TOOLS}/start ${DDP_SLURM_DIR})
set_tests_properties(slurm_start PROPERTIES FIXTURES_SETUP slurm LABELS slurm TIMEOUT 90
                     SKIP_RETURN_CODE 77 RESOURCE_LOCK slurm_cluster)
add_test(NAME slurm_stop COMMAND ${DDP_SLURM_TOOLS}/stop ${DDP_SLURM_DIR})
set_tests_properties(slurm_stop PROPERTIES FIXTURES_CLEANUP slurm LABELS slurm TIMEOUT 60
                     RESOURCE_LOCK slurm_cluster)

# ddp_add_slurm_test(name script): tests/slurm/<script> CLUSTER JOBS DDP_TRAIN E2E PYTHON,
# run in the test directory (e2e_data/ is there), one at a time on the 2-CPU node.
function(ddp_add_slurm_test name script timeout)
  add_test(NAME slurm_${name}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm/${script} ${DDP_SLURM_DIR} ${PROJECT_SOURCE_DIR}/jobs
                   $<TARGET_FILE:ddp_train> ${CMAKE_CURRENT_SOURCE_DIR}/e2e ${DDP_PYTHON})
  set_tests_properties(slurm_${name} PROPERTIES FIXTURES_REQUIRED "slurm;e2e_data" LABELS slurm
                       TIMEOUT ${timeout} SKIP_RETURN_CODE 77 RESOURCE_LOCK slurm_cluster PROCESSORS 2)
endfunction()

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

# A second private Slurm whose jobs' memory is a consumable resource and a cgroup
# limit (tools/slurm/start --memory-cgroup), started and stopped around its one test:
# a preload under sbatch --mem=360M, one copy per node completes, a copy per rank is
# one line and exit 1, not an out-of-memory kill. Skipped (77) where cgroup v1's memory
# controller cannot be written.
set(DDP_SLURM_MEMORY_DIR ${CMAKE_CURRENT_BINARY_DIR}/slurm_memory_cluster)
add_test(NAME slurm_memory_start COMMAND ${DDP_SLURM_TOOLS}/start ${DDP_SLURM_MEMORY_DIR} --memory-cgroup)
set_tests_properties(slurm_memory_start PROPERTIES FIXTURES_SETUP slurm_memory LABELS slurm TIMEOUT 90
                     SKIP_RETURN_CODE 77 RESOURCE_LOCK slurm_cluster)
add_test(NAME slurm_memory_stop COMMAND ${DDP_SLURM_TOOLS}/stop ${DDP_SLURM_MEMORY_DIR})
set_tests_properties(slurm_memory_stop PROPERTIES FIXTURES_CLEANUP slurm_memory LABELS slurm TIMEOUT 60
                     RESOURCE_LOCK slurm_cluster)
add_test(NAME slurm_memory_limit
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm/memory_limit.sh ${DDP_SLURM_MEMORY_DIR} ${PROJECT_SOURCE_DIR}/jobs
                 $<TARGET_FILE:ddp_train> ${CMAKE_CURRENT_SOURCE_DIR}/e2e ${DDP_PYTHON})
set_tests_properties(slurm_memory_limit PROPERTIES FIXTURES_REQUIRED slurm_memory LABELS slurm TIMEOUT 300
                     SKIP_RETURN_CODE 77 RESOURCE_LOCK slurm_cluster PROCESSORS 2)
