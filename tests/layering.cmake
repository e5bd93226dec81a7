# The include graph (DESIGN.md: includes point down only, train -> io, model -> comm;
# src/io knows nothing of src/train): each test fails naming the file:line of an
# include that points up.
set(DDP_LAYERING ${CMAKE_CURRENT_SOURCE_DIR}/layering.sh)
add_test(NAME layering_io_no_train COMMAND ${DDP_LAYERING} ${PROJECT_SOURCE_DIR}/src io train)
add_test(NAME layering_model_no_io_train COMMAND ${DDP_LAYERING} ${PROJECT_SOURCE_DIR}/src model io train)
add_test(NAME layering_comm_bottom COMMAND ${DDP_LAYERING} ${PROJECT_SOURCE_DIR}/src comm io model train)
set_tests_properties(layering_io_no_train layering_model_no_io_train layering_comm_bottom PROPERTIES
                     LABELS "unit;layering" TIMEOUT 30)
