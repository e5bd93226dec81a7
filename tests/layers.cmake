# src/model CNN layers: gradient checks, spec errors, numbers against PyTorch,
# SyncBatchNorm across ranks. Labels "unit;layers" (MPI tests: "mpi;layers").
ddp_add_test(layers_grad_test SOURCES layers/grad_test.cpp LABELS layers CAPPED_ISA_TOO)

# Numbers against PyTorch: a fixture writes torch_reference.h5 with the python that
# has torch (DDP_TORCH_PYTHON, tests/CMakeLists.txt); without torch these tests are left out.
if(DDP_TORCH_PYTHON)
  set(_ref ${CMAKE_CURRENT_BINARY_DIR}/torch_reference.h5)
  add_test(NAME layers_torch_reference
           COMMAND ${DDP_TORCH_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layers/torch_reference.py ${_ref})
  set_tests_properties(layers_torch_reference PROPERTIES FIXTURES_SETUP layers_torch TIMEOUT ${DDP_TEST_TIMEOUT}
                       LABELS "unit;layers")
  ddp_add_test(layers_torch_compare_test SOURCES layers/torch_compare_test.cpp LABELS layers CAPPED_ISA_TOO)
  set_tests_properties(layers_torch_compare_test PROPERTIES FIXTURES_REQUIRED layers_torch
                       ENVIRONMENT DDP_TORCH_REFERENCE=${_ref})
  if(NOT DDP_ENABLE_CUDA)
  set_tests_properties(layers_torch_compare_test_isa_avx2 PROPERTIES FIXTURES_REQUIRED layers_torch
                       ENVIRONMENT "DDP_TORCH_REFERENCE=${_ref};ONEDNN_MAX_CPU_ISA=${DDP_CAPPED_ISA}")
  endif()
else()
  message(STATUS "No python3 with torch: the PyTorch comparisons of the layers are left out")
endif()

ddp_add_mpi_test(layers_sync_batchnorm_test SOURCES layers/sync_batchnorm_test.cpp NP 1 2 3 4 LABELS layers)
ddp_add_test(layers_precision_test SOURCES layers/precision_test.cpp LABELS layers CAPPED_ISA_TOO)
if(DDP_ENABLE_CUDA)
  # The GPU's bf16/fp16 convolutions on rounded operands in cuDNN's fp32 kernels
  # (DDP_CUDNN_NARROW=0), beside its default of cuDNN's bf16/fp16 kernels.
  add_test(NAME layers_precision_test_rounded COMMAND layers_precision_test)
  set_tests_properties(layers_precision_test_rounded PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT}
                       LABELS "unit;gpu;layers" SKIP_RETURN_CODE 77 ENVIRONMENT DDP_CUDNN_NARROW=0)
endif()
ddp_add_test(layers_narrow_test SOURCES layers/narrow_test.cpp LABELS layers)
# A library batch norm in the layers against their own kernels: cuDNN's in the GPU
# build (DDP_CUDNN_BATCHNORM=1), a plain host one in the CPU build.
ddp_add_test(layers_library_batchnorm_test SOURCES layers/library_batchnorm_test.cpp LABELS layers)
if(NOT DDP_ENABLE_CUDA)
  # The residual blocks on channels-last (the GPU's narrow layout) on the host:
  # their passes in the element maps' runs, as on the GPU.
  add_test(NAME layers_narrow_test_nhwc COMMAND layers_narrow_test)
  set_tests_properties(layers_narrow_test_nhwc PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT} LABELS "unit;layers"
                       ENVIRONMENT DDP_CONV_LAYOUT=nhwc)
endif()
