// A library batch norm (model/backend.hpp's BatchNormKernels) in BatchNorm2d and
// in the residual blocks, against the model's own kernels on the same inputs:
// BatchNorm2d alone (with and without its relu, two steps so the parameter
// gradients add, then eval on the running statistics it left) and residual blocks in
// a row, whose last batch norm then adds the shortcut and rectifies in the
// library's call. In the GPU build the library is cuDNN's persistent NHWC batch
// norm (DDP_CUDNN_BATCHNORM=1): both compute in fp32 and store bf16/fp16, and differ
// by the order of their sums, which moves a stored value by one rounding now and
// then. The CPU build's backend has no library batch norm: there a plain one written
// out below stands in for it, so that how the layers hand their tensors to a library
// and take its results (the shortcut, its gradient, the relu's mask, the running
// statistics, the gradients' accumulation) is checked on every machine, and cuDNN's
// arithmetic where there is a GPU.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "block_chain.hpp"
#include "layer_fixture.hpp"
#include "model/batchnorm.hpp"
#include "model/elements.hpp"
#include "model/kernel_trace.hpp"
#include "model/resblock.hpp"

namespace ddp {
namespace {

#if !defined(KOKKOS_ENABLE_CUDA)
// Before main, so before the host backend reads it: oneDNN's convolutions on
// channels-last, as the GPU's narrow ones, so the blocks keep their activations NHWC.
[[maybe_unused]] const bool kChannelsLast = setenv("DDP_CONV_LAYOUT", "nhwc", 1) == 0;

// The definition of a training batch norm on channels-last narrow tensors, element
// by element on the host, sums in double: the library of the CPU build's run.
class HostBatchNorm final : public BatchNormKernels {
 public:
  // What cuDNN keeps is its own; here a size that tells the passes apart (relu, the
  // shortcut's add), so that the memory plan's count of it is checked.
  std::size_t reserve_bytes(const BatchNormPass& p) override {
    return 4 * std::size_t((p.B * p.hw * p.C + 31) / 32 * (p.relu ? 2 : 1) * (p.add ? 3 : 1));
  }

  void forward_training(const BatchNormPass& p, const void* x, const void* z, void* y, const float* gamma,
                        const float* beta, float* running_mean, float* running_var, double momentum,
                        double eps, float* mean, float* invstd, void*, std::size_t) override {
    Kokkos::fence();
    const std::int64_t n = p.B * p.hw, C = p.C;
    for (std::int64_t c = 0; c < C; ++c) {
      double sum = 0, sum_sq = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double v = get(x, p, i * C + c);
        sum += v;
        sum_sq += v * v;
      }
      const double mu = sum / double(n), var = std::max(sum_sq / double(n) - mu * mu, 0.0);
      mean[c] = float(mu);
      invstd[c] = float(1.0 / std::sqrt(var + eps));
      running_mean[c] = float((1 - momentum) * running_mean[c] + momentum * mu);
      running_var[c] = float((1 - momentum) * running_var[c] + momentum * var * double(n) / double(n - 1));
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t e = i * C + c;
        float v = (get(x, p, e) - mean[c]) * invstd[c] * gamma[c] + beta[c];
        if (p.add) v += get(z, p, e);
        if (p.relu) v = std::max(v, 0.0f);
        set(y, p, e, v);
      }
    }
  }

  void backward(const BatchNormPass& p, const void* x, const void* y, const void* dy, void* dx, void* dz,
                const float* gamma, const float*, float* dgamma, float* dbeta, bool accumulate, double,
                const float* mean, const float* invstd, void*, std::size_t) override {
    Kokkos::fence();
    const std::int64_t n = p.B * p.hw, C = p.C;
    for (std::int64_t c = 0; c < C; ++c) {
      const auto grad = [&](std::int64_t e) {  // dy through the relu's mask
        return p.relu && !(get(y, p, e) > 0.0f) ? 0.0f : get(dy, p, e);
      };
      double sum_g = 0, sum_g_xhat = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t e = i * C + c;
        sum_g += grad(e);
        sum_g_xhat += double(grad(e)) * ((get(x, p, e) - mean[c]) * invstd[c]);
        if (p.add) set(dz, p, e, grad(e));
      }
      dbeta[c] = float(sum_g) + (accumulate ? dbeta[c] : 0.0f);
      dgamma[c] = float(sum_g_xhat) + (accumulate ? dgamma[c] : 0.0f);
      const float mean_g = float(sum_g / double(n)), mean_g_xhat = float(sum_g_xhat / double(n));
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t e = i * C + c;
        const float xhat = (get(x, p, e) - mean[c]) * invstd[c];
        set(dx, p, e, gamma[c] * invstd[c] * (grad(e) - mean_g - xhat * mean_g_xhat));
      }
    }
  }

 private:
  static float get(const void* t, const BatchNormPass& p, std::int64_t e) {
    const std::uint16_t h = static_cast<const std::uint16_t*>(t)[e];
    return p.type == Precision::bf16 ? from_bf16(h) : from_fp16(h);
  }
  static void set(void* t, const BatchNormPass& p, std::int64_t e, float v) {
    static_cast<std::uint16_t*>(t)[e] = p.type == Precision::bf16 ? to_bf16(v) : to_fp16(v);
  }
};
#endif

// The library under test: cuDNN's in the GPU build, the plain one on the host.
BatchNormKernels* library() {
#if defined(KOKKOS_ENABLE_CUDA)
  return compute_backend().batch_norm();
#else
  static HostBatchNorm host;
  return &host;
#endif
}

using test::BoundLayer;
using test::ChainResults;
using test::from_host;
using test::norm_relative_error;
using test::random_values;
using test::run_blocks;
using test::to_host;
using test::values;

// A (B, sample) channels-last tensor of `type` holding random values (rounded to it).
Tensor narrow_random(std::int64_t B, const Shape& sample, Precision type, std::uint32_t seed) {
  Tensor given, t;
  resize(given, B, sample, "test::given", Layout::nhwc);
  from_host(given.data, random_values(given.storage_numel(), seed, -2.0f, 2.0f));
  convert_type(given, t, type, "test::narrow");
  return t;
}

// One rounding of the stored type, relative: what a stored value may move by.
double rounding(Precision p) { return p == Precision::bf16 ? 1.0 / 256 : 1.0 / 2048; }

struct BatchNormResults {
  std::vector<float> y, dx, grads, buffers, y_eval;
  std::map<std::string, std::int64_t> kernels;  // the model's own kernels that ran, by label
};

BatchNormResults run_batchnorm(bool use_library, Precision p, bool relu, std::int64_t B,
                               const Shape& sample) {
  BoundLayer b("batchnorm2d", sample);
  auto& bn = dynamic_cast<BatchNorm2d&>(*b.layer);
  bn.set_library_kernels(use_library ? library() : nullptr);
  if (relu) bn.fuse_relu();
  // gamma and beta away from 1 and 0: the relu cuts each channel somewhere else
  const std::int64_t C = sample[0];
  std::vector<float> affine(2 * C);
  for (std::int64_t c = 0; c < C; ++c) {
    affine[c] = 0.5f + 0.03f * float(c % 17);
    affine[C + c] = 0.1f * float(c % 7) - 0.3f;
  }
  from_host(b.params, affine);
  const Tensor x = narrow_random(B, sample, p, 21), dy = narrow_random(B, sample, p, 22);
  EXPECT_EQ(bn.library_runs(x), use_library);
  Tensor y, dx;
  kernel_trace::start_counting();
  for (int step = 0; step < 2; ++step) {  // the parameter gradients of the second add to the first's
    b.layer->set_overwrite_gradients(step == 0);
    b.layer->forward(x, y, true);
    b.layer->backward(x, y, dy, dx);
  }
  BatchNormResults r;
  r.kernels = kernel_trace::stop_counting().kernels;
  EXPECT_EQ(y.type, p);
  EXPECT_EQ(y.layout, Layout::nhwc);
  EXPECT_EQ(dx.type, p);
  r.y = values(y);
  r.dx = values(dx);
  r.grads = to_host(b.grads, b.n);
  r.buffers = to_host(b.buffers, b.nbuf);
  b.layer->forward(x, y, false);  // eval: the model's kernels on the running statistics
  r.y_eval = values(y);
  return r;
}

// BatchNorm2d in the library against its own kernels: y and dx within a few
// roundings of the stored type (norm-relative), the parameter gradients (fp32,
// added over two steps) and the running statistics (a biased variance where PyTorch
// keeps the unbiased one would move running_var by 0.1 var / (n - 1): 0.6% at 18
// values a channel) to fp32 sums' order, the batch count exactly.
TEST(LibraryBatchNorm, AgreesWithTheModelsKernels) {
  ASSERT_NE(library(), nullptr) << "the GPU build's backend has no library batch norm";
  struct Case {
    std::int64_t B;
    Shape sample;
  };
  for (const Case& k : {Case{2, {64, 3, 3}}, Case{8, {32, 14, 14}}, Case{4, {256, 7, 7}}})
    for (Precision p : {Precision::bf16, Precision::fp16})
      for (bool relu : {false, true}) {
        SCOPED_TRACE(std::string(precision_name(p)) + (relu ? " relu" : "") + " B " + std::to_string(k.B) +
                     " " + shape_str(k.sample));
        const BatchNormResults lib = run_batchnorm(true, p, relu, k.B, k.sample),
                               own = run_batchnorm(false, p, relu, k.B, k.sample);
        // The library ran the passes: of the model's batch-norm kernels only the
        // batch count's ran (once a step), and the sums' ran without it.
        for (const auto& [label, count] : lib.kernels) {
          if (label.rfind("BatchNorm2d::", 0) == 0) {
            EXPECT_EQ(label, "BatchNorm2d::batches_tracked") << "ran " << count << " times with the library";
          }
        }
        const auto runs = [](const BatchNormResults& r, const std::string& label) {
          const auto it = r.kernels.find(label);
          return it == r.kernels.end() ? 0 : it->second;
        };
        EXPECT_EQ(runs(lib, "BatchNorm2d::batches_tracked"), 2);
        EXPECT_EQ(runs(own, "BatchNorm2d::forward_sums"), 2);
        EXPECT_LT(norm_relative_error(lib.y, own.y), 2 * rounding(p));
        EXPECT_LT(norm_relative_error(lib.dx, own.dx), 4 * rounding(p));
        EXPECT_LT(norm_relative_error(lib.grads, own.grads), 1e-4);
        const std::int64_t C = k.sample[0];
        ASSERT_EQ(lib.buffers.size(), std::size_t(2 * C + 1));
        EXPECT_EQ(lib.buffers.back(), 2.0f) << "num_batches_tracked";
        EXPECT_EQ(own.buffers.back(), 2.0f);
        const std::vector<float> mean_lib(lib.buffers.begin(), lib.buffers.begin() + C),
            mean_own(own.buffers.begin(), own.buffers.begin() + C),
            var_lib(lib.buffers.begin() + C, lib.buffers.end() - 1),
            var_own(own.buffers.begin() + C, own.buffers.end() - 1);
        EXPECT_LT(norm_relative_error(mean_lib, mean_own), 1e-5);
        EXPECT_LT(norm_relative_error(var_lib, var_own), 1e-5);
        EXPECT_LT(norm_relative_error(lib.y_eval, own.y_eval), 2 * rounding(p));
      }
}

// Residual blocks in a row (block_chain.hpp), activations narrow inside and between
// them (the model's plan on the GPU), channels-last inside, two steps each: the
// library's batch norms against the model's kernels. The chain's inner block boundaries take the library's
// add + relu: the first block's projection (its shortcut's batch norm written out,
// then added in cuDNN's kernel), the second's identity (the shortcut's gradient
// written by cuDNN's backward into dx, the first convolution adding onto it).
const std::vector<std::string> kSpecs = {"bottleneck(8, stride=2)", "bottleneck(8)", "bottleneck(8)"};
const Shape kSample = {16, 9, 9};

TEST(LibraryBatchNorm, BlocksAddTheirShortcutInIt) {
  ASSERT_NE(library(), nullptr) << "the GPU build's backend has no library batch norm";
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(precision_name(p));
    const ChainResults lib = run_blocks(p, true, kSpecs, kSample, library()),
                       own = run_blocks(p, true, kSpecs, kSample),
                       exact = run_blocks(Precision::fp32, false, kSpecs, kSample);
    // The model's kernels ran where the library did not: the last block's output
    // (fp32) and nothing else; the library's kernels ran the rest.
    EXPECT_EQ(own.kernels.count("ResBlock::bn_add_relu"), 1u);
    EXPECT_EQ(lib.kernels.count("ResBlock::bn_add_relu"), 1u);
    EXPECT_EQ(lib.kernels.at("ResBlock::bn_add_relu") * 3, own.kernels.at("ResBlock::bn_add_relu"))
        << "the library's batch norm did not take two of the three blocks' outputs";
    EXPECT_EQ(lib.kernels.count("BatchNorm2d::forward_relu"), 0u)
        << "a batch norm with its relu ran outside the library";
    // The two differ by roundings that the fp32 arithmetic of both moves now and then:
    // less than the narrow type's own distance from fp32.
    const double y = norm_relative_error(lib.y, own.y), dx = norm_relative_error(lib.dx, own.dx),
                 grads = norm_relative_error(lib.grads, own.grads);
    EXPECT_LT(y, norm_relative_error(own.y, exact.y));
    EXPECT_LT(dx, norm_relative_error(own.dx, exact.dx));
    EXPECT_LT(grads, norm_relative_error(own.grads, exact.grads));
    std::printf("%s: library against own y %.1e dx %.1e grads %.1e; own against fp32 %.1e %.1e %.1e\n",
                precision_name(p), y, dx, grads, norm_relative_error(own.y, exact.y),
                norm_relative_error(own.dx, exact.dx), norm_relative_error(own.grads, exact.grads));
  }
}

// The memory plan of residual blocks whose batch norms run in the library (as
// run_blocks chains them, narrow inside and between): what their training forward
// and backward allocate (ResBlock::kept_floats: besides the stages', the projection's
// batch norm written out for the last one to add and each one's reserve in the
// library) against what they plan, the same floats, as MemoryPlan.
// LayersAllocateWhatTheyPlan holds the model's own kernels. The first block adds its
// projection's shortcut in the library, the second its identity; the last, whose
// output is fp32, adds in the model's pass.
TEST(LibraryBatchNorm, BlocksPlanWhatTheyAllocate) {
  ASSERT_NE(library(), nullptr) << "the GPU build's backend has no library batch norm";
  const test::RecordAllocations recording;
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(precision_name(p));
    test::BlockChain chain(p, true, kSpecs, kSample, library());
    const test::ChainMemory m = test::step_memory(chain);
    std::printf("%s: planned %lld floats, allocated %lld in %lld blocks\n", precision_name(p),
                (long long)m.planned, (long long)m.allocated, (long long)m.blocks);
    EXPECT_EQ(m.allocated, m.planned);
  }
}

}  // namespace
}  // namespace ddp
