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
# The test main prints a failure on a rank other than 0 (the planted one of the last
# rank; the executable exits 1, the test passes on its lines). A GPU build without a
# device skips it, as every test of its main.
# Rank 1's report comes in one piece, each line named; the two ranks' lines reach
# mpiexec in either order.
set(_planted "rank 1: [^\n]*failure in TestMain[.]AFailureOnAnotherRankIsPrinted\nrank 1: [^\n]*\nrank 1: the planted failure of rank 1")
add_executable(test_main_reports unit/test_main_reports.cpp)
target_link_libraries(test_main_reports PRIVATE ddp_test_main)
ddp_reuse_pch(test_main_reports ddp_test_main)
add_test(NAME test_main_reports_np2
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${DDP_MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:test_main_reports> ${MPIEXEC_POSTFLAGS})
set_tests_properties(test_main_reports_np2 PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT} LABELS "mpi;${DDP_GPU_LABEL}train"
  PROCESSORS 2 SKIP_REGULAR_EXPRESSION "skipped: no CUDA device"
  PASS_REGULAR_EXPRESSION "${_planted}.*FAILED on another rank|FAILED on another rank.*${_planted}")
# metrics.jsonl at start-up: the records of steps a run trains again set aside.
ddp_add_test(test_metrics SOURCES unit/test_metrics.cpp LABELS train)
