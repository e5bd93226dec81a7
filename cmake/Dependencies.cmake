# Every third-party dependency is found here, once, and exposed as a target.

find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)

# Parallel HDF5: the shard reader opens files with the MPI-IO driver.
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "ddp_train needs a parallel (MPI-IO) HDF5, but the HDF5 found "
                      "(${HDF5_C_LIBRARIES}) is serial. On Debian: apt-get install libhdf5-openmpi-dev")
endif()
add_library(ddp::hdf5 INTERFACE IMPORTED)
set_target_properties(ddp::hdf5 PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${HDF5_C_INCLUDE_DIRS};${HDF5_INCLUDE_DIRS}"
  INTERFACE_LINK_LIBRARIES "${HDF5_C_LIBRARIES}"
  INTERFACE_COMPILE_DEFINITIONS "${HDF5_C_DEFINITIONS}")

# Kokkos: clusters bring a Kokkos 4.x config with a proper Kokkos::kokkos target.
# Debian's Trilinos-bundled Kokkos 3.4 defines one whose include path is wrong
# (/usr/lib/include) and whose link line holds a stray -D flag: repair it.
find_package(Kokkos REQUIRED)
# A Kokkos install keeps its config in <prefix>/lib*/cmake/Kokkos and its headers
# in <prefix>/include; Debian's in /usr/include/trilinos.
get_filename_component(_ddp_kokkos_prefix "${Kokkos_DIR}/../../.." ABSOLUTE)
find_path(DDP_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp
  HINTS ${_ddp_kokkos_prefix}/include ${Kokkos_INCLUDE_DIRS} /usr/include/trilinos
  PATH_SUFFIXES trilinos)
if(NOT DDP_KOKKOS_INCLUDE_DIR)
  message(FATAL_ERROR "Kokkos found but Kokkos_Core.hpp not: set DDP_KOKKOS_INCLUDE_DIR")
endif()
if(NOT TARGET Kokkos::kokkos)
  add_library(Kokkos::kokkos INTERFACE IMPORTED)
  set(_ddp_kokkos_repair TRUE)
elseif(TARGET Kokkos::kokkoscore)
  set(_ddp_kokkos_repair FALSE)  # Kokkos 4.x: its targets carry headers, flags and libraries
else()
  get_target_property(_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  set(_ddp_kokkos_repair FALSE)
  if(NOT _inc OR NOT EXISTS "${_inc}/Kokkos_Core.hpp")
    set(_ddp_kokkos_repair TRUE)
  endif()
endif()
if(_ddp_kokkos_repair)
  set(_libs "")
  foreach(_l ${Kokkos_LIBRARIES})
    find_library(_path_${_l} ${_l} HINTS ${Kokkos_LIBRARY_DIRS})
    list(APPEND _libs ${_path_${_l}})
  endforeach()
  set_target_properties(Kokkos::kokkos PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${DDP_KOKKOS_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${_libs};${CMAKE_DL_LIBS}")
endif()
if(EXISTS "${DDP_KOKKOS_INCLUDE_DIR}/KokkosCore_config.h")
  file(STRINGS "${DDP_KOKKOS_INCLUDE_DIR}/KokkosCore_config.h" _kk_cuda REGEX "define KOKKOS_ENABLE_CUDA$")
endif()
message(STATUS "Kokkos ${Kokkos_VERSION}: headers in ${DDP_KOKKOS_INCLUDE_DIR}")

# DDP_ENABLE_CUDA: training with tensors in GPU memory on a CUDA-enabled Kokkos; ON
# by default when the Kokkos found has the CUDA backend. Kokkos's kernels then run
# on the GPU, and the compute backend is cuBLAS/cuDNN (src/cuda) instead of oneDNN,
# which this build neither needs nor links.
if(_kk_cuda)
  set(_ddp_cuda_default ON)
else()
  set(_ddp_cuda_default OFF)
endif()
option(DDP_ENABLE_CUDA "Train with tensors in GPU memory (needs a CUDA-enabled Kokkos)" ${_ddp_cuda_default})
if(DDP_ENABLE_CUDA AND NOT _kk_cuda)
  message(FATAL_ERROR "DDP_ENABLE_CUDA=ON needs a Kokkos built with Kokkos_ENABLE_CUDA=ON, and the Kokkos "
                      "in ${DDP_KOKKOS_INCLUDE_DIR} has no CUDA backend: build Kokkos 4.x with "
                      "-DKokkos_ENABLE_CUDA=ON -DKokkos_ARCH_<GPU>=ON (docs/gpu.md) and configure with "
                      "-DKokkos_ROOT=<its prefix> -DCMAKE_CXX_COMPILER=<its prefix>/bin/nvcc_wrapper, or leave "
                      "DDP_ENABLE_CUDA off")
endif()
if(NOT DDP_ENABLE_CUDA AND _kk_cuda)
  message(FATAL_ERROR "the Kokkos in ${DDP_KOKKOS_INCLUDE_DIR} has the CUDA backend: its kernels run on "
                      "the GPU, so ddp_train must too: configure with -DDDP_ENABLE_CUDA=ON (the default "
                      "with such a Kokkos), or point -DKokkos_ROOT at a host Kokkos")
endif()
if(DDP_ENABLE_CUDA)
  get_filename_component(_ddp_cxx_name "${CMAKE_CXX_COMPILER}" NAME)
  if(NOT _ddp_cxx_name STREQUAL "nvcc_wrapper")
    message(FATAL_ERROR "a CUDA Kokkos compiles its users with its nvcc_wrapper: configure with "
                        "-DCMAKE_CXX_COMPILER=${Kokkos_DIR}/../../../bin/nvcc_wrapper (the bin/ of the Kokkos "
                        "prefix; now ${CMAKE_CXX_COMPILER})")
  endif()
  message(STATUS "DDP_ENABLE_CUDA: tensors in GPU memory, cuBLAS/cuDNN/NCCL; no oneDNN")
  return()
endif()

# oneDNN (libdnnl-dev): the host's GEMMs and convolutions, exposed as ddp::dnnl.
# Found by header and library rather than by dnnl-config.cmake: Debian's
# config also demands the OpenCL development files for its GPU runtime, which the
# CPU path never uses. oneDNN there runs on OpenMP, so OpenMP is linked too, to pin
# it to one thread per rank (src/model/onednn/dnnl_engine.cpp).
find_path(DDP_DNNL_INCLUDE_DIR dnnl.hpp PATH_SUFFIXES oneapi/dnnl)
find_library(DDP_DNNL_LIBRARY dnnl)
if(NOT DDP_DNNL_INCLUDE_DIR OR NOT DDP_DNNL_LIBRARY)
  message(FATAL_ERROR "oneDNN not found: apt-get install libdnnl-dev, or set DDP_DNNL_INCLUDE_DIR "
                      "(the directory of dnnl.hpp) and DDP_DNNL_LIBRARY")
endif()
find_package(OpenMP REQUIRED COMPONENTS CXX)
add_library(ddp::dnnl INTERFACE IMPORTED)
set_target_properties(ddp::dnnl PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${DDP_DNNL_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "${DDP_DNNL_LIBRARY};OpenMP::OpenMP_CXX"
  INTERFACE_COMPILE_DEFINITIONS DDP_WITH_ONEDNN=1)
message(STATUS "oneDNN: ${DDP_DNNL_LIBRARY}")
