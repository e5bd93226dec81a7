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
find_path(DDP_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp
  HINTS ${Kokkos_INCLUDE_DIRS} /usr/include/trilinos
  PATH_SUFFIXES trilinos)
if(NOT DDP_KOKKOS_INCLUDE_DIR)
  message(FATAL_ERROR "Kokkos found but Kokkos_Core.hpp not: set DDP_KOKKOS_INCLUDE_DIR")
endif()
if(NOT TARGET Kokkos::kokkos)
  add_library(Kokkos::kokkos INTERFACE IMPORTED)
  set(_ddp_kokkos_repair TRUE)
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
# by default when the Kokkos found has the CUDA backend. This version does not have
# it yet (the layers hand host pointers to oneDNN), so either way a CUDA Kokkos is
# refused here with the reason instead of failing later in the compiler. The CUDA
# glue (cuBLAS, cuDNN, NCCL: DDP_ENABLE_CUDA_GLUE) builds without it.
if(_kk_cuda)
  set(_ddp_cuda_default ON)
else()
  set(_ddp_cuda_default OFF)
endif()
option(DDP_ENABLE_CUDA "Train with tensors in GPU memory (needs a CUDA-enabled Kokkos)" ${_ddp_cuda_default})
if(DDP_ENABLE_CUDA AND NOT _kk_cuda)
  message(FATAL_ERROR "DDP_ENABLE_CUDA=ON needs a Kokkos built with Kokkos_ENABLE_CUDA=ON, and the Kokkos "
                      "in ${DDP_KOKKOS_INCLUDE_DIR} has no CUDA backend: point -DKokkos_ROOT at a CUDA "
                      "build of Kokkos, or leave DDP_ENABLE_CUDA off")
endif()
if(_kk_cuda)
  message(FATAL_ERROR "the Kokkos in ${DDP_KOKKOS_INCLUDE_DIR} has the CUDA backend, and device-resident "
                      "training (DDP_ENABLE_CUDA) is not in this version of ddp_train: configure against "
                      "a host Kokkos (Serial or OpenMP); the CUDA glue (cuBLAS, cuDNN, NCCL) is built "
                      "either way")
endif()

# oneDNN (libdnnl-dev): the host's GEMMs and convolutions, exposed as ddp::dnnl.
# Found by header and library rather than by dnnl-config.cmake: Debian's
# config also demands the OpenCL development files for its GPU runtime, which the
# CPU path never uses. oneDNN there runs on OpenMP, so OpenMP is linked too, to pin
# it to one thread per rank (src/model/dnnl_engine.cpp).
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
  INTERFACE_LINK_LIBRARIES "${DDP_DNNL_LIBRARY};OpenMP::OpenMP_CXX")
message(STATUS "oneDNN: ${DDP_DNNL_LIBRARY}")
