# TensorBoard scalars (io.tensorboard): the framing without TensorBoard, then a real
# 2-rank run read back with the tensorboard package.
ddp_add_test(test_tensorboard SOURCES unit/test_tensorboard.cpp)

# A python3 with the tensorboard package (not in Debian 12: tools/install_deps --test
# makes the venv /opt/ddp_train-venv with it). Without one the test is skipped (77).
ddp_find_python(DDP_TB_PYTHON "import tensorboard.backend.event_processing.event_accumulator, numpy"
                "python3 with tensorboard, for the TensorBoard test" /opt/ddp_train-venv/bin/python3 ${DDP_PYTHON})
if(NOT TARGET ddp_tensorboard)
  return()  # built without protobuf: io.tensorboard is refused (test_config)
endif()
if(DDP_TB_PYTHON)
  set(_tb_py ${DDP_TB_PYTHON})
else()
  set(_tb_py ${DDP_PYTHON})  # the script exits 77: no tensorboard
endif()
add_test(NAME e2e_tensorboard_np2
         COMMAND ${_tb_py} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/tensorboard_check.py ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:ddp_train> ${CMAKE_CURRENT_SOURCE_DIR}/e2e/tiny.nml runs/tensorboard)
set_tests_properties(e2e_tensorboard_np2 PROPERTIES FIXTURES_REQUIRED e2e_data LABELS e2e TIMEOUT 120
                     PROCESSORS 2 SKIP_RETURN_CODE 77)
