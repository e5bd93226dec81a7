// ResNet-50's batch norms (torchvision's resnet50 at 224x224: 53 of them, 12 shapes)
// at batch B, bf16 channels-last on the GPU, a training forward and backward each,
// timed on the device (CUDA events on the compute stream; the median of R rounds):
//   ours   BatchNorm2d with its relu fused and its own kernels, as the trainer runs
//          it in bf16 by default: forward, the per-channel sums' passes then y;
//          backward, the sums' passes then dx
//   cuDNN  the same layer on cuDNN's batch norm (set_library_kernels, as under
//          DDP_CUDNN_BATCHNORM=1: cudnnBatchNormalizationForwardTrainingEx / BackwardEx,
//          CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops batch norm + ReLU, src/cuda/batch_norm.cpp),
//          the channels-last batch norm of PyTorch's cuDNN path
// on the same x, gamma, beta and dy, and how far cuDNN's y, dx, dgamma and dbeta lie
// from ours (test::norm_relative_error: a relu flipped by a rounding moves it little):
// both sides compute the same thing, or the times compare nothing. Then each side's
// time summed over the step's 53 batch norms. The blocks' last batch norms run as
// batch norm + ReLU here; in the step they add the shortcut before the relu (cuDNN's
// ops BN_ADD_ACTIVATION, or ResBlock's bn_add_relu pass), the same bytes but the
// shortcut's. A program, not a test; in the CUDA build only:
//   build/bn_bench [batch 256] [rounds 20]
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/device.hpp"
#include "layer_fixture.hpp"
#include "model/batchnorm.hpp"
#include "model/elements.hpp"

namespace {

using namespace ddp;

// A tensor of `type` in NHWC with values in [-2, 2) from a hash of the index (no
// host round trip for the 205 million elements of the largest).
Tensor hashed(std::int64_t B, const Shape& sample, Precision type, std::uint32_t seed, const char* label) {
  Tensor wide, t;
  resize(wide, B, sample, label, Layout::nhwc);
  View1 v = wide.data;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<>(0, wide.storage_numel()), KOKKOS_LAMBDA(std::int64_t e) {
        std::uint32_t h = static_cast<std::uint32_t>(e) * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        v(e) = static_cast<float>(h & 0xffffff) / 4194304.0f - 2.0f;
      });
  convert_type(wide, t, type, label);
  return t;
}

// gamma and beta (params' first 2C floats) not 1 and 0: the relu then cuts at
// another place in each channel.
void set_affine(View1 params, std::int64_t C) {
  Kokkos::parallel_for(
      "bn_bench::affine", Kokkos::RangePolicy<>(0, 2 * C), KOKKOS_LAMBDA(std::int64_t i) {
        params(i) = i < C ? 0.5f + 0.01f * float(i % 100) : 0.1f * float(i % 7) - 0.3f;
      });
}

// The median of `rounds` device times of f(), in ms, after one warm-up call.
template <class F>
double median_ms(cudaStream_t stream, int rounds, F&& f) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  f();
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    f();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Case {
  std::int64_t c, side;
  int count;  // batch norms of this shape in ResNet-50
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::string why;
  if (ddp::cuda::device_count(&why) == 0) {
    std::fprintf(stderr, "bn_bench: no CUDA device (%s)\n", why.c_str());
    MPI_Finalize();
    return 1;
  }
  Kokkos::initialize(argc, argv);
  {
    const std::int64_t B = argc > 1 ? std::atoll(argv[1]) : 256;
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 20;
    // The stem's; each stage's bn1 and bn2 (its first block's bn1 at the stage's
    // input side, as v1.5 strides in conv2), its bn3 and the downsample's.
    const Case cases[] = {{64, 112, 1},  {64, 56, 6},  {256, 56, 4}, {128, 56, 1},
                          {128, 28, 7},  {512, 28, 5}, {256, 28, 1}, {256, 14, 11},
                          {1024, 14, 7}, {512, 14, 1}, {512, 7, 5},  {2048, 7, 4}};
    const cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
    // BatchNorm2d takes the library's kernels where x is narrow channels-last (here),
    // and the CUDA backend always has them.
    DDP_REQUIRE(compute_backend().batch_norm(), "bn_bench: this backend has no cuDNN batch norm");
    std::printf(
        "bn_bench: ResNet-50's batch norms with their relu, batch %lld, bf16 NHWC, training forward + "
        "backward, device ms (median of %d)\n",
        static_cast<long long>(B), rounds);
    std::printf("  %-16s %5s %9s %9s %9s %9s %7s  %s\n", "shape (C,H,W)", "count", "ours fwd", "ours bwd",
                "cuDNN fwd", "cuDNN bwd", "ratio", "cuDNN against ours: y, dx, dgamma, dbeta");
    double ours_step = 0, cudnn_step = 0, worst = 0;
    for (const Case& k : cases) {
      const Shape sample = {k.c, k.side, k.side};
      const std::int64_t C = k.c;
      const Tensor x = hashed(B, sample, Precision::bf16, 1, "bn_bench::x");
      const Tensor dy = hashed(B, sample, Precision::bf16, 2, "bn_bench::dy");
      // The same layer twice: its own kernels, and cuDNN's (BatchNormKernels)
      struct Side {
        explicit Side(const Shape& sample) : b("batchnorm2d", sample) {}
        test::BoundLayer b;
        Tensor y, dx;
        double fwd = 0, bwd = 0;
      };
      Side ours(sample), cudnn(sample);
      for (Side* side : {&ours, &cudnn}) {
        Side& s = *side;
        auto& bn = static_cast<BatchNorm2d&>(*s.b.layer);
        bn.fuse_relu();
        bn.set_library_kernels(side == &cudnn ? compute_backend().batch_norm() : nullptr);
        bn.set_overwrite_gradients(true);
        set_affine(s.b.params, C);
        s.fwd = median_ms(stream, rounds, [&] { s.b.layer->forward(x, s.y, true); });
        s.bwd = median_ms(stream, rounds, [&] { s.b.layer->backward(x, s.y, dy, s.dx); });
      }
      CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::vector<float> g_ours = test::to_host(ours.b.grads, 2 * C),
                               g_cudnn = test::to_host(cudnn.b.grads, 2 * C);
      const auto part = [C](const std::vector<float>& g, int i) {
        return std::vector<float>(g.begin() + i * C, g.begin() + (i + 1) * C);
      };
      using test::norm_relative_error;
      const double d_y = norm_relative_error(test::values(cudnn.y), test::values(ours.y));
      const double d_dx = norm_relative_error(test::values(cudnn.dx), test::values(ours.dx));
      const double d_g = norm_relative_error(part(g_cudnn, 0), part(g_ours, 0));
      const double d_b = norm_relative_error(part(g_cudnn, 1), part(g_ours, 1));
      worst = std::max({worst, d_y, d_dx, d_g, d_b});

      char shape[32];
      std::snprintf(shape, sizeof shape, "(%lld,%lld,%lld)", static_cast<long long>(k.c),
                    static_cast<long long>(k.side), static_cast<long long>(k.side));
      std::printf("  %-16s %5d %9.3f %9.3f %9.3f %9.3f %7.2f  %.1e %.1e %.1e %.1e\n", shape, k.count,
                  ours.fwd, ours.bwd, cudnn.fwd, cudnn.bwd, (ours.fwd + ours.bwd) / (cudnn.fwd + cudnn.bwd),
                  d_y, d_dx, d_g, d_b);
      ours_step += k.count * (ours.fwd + ours.bwd);
      cudnn_step += k.count * (cudnn.fwd + cudnn.bwd);
    }
    std::printf(
        "bn_bench: a step's 53 batch norms: ours %.2f ms, cuDNN %.2f ms (ours / cuDNN %.2f); largest "
        "difference of cuDNN's results from ours %.1e\n",
        ours_step, cudnn_step, ours_step / cudnn_step, worst);
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
