#include "train/version.hpp"

#include <hdf5.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <dnnl.hpp>
#include <sstream>

#include "ddp_build_config.hpp"  // generated: build type, compiler, oneDNN, MPI/HDF5 found
#include "ddp_git_revision.hpp"  // generated: DDP_GIT_REVISION

// Defined on ddp_core by the CUDA build (cmake/Cuda.cmake); absent means off.
#ifndef DDP_WITH_CUDA_GLUE
#define DDP_WITH_CUDA_GLUE 0
#endif

namespace ddp {

namespace {

std::string kokkos_text() {
  std::string backends;
  auto add = [&](const char* name) { backends += (backends.empty() ? "" : ", ") + std::string(name); };
#if defined(KOKKOS_ENABLE_CUDA)
  add("CUDA");
#endif
#if defined(KOKKOS_ENABLE_HIP)
  add("HIP");
#endif
#if defined(KOKKOS_ENABLE_SYCL)
  add("SYCL");
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
  add("OpenMP");
#endif
#if defined(KOKKOS_ENABLE_THREADS)
  add("Threads");
#endif
#if defined(KOKKOS_ENABLE_SERIAL)
  add("Serial");
#endif
  std::ostringstream os;
#if defined(KOKKOS_VERSION)
  os << KOKKOS_VERSION / 10000 << "." << KOKKOS_VERSION / 100 % 100 << "." << KOKKOS_VERSION % 100;
#else
  os << "unknown version";
#endif
  os << ", backends " << (backends.empty() ? "none" : backends) << " (default execution space "
     << Kokkos::DefaultExecutionSpace::name() << ")";
  return os.str();
}

std::string mpi_text() {
  char library[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(library, &len);
  std::string line(library, std::size_t(len));
  line = line.substr(0, line.find_first_of(",\n"));
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  std::ostringstream os;
  os << line << " (MPI " << major << "." << minor << "; built with " << DDP_MPI_LIBRARY_BUILT << ")";
  return os.str();
}

std::string hdf5_text() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  std::ostringstream os;
  os << major << "." << minor << "." << release;
#if defined(H5_HAVE_PARALLEL)
  os << ", parallel (MPI-IO)";
#else
  os << ", serial";
#endif
  os << "; built with " << DDP_HDF5_VERSION_BUILT;
  return os.str();
}

const char* cpu_isa_name(dnnl::cpu_isa isa) {
  using I = dnnl::cpu_isa;
  switch (isa) {
    case I::sse41:
      return "SSE4.1";
    case I::avx:
      return "AVX";
    case I::avx2:
      return "AVX2";
    case I::avx2_vnni:
      return "AVX2 VNNI";
    case I::avx512_core:
      return "AVX-512";
    case I::avx512_core_vnni:
      return "AVX-512 VNNI";
    case I::avx512_core_bf16:
      return "AVX-512 BF16";
    case I::avx512_core_amx:
      return "AVX-512 AMX";
    default:
      return "other ISA";
  }
}

// The version and the instruction set oneDNN dispatches to on this CPU: its GEMM
// and convolution kernels are chosen at run time, so the ISA is what sets speed.
std::string dnnl_text() {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream os;
  os << v->major << "." << v->minor << "." << v->patch << ", " << cpu_isa_name(dnnl::get_effective_cpu_isa())
     << " (" << DDP_DNNL_LIBRARY << ")";
  return os.str();
}

}  // namespace

std::string version_text() {
  std::ostringstream os;
  os << "ddp_train " << DDP_VERSION << "\n"
     << "  git revision: " << DDP_GIT_REVISION << "\n"
     << "  build:        " << DDP_BUILD_TYPE << ", " << DDP_CXX_COMPILER << ", C++" << __cplusplus / 100 % 100
     << "\n"
     << "  Kokkos:       " << kokkos_text() << "\n"
     << "  MPI:          " << mpi_text() << "\n"
     << "  HDF5:         " << hdf5_text() << "\n"
     << "  oneDNN:       " << dnnl_text() << "\n"
     << "  CUDA glue:    "
     << (DDP_WITH_CUDA_GLUE ? "on (cuBLAS, cuDNN, NCCL)" : "off (CPU only: no cuBLAS, cuDNN, NCCL)") << "\n";
  return os.str();
}

}  // namespace ddp
