# The documentation and the command line, checked against the program they describe.
set(DOCS ${CMAKE_CURRENT_SOURCE_DIR}/docs)

# Every relative link and anchor of README.md and docs/*.md leads somewhere.
add_test(NAME docs_links COMMAND ${DDP_PYTHON} ${DOCS}/check_links.py ${PROJECT_SOURCE_DIR})
set_tests_properties(docs_links PROPERTIES LABELS docs TIMEOUT 60)

# docs/input.md's key table is `ddp_train --keys --markdown`: where they differ, the
# test prints the diff and the command that rewrites the table (tools/update_docs).
add_test(NAME docs_input_keys
         COMMAND ${DDP_PYTHON} ${PROJECT_SOURCE_DIR}/tools/update_docs --check $<TARGET_FILE_DIR:ddp_train>)
set_tests_properties(docs_input_keys PROPERTIES LABELS docs TIMEOUT 60)

# --help is ddp_train's usage (Kokkos's banner only under --kokkos-help), --keys lists
# every key, a bad option is one error line, and on 2 ranks rank 0 alone prints.
add_test(NAME cli_help COMMAND ${DDP_PYTHON} ${DOCS}/cli_help.py $<TARGET_FILE:ddp_train> ${MPIEXEC_EXECUTABLE}
                               ${MPIEXEC_NUMPROC_FLAG} 2 ${DDP_MPIEXEC_PREFLAGS})
set_tests_properties(cli_help PROPERTIES LABELS "docs;cli" TIMEOUT 120 PROCESSORS 2)

# ddp_train.1 (written by the build: src/CMakeLists.txt) renders without a groff
# warning and documents every option and key. Skipped (77) without groff.
add_test(NAME cli_man COMMAND ${DDP_PYTHON} ${DOCS}/cli_man.py $<TARGET_FILE:ddp_train> ${DDP_MAN_PAGE})
set_tests_properties(cli_man PROPERTIES LABELS "docs;cli" TIMEOUT 60 SKIP_RETURN_CODE 77)

# The GPU build links the CUDA driver: on a host without one (a build node) the
# program cannot start, and these tests say so as skipped, not failed.
if(DDP_ENABLE_CUDA)
  set_tests_properties(docs_input_keys cli_help cli_man PROPERTIES
                       SKIP_REGULAR_EXPRESSION "libcuda\\.so\\.1: cannot open shared object file")
endif()
