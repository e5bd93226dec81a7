# The data tools written in Python: tools/images_to_h5 on an ImageFolder tree made by
# the test (read back and compared with PIL's and torchvision's transform, corrupt
# files, one-line errors) and tools/make_synthetic_images (format, determinism,
# balance, labels learnable by a nearest-class-mean classifier).
# They need a python3 with numpy, h5py and PIL (python3-pil); without one they are left out.

# tools/bundle_gpu: the CPU build bundled, run in a mount namespace that hides the
# system's MPI and HDF5 (root; label tools). Not in the GPU build, whose programs
# need a device to run.
if(NOT DDP_ENABLE_CUDA)
  add_test(NAME tools_bundle_gpu
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tools/bundle_gpu_test.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  set_tests_properties(tools_bundle_gpu PROPERTIES LABELS "tools;mpi" TIMEOUT 300 PROCESSORS 1
                       FIXTURES_REQUIRED "e2e_data;fashion" SKIP_RETURN_CODE 77)
endif()

# tools/gpu_check off a GPU node: its one-line refusals and its tests part's verdict,
# from a ctest run of a made-up build tree (tests/tools/gpu_check_test.sh).
if(NOT DDP_ENABLE_CUDA)
  add_test(NAME tools_gpu_check
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tools/gpu_check_test.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  set_tests_properties(tools_gpu_check PROPERTIES LABELS tools TIMEOUT 60 PASS_REGULAR_EXPRESSION
                       "gpu_check_test: all passed")
endif()

# tools/h5_to_torch: torchvision's ResNets and ViT and an nn.Sequential through
# torch_to_h5 and back, loaded strictly; its one-line refusals.
if(DDP_TORCH_PYTHON)
  add_test(NAME tools_h5_to_torch
           COMMAND ${DDP_TORCH_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tools/h5_to_torch_test.py ${PROJECT_SOURCE_DIR}/tools)
  set_tests_properties(tools_h5_to_torch PROPERTIES LABELS tools TIMEOUT 120)
endif()

ddp_find_python(DDP_TOOLS_PYTHON "import h5py, numpy, PIL.Image" "python3 with numpy, h5py and PIL, for the tool tests"
                ${DDP_PYTHON} /usr/bin/python3)
if(NOT DDP_TOOLS_PYTHON)
  message(STATUS "No python3 with numpy, h5py and PIL: the tools tests are left out (apt-get install python3-pil)")
  return()
endif()
set(_tools_tests ${CMAKE_CURRENT_SOURCE_DIR}/tools)
add_test(NAME tools_images_to_h5
         COMMAND ${DDP_TOOLS_PYTHON} ${_tools_tests}/images_to_h5_test.py ${PROJECT_SOURCE_DIR}/tools/images_to_h5)
add_test(NAME tools_make_synthetic_images
         COMMAND ${DDP_TOOLS_PYTHON} ${_tools_tests}/make_synthetic_images_test.py
                 ${PROJECT_SOURCE_DIR}/tools/make_synthetic_images)
set_tests_properties(tools_images_to_h5 tools_make_synthetic_images PROPERTIES LABELS tools TIMEOUT 120 PROCESSORS 2)

# tools/scaling_model: its arithmetic on a made-up trace (overlap, no overlap, shared
# cores, a rescaled step, a measured all-reduce table; one-line refusals), and on a
# 1-rank trace of ddp_train's, which carries the buckets the model reduces.
add_test(NAME tools_scaling_model_trace
         COMMAND ${DDP_RUN} 1 $<TARGET_FILE:ddp_train> ${TINY} --trace io.trace_steps=3,8 train.epochs=1
                 comm.bucket_mb=0.05 comm.first_bucket_mb=0.01 io.run_dir=runs/scaling_model_trace)
set_tests_properties(tools_scaling_model_trace PROPERTIES FIXTURES_REQUIRED e2e_data FIXTURES_SETUP
                     scaling_model_trace LABELS tools TIMEOUT 120)
add_test(NAME tools_scaling_model
         COMMAND ${DDP_PYTHON} ${_tools_tests}/scaling_model_test.py ${PROJECT_SOURCE_DIR}/tools
                 scaling_model_test runs/scaling_model_trace/trace/rank0.json)
set_tests_properties(tools_scaling_model PROPERTIES FIXTURES_REQUIRED scaling_model_trace LABELS tools TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "scaling_model_test: all passed")
