# Data pipeline tests: glob, sampler, HDF5 shard dataset, batch loader, tools/.

add_library(ddp_test_shards STATIC data/shard_files.cpp)
target_link_libraries(ddp_test_shards PUBLIC ddp_core)
target_compile_options(ddp_test_shards PRIVATE -Wall -Wextra)

ddp_add_test(test_glob SOURCES data/test_glob.cpp LABELS data)
ddp_add_test(test_sampler SOURCES data/test_sampler.cpp LABELS data)

foreach(_t test_shard_dataset test_shard_errors test_batch_loader)
  ddp_add_mpi_test(${_t} SOURCES data/${_t}.cpp NP 1 2 3 4 LABELS data)
  target_link_libraries(${_t} PRIVATE ddp_test_shards)
endforeach()

add_test(NAME test_data_tools
         COMMAND ${DDP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/test_tools.py ${PROJECT_SOURCE_DIR})
set_tests_properties(test_data_tools PROPERTIES TIMEOUT ${DDP_TEST_TIMEOUT} LABELS "unit;data;tools")
