ddp_add_mpi_test(test_equivalence SOURCES train/test_equivalence.cpp NP 1 2 3 4 LABELS train)
target_include_directories(test_equivalence PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/train)
# Preemption signals are read at the step boundary, never by a handler inside a GEMM.
# CPU build only: its GEMMs run on host buffers through oneDNN, where the fault was.
if(NOT DDP_ENABLE_CUDA)
  ddp_add_test(test_signals SOURCES train/test_signals.cpp LABELS train)
endif()
# Non-finite counts and the parameter hashes of comm.check_every (src/train/guards.hpp).
ddp_add_mpi_test(test_guards SOURCES train/test_guards.cpp NP 1 2 3 LABELS train)
# Progress lines' durations and time left (src/train/progress.hpp).
ddp_add_test(test_progress SOURCES train/test_progress.cpp LABELS train)
# train.cuda_graph without a GPU: the start-up plan, the model's obstacles, and the
# capture-and-replay bookkeeping on a recording backend (src/train/step_graph.hpp).
ddp_add_test(test_step_graph SOURCES train/test_step_graph.cpp LABELS train)
