# src/model: layers, losses, the model. Gradient checks against central finite
# differences, layer-spec parsing, parameter layout, initialisation, batch invariance.
ddp_add_test(model_layers_test SOURCES model/layers_test.cpp LABELS model CAPPED_ISA_TOO)
ddp_add_test(model_loss_test SOURCES model/loss_test.cpp LABELS model)
ddp_add_test(model_model_test SOURCES model/model_test.cpp LABELS model CAPPED_ISA_TOO)
# The model's channels-last path (the GPU's bf16/fp16 layout, tested on the host):
# oneDNN's convolutions on nhwc and the activations kept so through batch norms,
# pools and blocks, against the unfused NCHW model; the layout test checks that nhwc
# is what was planned.
if(NOT DDP_ENABLE_CUDA)
  add_test(NAME model_model_test_nhwc COMMAND model_model_test --gtest_filter=ModelFusion.*)
  set_tests_properties(model_model_test_nhwc PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT} LABELS "unit;model"
                       ENVIRONMENT DDP_CONV_LAYOUT=nhwc SKIP_RETURN_CODE 77)
endif()
