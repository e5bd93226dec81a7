# src/model: layers, losses, the model. Gradient checks against central finite
# differences, layer-spec parsing, parameter layout, initialisation, batch invariance.
ddp_add_test(model_layers_test SOURCES model/layers_test.cpp LABELS model CAPPED_ISA_TOO)
ddp_add_test(model_loss_test SOURCES model/loss_test.cpp LABELS model)
ddp_add_test(model_model_test SOURCES model/model_test.cpp LABELS model CAPPED_ISA_TOO)
