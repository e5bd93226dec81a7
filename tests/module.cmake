# --version's build information, and the installed tree as an environment module.

ddp_add_test(test_version SOURCES module/test_version.cpp)

# cmake --install into a temporary prefix, `module use` + `module load ddp_train`,
# then --version and a 2-rank training run from a directory outside the source
# tree, with the installed data tool and input file. Skipped (77) without
# Environment Modules or Lmod; module_lmod_install_load_run does the same under Lmod
# alone (the copy tools/install_deps --test unpacks beside Environment Modules).
foreach(_system any lmod)
  if(_system STREQUAL lmod)
    set(_name module_lmod_install_load_run)
  else()
    set(_name module_install_load_run)
  endif()
  add_test(NAME ${_name}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/module/install_load_run.sh ${CMAKE_BINARY_DIR} ${PROJECT_VERSION}
                   ${MPIEXEC_EXECUTABLE} ${DDP_PYTHON} ${_system})
  set_tests_properties(${_name} PROPERTIES LABELS module TIMEOUT 300 PROCESSORS 2 SKIP_RETURN_CODE 77)
endforeach()

# spack/packages/ddp-train/package.py, read with a stand-in spack.package (no Spack can be
# installed from Debian or PyPI): its variants and dependencies, and every CMake option of
# the project set by its cmake_args or listed as deliberately not exposed.
add_test(NAME module_spack_recipe COMMAND ${DDP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/module/check_spack_recipe.py
                                         ${PROJECT_SOURCE_DIR})
set_tests_properties(module_spack_recipe PROPERTIES LABELS module TIMEOUT 60)
