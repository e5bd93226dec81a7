# cmake --install <build> [--prefix <dir>]:
#   bin/ddp_train                          the trainer (RPATH to the MPI/HDF5/oneDNN it was linked with)
#   bin/prepare_fashion_mnist, bin/make_regression_data    data tools
#   bin/images_to_h5, bin/make_synthetic_images            image shards (ImageFolder, synthetic)
#   bin/llmc_to_h5, bin/text_to_tokens, bin/make_markov_tokens   token shards (llm.c files, text,
#                                          synthetic), with the module they share, bin/token_shards.py
#   bin/plot_metrics                       plots of runs' metrics.jsonl (matplotlib)
#   bin/merge_traces                       the ranks' timelines (io.trace) in one Chrome-trace file
#   bin/scaling_model                      samples/s on W GPUs predicted from a 1-rank trace
#   bin/torch_to_h5                        a PyTorch state_dict as a file for io.init_from
#   bin/h5_to_torch                        a checkpoint's weights as a PyTorch state_dict
#   share/ddp_train/inputs/                ready input files
#   share/ddp_train/jobs/                  Slurm job templates
#   share/doc/ddp_train/README.md, docs/*.md   the front page and the manual (docs/index.md)
#   share/man/man1/ddp_train.1             the man page, written by ddp_train --man (src/CMakeLists.txt)
#   share/modulefiles/ddp_train/<version>  Tcl modulefile (Environment Modules, Lmod)
# The modulefile is written at install time, so it names the prefix actually
# installed into (--prefix), not only CMAKE_INSTALL_PREFIX.

include_guard(GLOBAL)
include(GNUInstallDirs)
# --version's build information (git revision, build configuration).
include(BuildInfo)

set(DDP_MODULE_PREREQ "" CACHE STRING
    "Modules the ddp_train modulefile requires (prereq), e.g. 'openmpi/4.1;hdf5/1.14-mpi'; empty: none")
set(DDP_MODULEFILE_DIR "${CMAKE_INSTALL_DATADIR}/modulefiles" CACHE STRING
    "Where under the prefix the modulefile goes (<dir>/ddp_train/<version>)")

# Clusters keep MPI and HDF5 outside the system paths: the installed binary
# finds the very libraries it was linked with, whatever LD_LIBRARY_PATH says.
set_target_properties(ddp_train PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)

install(TARGETS ddp_train RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/prepare_fashion_mnist ${PROJECT_SOURCE_DIR}/tools/make_regression_data
                 ${PROJECT_SOURCE_DIR}/tools/plot_metrics ${PROJECT_SOURCE_DIR}/tools/merge_traces
                 ${PROJECT_SOURCE_DIR}/tools/scaling_model DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/torch_to_h5 ${PROJECT_SOURCE_DIR}/tools/h5_to_torch
        DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/images_to_h5 ${PROJECT_SOURCE_DIR}/tools/make_synthetic_images
        DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/llmc_to_h5 ${PROJECT_SOURCE_DIR}/tools/text_to_tokens
                 ${PROJECT_SOURCE_DIR}/tools/make_markov_tokens DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/tools/token_shards.py DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/inputs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/ddp_train/inputs)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/jobs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/ddp_train/jobs
        USE_SOURCE_PERMISSIONS)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs FILES_MATCHING PATTERN "*.md")
install(FILES ${DDP_MAN_PAGE} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)

# The modulefile: what the build used is filled in now, the prefix at install time.
set(_ddp_mpi "${DDP_MPI_LIBRARY_BUILT}")  # from BuildInfo.cmake
list(GET MPI_C_LIBRARIES 0 _ddp_mpi_lib)
set(_ddp_hdf5_lib "")
foreach(_l ${HDF5_C_LIBRARIES})
  if(_l MATCHES "hdf5")
    set(_ddp_hdf5_lib ${_l})
    break()
  endif()
endforeach()
set(_ddp_prereq "")
foreach(_m ${DDP_MODULE_PREREQ})
  string(APPEND _ddp_prereq "prereq ${_m}\n")
endforeach()
if(NOT _ddp_prereq)
  set(_ddp_prereq "# No prereq: built against the MPI and HDF5 above, found without modules.\n# (cmake -DDDP_MODULE_PREREQ='openmpi/4.1;hdf5/1.14' writes prereq lines here.)\n")
endif()
set(_ddp_stage ${CMAKE_BINARY_DIR}/modulefile)
set(DDP_ROOT "@DDP_ROOT@")  # kept for the install-time pass
configure_file(${CMAKE_CURRENT_LIST_DIR}/ddp_train.modulefile.in ${_ddp_stage}/modulefile.in.cmake @ONLY)
unset(DDP_ROOT)
install(CODE "
  set(DDP_ROOT \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${_ddp_stage}/modulefile.in.cmake\" \"${_ddp_stage}/${PROJECT_VERSION}\" @ONLY)
  file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${DDP_MODULEFILE_DIR}/ddp_train\"
       TYPE FILE FILES \"${_ddp_stage}/${PROJECT_VERSION}\")
")
