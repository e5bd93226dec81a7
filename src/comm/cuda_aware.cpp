#include "comm/cuda_aware.hpp"

#include <mpi.h>

#include <cstdlib>
#include <cstring>

#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

namespace ddp {

namespace {
// 1 or 0 when MPI can be asked, -1 when it cannot.
int query_mpi() {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  // Asked at run time: the library loaded may differ from the headers built against.
  return MPIX_Query_cuda_support() ? 1 : 0;
#elif defined(MPICH_NUMVERSION) && MPICH_NUMVERSION >= 40000000
  return MPIX_Query_cuda_support() ? 1 : 0;
#else
  return -1;
#endif
}
}  // namespace

bool mpi_cuda_aware(std::string* how) {
  const char* env = std::getenv("DDP_MPI_CUDA_AWARE");
  if (env && (std::strcmp(env, "0") == 0 || std::strcmp(env, "1") == 0)) {
    if (how) *how = std::string("DDP_MPI_CUDA_AWARE=") + env;
    return env[0] == '1';
  }
  int q = query_mpi();
  if (how)
    *how = q < 0 ? "no MPIX_Query_cuda_support in this MPI: assumed not CUDA-aware"
                 : std::string("MPIX_Query_cuda_support() = ") + (q ? "1" : "0");
  return q == 1;
}

}  // namespace ddp
