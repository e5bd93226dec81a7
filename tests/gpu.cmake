# The GPU path. CPU tests: communication backend choice, NCCL id bootstrap and
# CUDA-aware-MPI fallback; dynamic loss scaling. With the CUDA glue: the GPU
# self-test, which needs a GPU and reports SKIPPED (not passed) without one.
ddp_add_mpi_test(test_backend SOURCES unit/test_backend.cpp NP 1 2 3 4 LABELS comm)
ddp_add_mpi_test(test_loss_scaler SOURCES unit/test_loss_scaler.cpp NP 1 2 3 4 LABELS train)

if(TARGET ddp_cuda)
  # Exit code of gpu_selftest when no rank has a device (the automake convention).
  set(DDP_GPU_SKIP_CODE 77)
  add_executable(gpu_selftest gpu/gpu_selftest.cpp)
  target_compile_options(gpu_selftest PRIVATE -Wall -Wextra)
  target_compile_definitions(gpu_selftest PRIVATE DDP_GPU_SKIP_CODE=${DDP_GPU_SKIP_CODE})
  target_link_libraries(gpu_selftest PRIVATE ddp_cuda ddp_core)
  add_test(NAME gpu_selftest_np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${DDP_MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:gpu_selftest> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(gpu_selftest_np2 PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT} LABELS "gpu;mpi" PROCESSORS 2
                       SKIP_RETURN_CODE ${DDP_GPU_SKIP_CODE})
endif()
