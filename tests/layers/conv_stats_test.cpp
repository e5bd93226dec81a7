// A residual block's batch norms taking their statistics from the sums the
// convolution before each wrote with its output (ConvKernels::forward_stats: cuDNN's
// "conv -> genstats" graph in the GPU build, under DDP_CUDNN_GRAPH=1), against the
// same blocks taking their own sums (conv_stats.hpp's StatsMode::Hide). In the CPU
// build, whose oneDNN has no such pass, the test backend computes the sums on the
// host after the process's forward (StatsMode::Emulate), so that how the blocks hand
// the sums over (which batch norm takes which, the projection's, the last stage's
// before the fused output, one declined shape among taken ones, the running
// statistics, the memory plan) is checked on every machine, and cuDNN's graphs where
// there is a GPU.

#include "conv_stats.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "block_chain.hpp"
#include "layer_fixture.hpp"

namespace ddp {
namespace {

using test::ChainResults;
using test::norm_relative_error;
using test::run_blocks;
using test::StatsMode;
using test::UseStatsBackend;

// A projection of both kinds and an identity: ten convolutions, each before a batch norm.
const std::vector<std::string> kSpecs = {"bottleneck(8, stride=2)", "bottleneck(8)",
                                         "resblock(32, stride=2)"};
const Shape kSample = {16, 9, 9};
constexpr int kConvs = 10, kSteps = 2;

bool on_gpu() { return compute_backend().device_memory(); }

// The GPU build's rule for cuDNN's engines: deterministic ones alone unless
// DDP_CUDNN_DETERMINISTIC=0.
bool deterministic() {
  const char* v = std::getenv("DDP_CUDNN_DETERMINISTIC");
  return !(v && std::string(v) == "0");
}

// The mode that computes the sums here: the GPU's own kernels, or the host's stand-in.
StatsMode with_sums() { return on_gpu() ? StatsMode::Pass : StatsMode::Emulate; }

// The precisions the blocks run at here: the GPU fuses narrow channels-last alone.
std::vector<Precision> precisions() {
  if (on_gpu()) return {Precision::bf16, Precision::fp16};
  return {Precision::fp32, Precision::bf16, Precision::fp16};
}

struct StatsRun {
  ChainResults r;
  test::StatsCalls calls;
};
StatsRun run(StatsMode mode, Precision p, const std::function<bool(const ConvGeometry&)>& declines = {}) {
  UseStatsBackend backend(mode, declines);
  StatsRun out;
  out.r = run_blocks(p, p != Precision::fp32, kSpecs, kSample);
  out.calls = backend.calls();
  return out;
}

std::int64_t runs(const ChainResults& r, const std::string& label) {
  const auto it = r.kernels.find(label);
  return it == r.kernels.end() ? 0 : it->second;
}

// The batch norms' own passes for their sums (the sums kernel's labels).
std::int64_t own_sums(const ChainResults& r) {
  return runs(r, "BatchNorm2d::forward_sums") + runs(r, "BatchNorm2d::forward_sums (rows)");
}

// The running statistics (mean, then var) of the first block's batch norms whose
// input is the same in every run: bn1's and the projection's, which read x through a
// single convolution. Every step of run_blocks takes the same x and parameters.
std::vector<float> first_statistics(const std::vector<float>& buffers) {
  const test::BoundLayer first(kSpecs.front(), kSample);
  std::vector<float> picked;
  std::size_t at = 0;
  for (const Layer::ParamSpec& b : first.layer->buffer_specs()) {
    const std::size_t n = std::size_t(shape_numel(b.shape));
    const bool wanted =
        b.suffix.rfind("bn1.running_", 0) == 0 || b.suffix.rfind("downsample.1.running_", 0) == 0;
    if (wanted)
      picked.insert(picked.end(), buffers.begin() + std::ptrdiff_t(at),
                    buffers.begin() + std::ptrdiff_t(at + n));
    at += n;
  }
  EXPECT_EQ(picked.size(), std::size_t(2 * 8 + 2 * 32)) << "bn1's and the projection's running statistics";
  return picked;
}

// With the sums from the convolutions against without. Where the batch norm's input
// is the same in both runs (first_statistics), its statistics differ by the sums'
// rounding to fp32 (cuDNN's are fp32) and, in a narrow type, by the sums being of the
// output before it was rounded to the type (the host's stand-in) or after; a tenth of
// the narrow type's rounding bounds that. Further on, each narrow rounding that moved
// moves what follows: less than the narrow type's own distance from fp32.
void expect_close(const StatsRun& with, const StatsRun& own, Precision p) {
  const ChainResults& a = with.r;
  const ChainResults& b = own.r;
  const double first = norm_relative_error(first_statistics(a.buffers), first_statistics(b.buffers));
  EXPECT_LT(first, p == Precision::fp32   ? 1e-6
                   : p == Precision::bf16 ? 0.1 / 256
                                          : 0.1 / 2048)
      << "the first batch norms' statistics";
  std::printf("  %s the first batch norms' running statistics: %.1e\n", precision_name(p), first);
  const double y = norm_relative_error(a.y, b.y), dx = norm_relative_error(a.dx, b.dx),
               grads = norm_relative_error(a.grads, b.grads),
               buffers = norm_relative_error(a.buffers, b.buffers);
  if (p == Precision::fp32) {
    EXPECT_LT(y, 1e-5);
    EXPECT_LT(dx, 1e-5);
    EXPECT_LT(grads, 1e-5);
    EXPECT_LT(buffers, 1e-6);
  } else {
    const ChainResults exact = run_blocks(Precision::fp32, false, kSpecs, kSample);
    EXPECT_LT(y, norm_relative_error(b.y, exact.y));
    EXPECT_LT(dx, norm_relative_error(b.dx, exact.dx));
    EXPECT_LT(grads, norm_relative_error(b.grads, exact.grads));
    EXPECT_LT(buffers, norm_relative_error(b.buffers, exact.buffers) + 1e-6);
    std::printf("  %s own against fp32: y %.1e dx %.1e grads %.1e buffers %.1e\n", precision_name(p),
                norm_relative_error(b.y, exact.y), norm_relative_error(b.dx, exact.dx),
                norm_relative_error(b.grads, exact.grads), norm_relative_error(b.buffers, exact.buffers));
  }
  std::printf("  %s with the convolutions' sums against own: y %.1e dx %.1e grads %.1e buffers %.1e\n",
              precision_name(p), y, dx, grads, buffers);
}

TEST(ConvolutionStatistics, BlocksTakeTheirBatchNormsSumsFromTheConvolutions) {
  for (Precision p : precisions()) {
    SCOPED_TRACE(precision_name(p));
    const StatsRun with = run(with_sums(), p), own = run(StatsMode::Hide, p);
    EXPECT_EQ(own.calls.made + own.calls.declined, 0) << "forward_stats was asked where it was hidden";
    EXPECT_EQ(runs(own.r, "BatchNorm2d::stats_from_sums"), 0);
    EXPECT_EQ(runs(with.r, "BatchNorm2d::stats_from_sums"), with.calls.made)
        << "a batch norm did not take the sums its convolution wrote";
    if (on_gpu()) {
      // cuDNN may decline a shape (no engine for its graph that the rules allow): those
      // batch norms sum themselves. Under the deterministic rule (the default) it may
      // decline all, where its engines for the graph sum with atomics.
      std::printf("  %s: cuDNN wrote the sums in %d calls, declined %d\n", precision_name(p), with.calls.made,
                  with.calls.declined);
      if (deterministic() && with.calls.made == 0)
        std::printf("  %s: every one declined under the deterministic rule\n", precision_name(p));
      else
        EXPECT_GT(with.calls.made, 0)
            << "cuDNN's graph API took none of the convolutions (DDP_CUDNN_GRAPH=1?)";
    } else {
      EXPECT_EQ(with.calls.made, kConvs * kSteps);
      EXPECT_EQ(with.calls.declined, 0);
      EXPECT_EQ(own_sums(with.r), 0) << "a batch norm summed its input itself";
      EXPECT_GT(own_sums(own.r), 0);
    }
    expect_close(with, own, p);
  }
}

// Where the kernels decline some convolutions (here every 3x3, as cuDNN declines a
// shape it has no engine for), those batch norms take their own sums and the rest
// the convolutions'; the blocks' one buffer of sums serves both kinds in turn.
TEST(ConvolutionStatistics, ADeclinedConvolutionsBatchNormSumsItself) {
  if (on_gpu())
    GTEST_SKIP() << "the host's stand-in declines by choice; cuDNN declines what it has no engine for";
  const auto three_by_three = [](const ConvGeometry& g) { return g.k == 3; };
  for (Precision p : precisions()) {
    SCOPED_TRACE(precision_name(p));
    const StatsRun with = run(StatsMode::Emulate, p, three_by_three), own = run(StatsMode::Hide, p);
    const int declined = 4 * kSteps;  // one 3x3 in each bottleneck, two in the basic block
    EXPECT_EQ(with.calls.declined, declined);
    EXPECT_EQ(with.calls.made, (kConvs * kSteps) - declined);
    EXPECT_EQ(runs(with.r, "BatchNorm2d::stats_from_sums"), with.calls.made);
    EXPECT_GT(own_sums(with.r), 0);
    expect_close(with, own, p);
  }
}

// What the blocks allocate in a training forward and backward with the sums from
// their convolutions (ResBlock::kept_floats: besides the stages', one buffer of sums
// a block) against what they plan, the same floats, as MemoryPlan's tests hold the
// blocks without.
TEST(ConvolutionStatistics, BlocksPlanWhatTheyAllocate) {
  const test::RecordAllocations recording;
  for (Precision p : precisions()) {
    SCOPED_TRACE(precision_name(p));
    UseStatsBackend backend(with_sums());
    test::BlockChain chain(p, p != Precision::fp32, kSpecs, kSample, nullptr);
    const test::ChainMemory m = test::step_memory(chain);
    std::printf("  %s: planned %lld floats, allocated %lld in %lld blocks\n", precision_name(p),
                (long long)m.planned, (long long)m.allocated, (long long)m.blocks);
    EXPECT_EQ(m.allocated, m.planned);
    if (!on_gpu()) {
      EXPECT_GT(backend.calls().made, 0);
    }
  }
}

}  // namespace
}  // namespace ddp
