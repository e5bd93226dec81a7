# Data pipeline tests: glob, sampler, HDF5 shard dataset, batch loader, tools/.

add_library(ddp_test_shards STATIC data/shard_files.cpp)
target_link_libraries(ddp_test_shards PUBLIC ddp_core)
target_compile_options(ddp_test_shards PRIVATE -Wall -Wextra)
ddp_reuse_pch(ddp_test_shards ddp_core)

ddp_add_test(test_glob SOURCES data/test_glob.cpp LABELS data)
ddp_add_test(test_sampler SOURCES data/test_sampler.cpp LABELS data)

foreach(_t test_shard_dataset test_shard_errors test_batch_loader)
  ddp_add_mpi_test(${_t} SOURCES data/${_t}.cpp NP 1 2 3 4 LABELS data)
  target_link_libraries(${_t} PRIVATE ddp_test_shards)
endforeach()

add_test(NAME test_data_tools
         COMMAND ${DDP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/test_tools.py ${PROJECT_SOURCE_DIR})
set_tests_properties(test_data_tools PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT} LABELS "unit;data;tools")

# Image shards (NHWC/NCHW) and the rank's image transform: layouts and their errors,
# data.augment's grammar, the augmented sample the same on 1 and 2 ranks, any batch
# split and a resume mid-epoch, from either layout.
ddp_add_mpi_test(test_augment SOURCES data/test_augment.cpp NP 1 2 LABELS data)
target_link_libraries(test_augment PRIVATE ddp_test_shards)

# The kernel against torchvision's functional transforms (flip, padded crop, centre
# crop, bilinear resize, normalize) on fixed parameters; left out without torchvision.
add_executable(augment_probe data/augment_probe.cpp)
target_compile_options(augment_probe PRIVATE -Wall -Wextra)
target_link_libraries(augment_probe PRIVATE ddp_core)
ddp_reuse_pch(augment_probe ddp_core)
if(DDP_TORCH_PYTHON)
  execute_process(COMMAND ${DDP_TORCH_PYTHON} -c "import torchvision" RESULT_VARIABLE _ddp_no_tv
                  OUTPUT_QUIET ERROR_QUIET)
  if(_ddp_no_tv EQUAL 0)
    add_test(NAME test_augment_torchvision
             COMMAND ${DDP_TORCH_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/augment_torchvision.py
                     $<TARGET_FILE:augment_probe>)
    set_tests_properties(test_augment_torchvision PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT} LABELS "unit;data;torch")
  endif()
endif()
