#include "train/version.hpp"

#include <hdf5.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <sstream>

#include "ddp_build_config.hpp"  // generated: build type, compiler, oneDNN, MPI/HDF5 found
#include "ddp_git_revision.hpp"  // generated: DDP_GIT_REVISION
#if DDP_WITH_ONEDNN
#include <dnnl.hpp>

#include "model/onednn/dnnl_engine.hpp"
#endif

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

#if DDP_WITH_ONEDNN
// The version and the instruction set oneDNN dispatches to on this CPU: its GEMM
// and convolution kernels are chosen at run time, so the ISA is what sets speed.
std::string dnnl_text() {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream os;
  os << v->major << "." << v->minor << "." << v->patch << ", " << dnnl_isa_name() << " (" << DDP_DNNL_LIBRARY
     << ")";
  return os.str();
}

#endif

// The instruction set the compiler targeted (-march; DDP_NATIVE_ARCH). With FMA it
// contracts a*b+c into one rounding, so an FMA build's numbers differ in the last bits
// from one without; the vector width does not change a result.
std::string target_text() {
#if defined(__AVX512F__)
  std::string isa = "x86-64 AVX-512";
#elif defined(__AVX2__)
  std::string isa = "x86-64 AVX2";
#elif defined(__AVX__)
  std::string isa = "x86-64 AVX";
#elif defined(__x86_64__)
  std::string isa = "x86-64 SSE2";
#else
  std::string isa = "not x86-64";
#endif
#if defined(__FP_FAST_FMAF)
  return isa + " with FMA";
#else
  return isa + " without FMA";
#endif
}

}  // namespace

std::string version_text() {
  std::ostringstream os;
  os << "ddp_train " << DDP_VERSION << "\n"
     << "  git revision: " << DDP_GIT_REVISION << "\n"
     << "  build:        " << DDP_BUILD_TYPE << ", " << DDP_CXX_COMPILER << ", C++" << __cplusplus / 100 % 100
     << "\n"
     << "  target:       " << target_text() << "\n"
     << "  Kokkos:       " << kokkos_text() << "\n"
     << "  MPI:          " << mpi_text() << "\n"
     << "  HDF5:         " << hdf5_text() << "\n"
#if DDP_WITH_ONEDNN
     << "  compute:      oneDNN " << dnnl_text() << "\n"
     << "  bf16:         "
     << (dnnl_bf16().native ? "oneDNN's bf16 kernels (" + dnnl_bf16().impl + ")"
                            : "emulated (oneDNN has no bf16 kernels for " + std::string(dnnl_isa_name()) +
                                  "): bf16-rounded operands, fp32 products")
     << "\n"
#else
     << "  compute:      cuBLAS + cuDNN on the GPU (CUDA " << DDP_CUDA_VERSION_BUILT << ", sm "
     << DDP_CUDA_ARCHITECTURES << "); tensors in device memory\n"
#endif
     << "  CUDA glue:    "
     << (DDP_WITH_CUDA_GLUE ? "on (cuBLAS, cuDNN, NCCL)" : "off (CPU only: no cuBLAS, cuDNN, NCCL)") << "\n";
  return os.str();
}

}  // namespace ddp
