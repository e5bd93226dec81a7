# The GPU path. CPU tests: communication backend choice, NCCL id bootstrap and
# CUDA-aware-MPI fallback; dynamic loss scaling. With the CUDA glue: the GPU
# self-test, which needs a GPU and reports SKIPPED (not passed) without one.
ddp_add_mpi_test(test_backend SOURCES unit/test_backend.cpp NP 1 2 3 4 LABELS comm)
ddp_add_mpi_test(test_loss_scaler SOURCES unit/test_loss_scaler.cpp NP 1 2 3 4 LABELS train)

# One training step of an MLP, a CNN and a ResNet against the CPU build's numbers
# (tests/gpu/step_reference.h5, written by `step_compare write` in the CPU build).
# The CPU build checks that it still reproduces them (tolerance 1e-5 in fp32); the
# GPU build runs the same check on the device (label gpu; skipped without one).
add_executable(step_compare gpu/step_compare.cpp)
target_compile_options(step_compare PRIVATE -Wall -Wextra)
target_link_libraries(step_compare PRIVATE ddp_core)
ddp_reuse_pch(step_compare ddp_core)
if(DDP_ENABLE_CUDA)
  add_test(NAME gpu_step_compare COMMAND step_compare check ${CMAKE_CURRENT_SOURCE_DIR}/gpu/step_reference.h5)
  set_tests_properties(gpu_step_compare PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77 TIMEOUT ${DDP_TEST_TIMEOUT})
  # bf16 on rounded operands in cuDNN's fp32 kernels, the host's arithmetic (its
  # tighter tolerance), where the default runs cuDNN's bf16 kernels
  add_test(NAME gpu_step_compare_rounded COMMAND step_compare check ${CMAKE_CURRENT_SOURCE_DIR}/gpu/step_reference.h5)
  set_tests_properties(gpu_step_compare_rounded PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77
                       TIMEOUT ${DDP_TEST_TIMEOUT} ENVIRONMENT DDP_CUDNN_NARROW=0)
  # fp32 on TF32 tensor cores (train.tf32), held to the bf16 yardstick (step_compare.cpp)
  add_test(NAME gpu_step_compare_tf32
           COMMAND step_compare check --tf32 ${CMAKE_CURRENT_SOURCE_DIR}/gpu/step_reference.h5)
  set_tests_properties(gpu_step_compare_tf32 PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77
                       TIMEOUT ${DDP_TEST_TIMEOUT})
  # batch norm on cuDNN's (DDP_CUDNN_BATCHNORM=1), held to the default's tolerances
  add_test(NAME gpu_step_compare_cudnn_batchnorm
           COMMAND step_compare check ${CMAKE_CURRENT_SOURCE_DIR}/gpu/step_reference.h5)
  set_tests_properties(gpu_step_compare_cudnn_batchnorm PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77
                       TIMEOUT ${DDP_TEST_TIMEOUT} ENVIRONMENT DDP_CUDNN_BATCHNORM=1)
  # the convolutions through cuDNN's graph API (DDP_CUDNN_GRAPH=1), the residual blocks'
  # batch norms on the sums their convolutions write; the default's tolerances
  add_test(NAME gpu_step_compare_cudnn_graph
           COMMAND step_compare check ${CMAKE_CURRENT_SOURCE_DIR}/gpu/step_reference.h5)
  set_tests_properties(gpu_step_compare_cudnn_graph PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77
                       TIMEOUT ${DDP_TEST_TIMEOUT} ENVIRONMENT DDP_CUDNN_GRAPH=1)
else()
  add_test(NAME step_reference_cpu COMMAND step_compare check ${CMAKE_CURRENT_SOURCE_DIR}/gpu/step_reference.h5)
  set_tests_properties(step_reference_cpu PROPERTIES LABELS "unit" TIMEOUT ${DDP_TEST_TIMEOUT})
  # PyTorch's own bf16-against-fp32 gap on step_compare's cases (tests/gpu/torch_amp_gap.py),
  # the yardstick of its bf16 tolerance with cuDNN's bf16 kernels: the tool runs on the CPU.
  if(DDP_TORCH_PYTHON)
    add_test(NAME step_compare_torch_amp_gap
             COMMAND ${DDP_TORCH_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/gpu/torch_amp_gap.py
                     $<TARGET_FILE:step_compare> --seeds 1)
    set_tests_properties(step_compare_torch_amp_gap PROPERTIES LABELS "unit" TIMEOUT 120
                         PASS_REGULAR_EXPRESSION "bottleneck +logits/loss [0-9.e-]+[;] worst tensor")
  endif()
endif()

if(TARGET ddp_cuda)
  # How a convolution's algorithm is chosen from cuDNN's ranking (cuda/conv_search.hpp):
  # host logic over cuDNN's structs (its headers only), so it runs without a GPU.
  ddp_add_test(test_conv_search SOURCES unit/test_conv_search.cpp)
  target_include_directories(test_conv_search PRIVATE $<TARGET_PROPERTY:ddp::cudnn,INTERFACE_INCLUDE_DIRECTORIES>
                                                      ${CUDAToolkit_INCLUDE_DIRS})
  # Exit code of gpu_selftest when no rank has a device (the automake convention).
  set(DDP_GPU_SKIP_CODE 77)
  add_executable(gpu_selftest gpu/gpu_selftest.cpp)
  target_compile_options(gpu_selftest PRIVATE -Wall -Wextra)
  target_compile_definitions(gpu_selftest PRIVATE DDP_GPU_SKIP_CODE=${DDP_GPU_SKIP_CODE})
  target_link_libraries(gpu_selftest PRIVATE ddp_cuda ddp_core)
  add_test(NAME gpu_selftest_np1
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 ${DDP_MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:gpu_selftest> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(gpu_selftest_np1 PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT} LABELS "gpu;mpi" PROCESSORS 1
                       SKIP_RETURN_CODE ${DDP_GPU_SKIP_CODE})
  add_test(NAME gpu_selftest_np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${DDP_MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:gpu_selftest> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(gpu_selftest_np2 PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT} LABELS "gpu;mpi" PROCESSORS 2
                       SKIP_RETURN_CODE ${DDP_GPU_SKIP_CODE})
endif()
