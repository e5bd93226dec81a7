# --version's build information, and the installed tree as an environment module.

ddp_add_test(test_version SOURCES module/test_version.cpp)

# cmake --install into a temporary prefix, `module use` + `module load ddp_train`,
# then --version and a 2-rank training run from a directory outside the source
# tree, with the installed data tool and input file. Skipped (77) without
# Environment Modules or Lmod.
add_test(NAME module_install_load_run
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/module/install_load_run.sh ${CMAKE_BINARY_DIR} ${PROJECT_VERSION}
                 ${MPIEXEC_EXECUTABLE} ${DDP_PYTHON})
set_tests_properties(module_install_load_run PROPERTIES LABELS module TIMEOUT 300 PROCESSORS 2
                     SKIP_RETURN_CODE 77)
