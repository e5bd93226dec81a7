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
ddp_add_test(layers_narrow_test SOURCES layers/narrow_test.cpp LABELS layers)
