# src/model CNN and transformer layers: gradient checks, spec errors, numbers against
# PyTorch, SyncBatchNorm across ranks. Labels "unit;layers" (MPI tests: "mpi;layers").
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

# The transformer's layers end to end (layernorm, gelu; tests/e2e.cmake's functions):
# a small MLP with them trains on 2 ranks (its loss falls, it beats chance on the 3
# classes), its checkpoint holds layernorm's weight and bias under PyTorch's names
# and shapes, both moved from their initial 1 and 0; --check's model summary lists
# them; a bad argument is one error line.
ddp_add_train_test(layernorm_gelu_np2 NP 2 RUN_DIR runs/layernorm_gelu FIXTURE e2e_data
                   CHECK "--epochs 3 --loss-falls --min-val-acc 0.6"
                   ARGS ${TINY} "model.layers=flatten,linear(64),layernorm,gelu,linear(3)" train.epochs=3)
set_tests_properties(e2e_layernorm_gelu_np2 PROPERTIES FIXTURES_SETUP layernorm_gelu_run LABELS "e2e;layers")
add_test(NAME e2e_layernorm_gelu_checkpoint
         COMMAND ${DDP_RUN_NEEDS_DEVICE} ${DDP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layers/check_checkpoint_params.py
                 runs/layernorm_gelu 1.weight=64x16 1.bias=64 2.weight=64 2.bias=64 4.weight=3x64 4.bias=3
                 --trained 2.weight 2.bias)
set_tests_properties(e2e_layernorm_gelu_checkpoint PROPERTIES FIXTURES_REQUIRED layernorm_gelu_run
                     LABELS "e2e;layers;checkpoint" TIMEOUT 60 SKIP_RETURN_CODE 77)
add_test(NAME e2e_layernorm_gelu_summary
         COMMAND ${DDP_RUN_NEEDS_DEVICE} ${DDP_RUN} 1 $<TARGET_FILE:ddp_train> --check ${TINY}
                 "model.layers=flatten,linear(64),layernorm,gelu(tanh),linear(3)" io.run_dir=runs/layernorm_gelu_summary)
set_tests_properties(e2e_layernorm_gelu_summary PROPERTIES FIXTURES_REQUIRED e2e_data LABELS "e2e;layers"
                     TIMEOUT 90 SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION
                     "\n2 +layernorm +\\(64\\) +128\n3 +gelu\\(tanh\\) +\\(64\\) +0\n.*check passed")
ddp_add_error_test(gelu_argument NP 2
                   REGEX "model.layers\\(3\\) = 'gelu\\(foo\\)': gelu takes 0 arguments, got 1; usage: gelu\\[\\(tanh\\)\\]"
                   ARGS ${TINY} "model.layers=flatten,linear(8),gelu(foo),linear(3)")
ddp_add_error_test(layernorm_argument NP 2
                   REGEX "model.layers\\(3\\) = 'layernorm\\(3\\)': layernorm takes 0 arguments, got 1; usage: layernorm\\[\\(eps=e\\)\\]"
                   ARGS ${TINY} "model.layers=flatten,linear(8),layernorm(3),linear(3)")
