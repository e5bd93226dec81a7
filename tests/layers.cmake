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
# The residual blocks' batch norms on the sums their convolutions write with their
# output: cuDNN's graphs in the GPU build (the graph API on), a host stand-in in the
# CPU build, there in the blocked layout and channels-last.
ddp_add_test(layers_conv_stats_test SOURCES layers/conv_stats_test.cpp LABELS layers)
if(DDP_ENABLE_CUDA)
  set_tests_properties(layers_conv_stats_test PROPERTIES ENVIRONMENT DDP_CUDNN_GRAPH=1)
  # cuDNN's engines for the fused graph may all sum with atomics: allowed here, they must run
  add_test(NAME layers_conv_stats_test_nondeterministic COMMAND layers_conv_stats_test)
  set_tests_properties(layers_conv_stats_test_nondeterministic PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT}
                       LABELS "unit;gpu;layers" SKIP_RETURN_CODE 77
                       ENVIRONMENT "DDP_CUDNN_GRAPH=1;DDP_CUDNN_DETERMINISTIC=0")
else()
  add_test(NAME layers_conv_stats_test_nhwc COMMAND layers_conv_stats_test)
  set_tests_properties(layers_conv_stats_test_nhwc PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT} LABELS "unit;layers"
                       ENVIRONMENT DDP_CONV_LAYOUT=nhwc)
endif()
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

# attention in ddp_train: the e2e tiny shards with each sample's 16 values as 4 tokens
# of 4 features (make_sequence_shards.py: the same format, /x (N, 4, 4)); a pre-norm
# causal attention model trains on them on 2 ranks (its loss falls, it beats chance
# on the 3 classes), its checkpoint holds attention's parameters under
# nn.MultiheadAttention's names and shapes, the biases moved from their initial 0; the
# summary lists it; a bad item is one error line.
add_test(NAME e2e_make_sequence_shards
         COMMAND ${DDP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layers/make_sequence_shards.py e2e_data/tiny
                 e2e_data/tiny_seq 4)
set_tests_properties(e2e_make_sequence_shards PROPERTIES FIXTURES_REQUIRED e2e_data FIXTURES_SETUP e2e_seq_data
                     LABELS "e2e;layers" TIMEOUT 60)
set(_seq_data "data.train_files=e2e_data/tiny_seq/train_*.h5" "data.val_files=e2e_data/tiny_seq/val_*.h5")
ddp_add_train_test(attention_np2 NP 2 RUN_DIR runs/attention FIXTURE e2e_seq_data
                   CHECK "--epochs 8 --loss-falls --min-val-acc 0.6"
                   ARGS ${TINY} ${_seq_data} "model.layers=layernorm,attention(2, causal),linear(8),gelu,flatten,linear(3)"
                        train.epochs=8 train.lr=0.03)
set_tests_properties(e2e_attention_np2 PROPERTIES FIXTURES_SETUP attention_run LABELS "e2e;layers")
add_test(NAME e2e_attention_checkpoint
         COMMAND ${DDP_RUN_NEEDS_DEVICE} ${DDP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layers/check_checkpoint_params.py
                 runs/attention 0.weight=4 0.bias=4 1.in_proj_weight=12x4 1.in_proj_bias=12 1.out_proj.weight=4x4
                 1.out_proj.bias=4 2.weight=8x4 2.bias=8 5.weight=3x32 5.bias=3
                 --trained 1.in_proj_bias 1.out_proj.bias)
set_tests_properties(e2e_attention_checkpoint PROPERTIES FIXTURES_REQUIRED attention_run
                     LABELS "e2e;layers;checkpoint" TIMEOUT 60 SKIP_RETURN_CODE 77)
add_test(NAME e2e_attention_summary
         COMMAND ${DDP_RUN_NEEDS_DEVICE} ${DDP_RUN} 1 $<TARGET_FILE:ddp_train> --check ${TINY} ${_seq_data}
                 "model.layers=layernorm,attention(2, causal),linear(8),gelu,flatten,linear(3)"
                 io.run_dir=runs/attention_summary)
set_tests_properties(e2e_attention_summary PROPERTIES FIXTURES_REQUIRED e2e_seq_data LABELS "e2e;layers"
                     TIMEOUT 90 SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION
                     "\n1 +attention\\(2, causal\\) +\\(4, 4\\) +80\n.*check passed")
# On flat samples, and with dropout: one error line each.
ddp_add_error_test(attention_flat_input NP 2
                   REGEX "model.layers\\(1\\) = 'attention\\(2\\)': attention needs a sequence input \\(tokens, features\\) but gets \\(16\\)"
                   ARGS ${TINY} "model.layers=attention(2),linear(3)")
ddp_add_error_test(attention_dropout NP 2
                   REGEX "model.layers\\(1\\) = 'attention\\(2, dropout=0.1\\)': attention: dropout=0.1 is not yet supported \\(attention runs with dropout 0\\)"
                   ARGS ${TINY} "model.layers=attention(2, dropout=0.1),linear(3)")
