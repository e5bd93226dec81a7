ddp_add_mpi_test(test_equivalence SOURCES train/test_equivalence.cpp NP 1 2 3 4 LABELS train)
target_include_directories(test_equivalence PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/train)
