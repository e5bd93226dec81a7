# The GPU path's build: when a CUDA compiler is found, the CUDA glue library
# `ddp_cuda` (cuBLAS, cuDNN, NCCL, device binding), compiled with nvcc. The
# CPU-side pieces every build has (backend choice, the NCCL id bootstrap, the
# CUDA-aware-MPI query) are in src/comm and part of ddp_core. The glue takes raw pointers and streams and
# includes no Kokkos header, so it builds and links with a CUDA toolkit alone.

# Where to look for nvcc when it is neither on PATH nor named by CUDACXX /
# CMAKE_CUDA_COMPILER: CUDAToolkit_ROOT, then the usual /usr/local/cuda.
include(CheckLanguage)
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(_ddp_nvcc nvcc HINTS ${CUDAToolkit_ROOT}/bin $ENV{CUDA_HOME}/bin /usr/local/cuda/bin)
  if(_ddp_nvcc)
    set(ENV{CUDACXX} ${_ddp_nvcc})
  endif()
endif()
check_language(CUDA)

if(CMAKE_CUDA_COMPILER)
  set(_ddp_glue_default ON)
else()
  set(_ddp_glue_default OFF)
endif()
option(DDP_ENABLE_CUDA_GLUE "Build the CUDA glue (cuBLAS, cuDNN, NCCL) with nvcc" ${_ddp_glue_default})

if(NOT DDP_ENABLE_CUDA_GLUE)
  if(_ddp_nvcc AND NOT CMAKE_CUDA_COMPILER)
    # A toolkit is installed but its nvcc cannot build a test program: say so loudly,
    # since CI relies on this build to keep the GPU path compiling.
    message(FATAL_ERROR "nvcc found at ${_ddp_nvcc} but CMake cannot compile CUDA with it "
                        "(see CMakeFiles/CMakeError.log); fix the toolkit or configure with "
                        "-DDDP_ENABLE_CUDA_GLUE=OFF to build without the GPU path")
  endif()
  message(STATUS "CUDA glue: off (no CUDA compiler found)")
  return()
endif()
if(NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR "DDP_ENABLE_CUDA_GLUE=ON but no CUDA compiler was found: set "
                      "-DCMAKE_CUDA_COMPILER=/path/to/nvcc or -DCUDAToolkit_ROOT=/path/to/cuda")
endif()

# A100 (sm_80) and H100 (sm_90), SASS plus PTX for each.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "GPU architectures the CUDA glue is compiled for")
endif()
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)

find_package(CUDAToolkit REQUIRED)

# cuDNN and NCCL are not part of FindCUDAToolkit. Toolkits that bundle them (and
# this CI image) keep them in <toolkit>/lib; cluster modules set CUDNN_ROOT /
# NCCL_ROOT (or CUDNN_HOME / NCCL_HOME).
set(_ddp_cuda_lib_hints ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64
                        ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib /usr/local/cuda/lib64)
set(_ddp_cuda_inc_hints ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include /usr/local/cuda/include)
foreach(_pkg CUDNN NCCL)
  string(TOLOWER ${_pkg} _name)
  find_library(DDP_${_pkg}_LIBRARY ${_name}
    HINTS ${${_pkg}_ROOT} $ENV{${_pkg}_ROOT} $ENV{${_pkg}_HOME} ${_ddp_cuda_lib_hints}
    PATH_SUFFIXES lib lib64)
  find_path(DDP_${_pkg}_INCLUDE_DIR ${_name}.h
    HINTS ${${_pkg}_ROOT} $ENV{${_pkg}_ROOT} $ENV{${_pkg}_HOME} ${_ddp_cuda_inc_hints}
    PATH_SUFFIXES include)
  if(NOT DDP_${_pkg}_LIBRARY OR NOT DDP_${_pkg}_INCLUDE_DIR)
    message(FATAL_ERROR "CUDA glue: lib${_name} or ${_name}.h not found (library: ${DDP_${_pkg}_LIBRARY}, "
                        "header: ${DDP_${_pkg}_INCLUDE_DIR}); set -D${_pkg}_ROOT=/path or "
                        "-DDDP_ENABLE_CUDA_GLUE=OFF")
  endif()
  add_library(ddp::${_name} INTERFACE IMPORTED)
  set_target_properties(ddp::${_name} PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${DDP_${_pkg}_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${DDP_${_pkg}_LIBRARY}")
endforeach()
message(STATUS "CUDA glue: nvcc ${CMAKE_CUDA_COMPILER_VERSION} for sm ${CMAKE_CUDA_ARCHITECTURES}; "
               "cuDNN ${DDP_CUDNN_LIBRARY}; NCCL ${DDP_NCCL_LIBRARY}")

file(GLOB _ddp_cuda_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/*.cu
                                              ${PROJECT_SOURCE_DIR}/src/cuda/*.cpp)
add_library(ddp_cuda STATIC ${_ddp_cuda_sources})
target_include_directories(ddp_cuda PUBLIC ${PROJECT_SOURCE_DIR}/src)
target_compile_options(ddp_cuda PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
                                        $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
target_compile_definitions(ddp_cuda PUBLIC DDP_WITH_CUDA_GLUE=1 OMPI_SKIP_MPICXX MPICH_SKIP_MPICXX)
# ddp_core supplies ddp::fatal and the MPI bootstrap; LINK_ONLY keeps its Kokkos
# compile flags away from the glue's sources.
target_link_libraries(ddp_cuda PUBLIC MPI::MPI_C CUDA::cudart CUDA::cublas CUDA::cublasLt ddp::cudnn ddp::nccl
                                      $<LINK_ONLY:ddp_core>)
set_target_properties(ddp_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_SEPARABLE_COMPILATION OFF)
