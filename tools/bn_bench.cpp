// ResNet-50's batch norms (torchvision's resnet50 at 224x224: 53 of them, 12 shapes)
// at batch B, bf16 channels-last on the GPU, a training forward and backward each,
// timed on the device (CUDA events on the compute stream; the median of R rounds):
//   ours   BatchNorm2d with its relu fused, as the trainer runs it in bf16: forward,
//          the per-channel sums' passes then y; backward, the sums' passes then dx
//   cuDNN  cudnnBatchNormalizationForwardTrainingEx / BackwardEx, mode
//          CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops batch norm + ReLU, on the same x,
//          gamma, beta and dy: the channels-last batch norm of PyTorch's cuDNN path
// and how far cuDNN's y, dx, dgamma and dbeta lie from ours (test::norm_relative_error:
// a relu flipped by a rounding moves it little): both sides compute the same thing,
// or the times compare nothing. Then
// each side's time summed over the step's 53 batch norms. The blocks' last batch
// norms run as batch norm + ReLU here; in the step they add the shortcut before the
// relu (cuDNN's ops BN_ADD_ACTIVATION, ResBlock's bn_add_relu pass), the same bytes
// but the shortcut's. A program, not a test; in the CUDA build only:
//   build/bn_bench [batch 256] [rounds 20]
#include <cuda_runtime.h>
#include <cudnn.h>
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

// t's elements as floats on the host.
std::vector<float> host_values(const Tensor& t) {
  Tensor wide;
  convert_type(t, wide, Precision::fp32, "bn_bench::wide");
  return test::to_host(wide.data, t.storage_numel());
}

std::vector<float> device_floats(const float* p, std::size_t n) {
  std::vector<float> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
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
    cudnnHandle_t handle;
    CUDNN_CHECK(cudnnCreate(&handle));
    CUDNN_CHECK(cudnnSetStream(handle, stream));
    cudnnTensorDescriptor_t x_desc, bn_desc;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&bn_desc));
    cudnnActivationDescriptor_t relu;
    CUDNN_CHECK(cudnnCreateActivationDescriptor(&relu));
    CUDNN_CHECK(cudnnSetActivationDescriptor(relu, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    const cudnnBatchNormMode_t mode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
    const cudnnBatchNormOps_t ops = CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    const float one = 1.0f, zero = 0.0f;
    const double eps = 1e-5, momentum = 0.1;

    std::printf(
        "bn_bench: ResNet-50's batch norms with their relu, batch %lld, bf16 NHWC, training forward + "
        "backward, device ms (median of %d)\n",
        static_cast<long long>(B), rounds);
    std::printf("  %-16s %5s %9s %9s %9s %9s %7s  %s\n", "shape (C,H,W)", "count", "ours fwd", "ours bwd",
                "cuDNN fwd", "cuDNN bwd", "ratio", "cuDNN against ours: y, dx, dgamma, dbeta");
    double ours_step = 0, cudnn_step = 0, worst = 0;
    for (const Case& k : cases) {
      const Shape sample = {k.c, k.side, k.side};
      test::BoundLayer b("batchnorm2d", sample);
      auto* bn = static_cast<BatchNorm2d*>(b.layer.get());
      bn->fuse_relu();
      bn->set_overwrite_gradients(true);
      const Tensor x = hashed(B, sample, Precision::bf16, 1, "bn_bench::x");
      const Tensor dy = hashed(B, sample, Precision::bf16, 2, "bn_bench::dy");
      const std::int64_t C = k.c;
      set_affine(b.params, C);
      Tensor y, dx;
      const double fwd = median_ms(stream, rounds, [&] { b.layer->forward(x, y, true); });
      const double bwd = median_ms(stream, rounds, [&] { b.layer->backward(x, y, dy, dx); });

      CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_desc, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, int(B), int(k.c),
                                             int(k.side), int(k.side)));
      CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bn_desc, x_desc, mode));
      std::size_t fwd_ws = 0, bwd_ws = 0, reserve = 0;
      CUDNN_CHECK(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, mode, ops, x_desc, nullptr,
                                                                           x_desc, bn_desc, relu, &fwd_ws));
      CUDNN_CHECK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, mode, ops, x_desc, x_desc, x_desc,
                                                                    nullptr, x_desc, bn_desc, relu, &bwd_ws));
      CUDNN_CHECK(
          cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, mode, ops, relu, x_desc, &reserve));
      const std::size_t bytes = static_cast<std::size_t>(x.storage_numel()) * 2;
      void *y2, *dx2, *ws, *rs;
      float* stats;  // running mean, running var, saved mean, saved 1/std, dgamma, dbeta: C each
      CUDA_CHECK(cudaMalloc(&y2, bytes));
      CUDA_CHECK(cudaMalloc(&dx2, bytes));
      CUDA_CHECK(cudaMalloc(&ws, std::max(fwd_ws, bwd_ws) + 1));
      CUDA_CHECK(cudaMalloc(&rs, reserve + 1));
      CUDA_CHECK(cudaMalloc(&stats, 6 * std::size_t(C) * sizeof(float)));
      CUDA_CHECK(cudaMemset(stats, 0, 6 * std::size_t(C) * sizeof(float)));
      float *run_mean = stats, *run_var = stats + C, *save_mean = stats + 2 * C, *save_invstd = stats + 3 * C,
            *dgamma = stats + 4 * C, *dbeta = stats + 5 * C;
      const float* gamma = b.params.data();
      const float* beta = b.params.data() + C;
      const double cfwd = median_ms(stream, rounds, [&] {
        CUDNN_CHECK(cudnnBatchNormalizationForwardTrainingEx(
            handle, mode, ops, &one, &zero, x_desc, x.data.data(), nullptr, nullptr, x_desc, y2, bn_desc,
            gamma, beta, momentum, run_mean, run_var, eps, save_mean, save_invstd, relu, ws, fwd_ws, rs,
            reserve));
      });
      const double cbwd = median_ms(stream, rounds, [&] {
        CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
            handle, mode, ops, &one, &zero, &one, &zero, x_desc, x.data.data(), x_desc, y2, x_desc,
            dy.data.data(), nullptr, nullptr, x_desc, dx2, bn_desc, gamma, beta, dgamma, dbeta, eps,
            save_mean, save_invstd, relu, ws, bwd_ws, rs, reserve));
      });
      CUDA_CHECK(cudaStreamSynchronize(stream));

      // cuDNN's outputs into tensors of ours, to read them the same way
      Tensor y_cudnn, dx_cudnn;
      resize_like(y_cudnn, y, "bn_bench::y_cudnn");
      resize_like(dx_cudnn, dx, "bn_bench::dx_cudnn");
      CUDA_CHECK(cudaMemcpy(y_cudnn.data.data(), y2, bytes, cudaMemcpyDeviceToDevice));
      CUDA_CHECK(cudaMemcpy(dx_cudnn.data.data(), dx2, bytes, cudaMemcpyDeviceToDevice));
      const std::vector<float> grads = test::to_host(b.grads, 2 * C);
      const std::vector<float> dg(grads.begin(), grads.begin() + C), db(grads.begin() + C, grads.end());
      using test::norm_relative_error;
      const double d_y = norm_relative_error(host_values(y_cudnn), host_values(y));
      const double d_dx = norm_relative_error(host_values(dx_cudnn), host_values(dx));
      const double d_g = norm_relative_error(device_floats(dgamma, std::size_t(C)), dg);
      const double d_b = norm_relative_error(device_floats(dbeta, std::size_t(C)), db);
      worst = std::max({worst, d_y, d_dx, d_g, d_b});
      for (void* p : {y2, dx2, ws, rs, static_cast<void*>(stats)}) CUDA_CHECK(cudaFree(p));

      char shape[32];
      std::snprintf(shape, sizeof shape, "(%lld,%lld,%lld)", static_cast<long long>(k.c),
                    static_cast<long long>(k.side), static_cast<long long>(k.side));
      std::printf("  %-16s %5d %9.3f %9.3f %9.3f %9.3f %7.2f  %.1e %.1e %.1e %.1e\n", shape, k.count, fwd,
                  bwd, cfwd, cbwd, (fwd + bwd) / (cfwd + cbwd), d_y, d_dx, d_g, d_b);
      ours_step += k.count * (fwd + bwd);
      cudnn_step += k.count * (cfwd + cbwd);
    }
    std::printf(
        "bn_bench: a step's 53 batch norms: ours %.2f ms, cuDNN %.2f ms (ours / cuDNN %.2f); largest "
        "difference of cuDNN's results from ours %.1e\n",
        ours_step, cudnn_step, ours_step / cudnn_step, worst);
    CUDNN_CHECK(cudnnDestroyActivationDescriptor(relu));
    CUDNN_CHECK(cudnnDestroyTensorDescriptor(bn_desc));
    CUDNN_CHECK(cudnnDestroyTensorDescriptor(x_desc));
    CUDNN_CHECK(cudnnDestroy(handle));
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
