# src/comm: gradient buckets and their overlapped all-reduce.
ddp_add_mpi_test(test_gradient_reducer SOURCES comm/test_gradient_reducer.cpp NP 1 2 3 4 LABELS comm)
# The hang watchdog does not fire on a busy run (its firing is e2e_fault_hang_np3).
ddp_add_mpi_test(test_watchdog SOURCES comm/test_watchdog.cpp NP 1 2 3 LABELS comm)
# Long waits give the core back: a rank a second late to the waiting all-reduce, the
# barrier, a broadcast and the shared-memory all-reduce; the others spend under 0.2 s
# of CPU waiting for it.
ddp_add_mpi_test(test_mpi_wait SOURCES comm/test_mpi_wait.cpp NP 2 3 LABELS comm)
# The timeline recorder: its window of steps and its JSON (the timeline itself: e2e_trace_np2).
ddp_add_mpi_test(test_trace SOURCES comm/test_trace.cpp NP 1 2 LABELS comm)
# The launcher's word on its tasks, and the line for tasks MPI made separate jobs.
ddp_add_test(test_launch SOURCES comm/test_launch.cpp LABELS comm)
# The room a node's memory cgroup leaves a preload, from made-up v1 and v2 trees.
ddp_add_test(test_memory_room SOURCES comm/test_memory_room.cpp LABELS comm)
