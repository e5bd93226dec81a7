#include "model/backend.hpp"

#include <Kokkos_Core.hpp>

#include "comm/check.hpp"
#if defined(KOKKOS_ENABLE_CUDA)
#include "cuda/cuda_backend.hpp"
#else
#include "model/onednn/onednn_backend.hpp"
#endif

namespace ddp {

namespace {
std::unique_ptr<ComputeBackend> g_backend;
}

ComputeBackend& compute_backend() {
  if (!g_backend) {
    DDP_REQUIRE(Kokkos::is_initialized(), "the compute backend is made after Kokkos::initialize");
#if defined(KOKKOS_ENABLE_CUDA)
    // Kokkos's default instance runs on a stream of its own: cuBLAS and cuDNN join it.
    g_backend = cuda::make_cuda_backend(Kokkos::DefaultExecutionSpace().cuda_stream());
#else
    g_backend = make_onednn_backend();
#endif
    // Handles and workspaces go before the device does.
    Kokkos::push_finalize_hook([] { g_backend.reset(); });
  }
  return *g_backend;
}

}  // namespace ddp
