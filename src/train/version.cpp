#include "train/version.hpp"

#include <hdf5.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <sstream>

#include "ddp_build_config.hpp"  // generated: build type, compiler, BLAS, MPI/HDF5 found
#include "ddp_git_revision.hpp"  // generated: DDP_GIT_REVISION

// OpenBLAS describes its own build ("OpenBLAS 0.3.21 DYNAMIC_ARCH ... Haswell");
// weak, so that a binary linked against another CBLAS still links and runs.
extern "C" char* openblas_get_config(void) __attribute__((weak));

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

std::string blas_text() {
  std::string text = openblas_get_config ? std::string(openblas_get_config()) : DDP_BLAS_VENDOR;
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n')) text.pop_back();
  return text + " (" + DDP_BLAS_LIBRARIES + ")";
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
     << "  BLAS:         " << blas_text() << "\n"
     << "  CUDA glue:    "
     << (DDP_WITH_CUDA_GLUE ? "on (cuBLAS, cuDNN, NCCL)" : "off (CPU only: no cuBLAS, cuDNN, NCCL)") << "\n";
  return os.str();
}

}  // namespace ddp
