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
StatsRun run(StatsMode mode, Precision p, const std::function<bool(const ConvGeometry&)>& declines = {},
             test::Prologue prologue = {}) {
  UseStatsBackend backend(mode, declines, std::move(prologue));
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

// Two runs of the blocks, a against b: within fp32's rounding in fp32 (1e-5, the
// running statistics 1e-6); in a narrow type, each rounding that moved moves what
// follows: less than b's own distance from fp32.
void expect_within_rounding(const ChainResults& a, const ChainResults& b, Precision p, const char* what) {
  const double y = norm_relative_error(a.y, b.y), dx = norm_relative_error(a.dx, b.dx),
               grads = norm_relative_error(a.grads, b.grads),
               buffers = norm_relative_error(a.buffers, b.buffers);
  std::printf("  %s %s: y %.1e dx %.1e grads %.1e buffers %.1e\n", precision_name(p), what, y, dx, grads,
              buffers);
  if (p == Precision::fp32) {
    EXPECT_LT(y, 1e-5);
    EXPECT_LT(dx, 1e-5);
    EXPECT_LT(grads, 1e-5);
    EXPECT_LT(buffers, 1e-6);
    return;
  }
  const ChainResults exact = run_blocks(Precision::fp32, false, kSpecs, kSample);
  const double ey = norm_relative_error(b.y, exact.y), edx = norm_relative_error(b.dx, exact.dx),
               egrads = norm_relative_error(b.grads, exact.grads),
               ebuffers = norm_relative_error(b.buffers, exact.buffers);
  std::printf("  %s the second against fp32: y %.1e dx %.1e grads %.1e buffers %.1e\n", precision_name(p), ey,
              edx, egrads, ebuffers);
  EXPECT_LT(y, ey);
  EXPECT_LT(dx, edx);
  EXPECT_LT(grads, egrads);
  EXPECT_LT(buffers, ebuffers + 1e-6);
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
  expect_within_rounding(a, b, p, "with the convolutions' sums against own");
}

// The branch's batch norms before a convolution (bn1 and bn2 of a bottleneck, bn1 of a
// basic block): five a step in kSpecs.
constexpr int kBeforeConvs = 5;
// Their maps for the next convolution: 2C floats each (8, 8; 8, 8; 32 channels).
constexpr std::int64_t kScaleShiftFloats = 2 * (8 + 8 + 8 + 8 + 32);

// The passes that write a batch norm's rectified output r (forward's, or backward's
// where the weights' gradient could not take the prologue).
std::int64_t written_r(const ChainResults& r) { return runs(r, "BatchNorm2d::forward_relu"); }

// The stand-in's choice of shapes to decline, as cuDNN declines one it has no engine
// for: every 3x3 convolution.
bool three_by_three(const ConvGeometry& g) { return g.k == 3; }

// A run where the kernels declined some fused calls against one where they took them:
// the same forward, and backward within the fused and plain paths' rounding (fp32) or
// within 1e-2 (a narrow type).
void expect_declined_close(const ChainResults& declined, const ChainResults& taken, Precision p,
                           const char* what) {
  const double y = norm_relative_error(declined.y, taken.y), dx = norm_relative_error(declined.dx, taken.dx),
               grads = norm_relative_error(declined.grads, taken.grads);
  std::printf("  %s %s: y %.1e dx %.1e grads %.1e\n", precision_name(p), what, y, dx, grads);
  EXPECT_EQ(y, 0.0) << "the forward is the same";
  EXPECT_LT(dx, p == Precision::fp32 ? 1e-5 : 1e-2);
  EXPECT_LT(grads, p == Precision::fp32 ? 1e-5 : 1e-2);
}

TEST(ConvolutionStatistics, BlocksTakeTheirBatchNormsSumsFromTheConvolutions) {
  for (Precision p : precisions()) {
    SCOPED_TRACE(precision_name(p));
    const StatsRun with = run(with_sums(), p, {}, {false, {}}), own = run(StatsMode::Hide, p);
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

// With the next convolution applying a batch norm and its relu on the way in (the
// "scale-bias-relu -> conv -> genstats" forward and "scale-bias-relu -> wgrad"), the
// branch's batch norms before a convolution write no r, forward or backward, against
// the same blocks with the convolutions' sums alone. The map differs from the batch
// norm's own pass in its rounding (x scale + shift against (x - mean) invstd gamma +
// beta, fp32), and where the type is narrow r is rounded to it before the convolution
// reads it (the host's stand-in: the convolution's own rounding of its input; cuDNN
// reads it unrounded): within fp32's rounding, or less than the narrow type's own
// distance from fp32.
TEST(ConvolutionStatistics, TheNextConvolutionAppliesTheBatchNormOnItsWayIn) {
  for (Precision p : precisions()) {
    SCOPED_TRACE(precision_name(p));
    const StatsRun fused = run(with_sums(), p), stats = run(with_sums(), p, {}, {false, {}});
    EXPECT_EQ(stats.calls.prologues + stats.calls.prologues_declined + stats.calls.wgrads, 0)
        << "a prologue was asked for where it was off";
    EXPECT_GT(written_r(stats.r), 0);
    if (on_gpu()) {
      std::printf(
          "  %s: cuDNN applied the batch norm in %d forwards (declined %d), %d weights' gradients "
          "(declined %d)\n",
          precision_name(p), fused.calls.prologues, fused.calls.prologues_declined, fused.calls.wgrads,
          fused.calls.wgrads_declined);
    } else {
      EXPECT_EQ(fused.calls.prologues, kBeforeConvs * kSteps);
      EXPECT_EQ(fused.calls.prologues_declined, 0);
      EXPECT_EQ(fused.calls.wgrads, kBeforeConvs * kSteps);
      EXPECT_EQ(fused.calls.wgrads_declined, 0);
      EXPECT_EQ(fused.calls.made, kConvs * kSteps);
      EXPECT_EQ(written_r(fused.r), 0) << "a batch norm wrote the r its next convolution reads on the way in";
      EXPECT_EQ(written_r(stats.r), kBeforeConvs * kSteps);
      EXPECT_EQ(fused.calls.dgrads, kBeforeConvs * kSteps);
      EXPECT_EQ(runs(fused.r, "BatchNorm2d::backward_from_sums"), kBeforeConvs * kSteps);
    }
    expect_within_rounding(fused.r, stats.r, p, "applied on the way in against written");
  }
}

// The batch norms' backward passes for their sums: one a batch norm that sums itself
// (each followed by its rows' pass, not counted).
std::int64_t own_backward_sums(const ChainResults& r) { return runs(r, "BatchNorm2d::backward_sums"); }

// With the prologue, the next convolution's data gradient comes through the batch
// norm's relu with the sums of its backward ("dgrad -> drelu -> dbn"): those batch
// norms make no pass for their sums, and the rest of their backward is one pass over x
// and the gradient. Against the same blocks whose batch norms sum themselves: the
// relu's mask from the map (x scale + shift) against the batch norm's own floats, and
// the sums of the gradient before it is rounded to a narrow type (the host's stand-in
// and cuDNN alike) or after: within fp32's rounding, or less than the narrow type's
// own distance from fp32.
TEST(ConvolutionStatistics, TheDataGradientBringsTheBatchNormsSums) {
  for (Precision p : precisions()) {
    SCOPED_TRACE(precision_name(p));
    const StatsRun summed = run(with_sums(), p), own = run(with_sums(), p, {}, {true, {}, false});
    EXPECT_EQ(own.calls.dgrads + own.calls.dgrads_declined, 0) << "asked for where it was off";
    EXPECT_EQ(runs(own.r, "BatchNorm2d::backward_from_sums"), 0);
    EXPECT_EQ(runs(summed.r, "BatchNorm2d::backward_from_sums"), summed.calls.dgrads)
        << "a batch norm did not take the sums its next convolution's data gradient wrote";
    if (on_gpu()) {
      std::printf("  %s: cuDNN wrote the data gradient's sums in %d calls, declined %d\n", precision_name(p),
                  summed.calls.dgrads, summed.calls.dgrads_declined);
    } else {
      EXPECT_EQ(summed.calls.dgrads, kBeforeConvs * kSteps);
      EXPECT_EQ(summed.calls.dgrads_declined, 0);
      EXPECT_EQ(own_backward_sums(own.r) - own_backward_sums(summed.r), kBeforeConvs * kSteps)
          << "the batch norms before a convolution still summed their gradient themselves";
    }
    expect_within_rounding(summed.r, own.r, p, "sums from the data gradient against own");
  }
}

// Where the kernels decline a data gradient's sums (here every 3x3's, as cuDNN's
// runtime fusion declines a strided one), that convolution writes its data gradient as
// without them and the batch norm before it sums itself; the rest take the sums.
TEST(ConvolutionStatistics, ADeclinedDataGradientsBatchNormSumsItself) {
  if (on_gpu())
    GTEST_SKIP() << "the host's stand-in declines by choice; cuDNN declines what it has no engine for";
  for (Precision p : precisions()) {
    SCOPED_TRACE(precision_name(p));
    const StatsRun summed = run(StatsMode::Emulate, p),
                   declined = run(StatsMode::Emulate, p, {}, {true, {}, true, three_by_three});
    const int per_step = 3;  // the 3x3 after bn1 in each bottleneck, the basic block's second
    EXPECT_EQ(declined.calls.dgrads_declined, per_step * kSteps);
    EXPECT_EQ(declined.calls.dgrads, (kBeforeConvs - per_step) * kSteps);
    EXPECT_EQ(runs(declined.r, "BatchNorm2d::backward_from_sums"), (kBeforeConvs - per_step) * kSteps);
    EXPECT_EQ(own_backward_sums(declined.r) - own_backward_sums(summed.r), per_step * kSteps);
    expect_declined_close(declined.r, summed.r, p, "declined data gradients' sums against taken");
  }
}

// Where the kernels take the forward's prologue but decline the weights' gradient's
// (here every 3x3's, as cuDNN may have no engine for a shape's "scale-bias-relu ->
// wgrad"), the block writes that r in backward from the forward's statistics and runs
// the plain weights' gradient on it: the same results as the prologue throughout,
// within the two maps' rounding (fp32), and the mask of the batch norm's relu still
// from its input.
TEST(ConvolutionStatistics, ADeclinedWeightsGradientWritesTheInputInBackward) {
  if (on_gpu())
    GTEST_SKIP() << "the host's stand-in declines by choice; cuDNN declines what it has no engine for";
  for (Precision p : precisions()) {
    SCOPED_TRACE(precision_name(p));
    const StatsRun fused = run(StatsMode::Emulate, p),
                   declined = run(StatsMode::Emulate, p, {}, {true, three_by_three});
    const int per_step = 3;  // the 3x3 after bn1 in each bottleneck, the basic block's second
    EXPECT_EQ(declined.calls.prologues, kBeforeConvs * kSteps);
    EXPECT_EQ(declined.calls.wgrads_declined, per_step * kSteps);
    EXPECT_EQ(declined.calls.wgrads, (kBeforeConvs - per_step) * kSteps);
    EXPECT_EQ(written_r(declined.r), per_step * kSteps)
        << "r written in backward for the declined ones alone";
    expect_declined_close(declined.r, fused.r, p, "declined weights' gradients against the prologue's");
  }
}

// In eval the same stages take the batch norm's running statistics on the next
// convolution's way in: the eval forward allocates nothing after a training step (no
// r: the plan has none), and its output is the written path's within fp32's rounding.
TEST(ConvolutionStatistics, EvalAppliesTheRunningStatisticsOnTheWayIn) {
  const test::RecordAllocations recording;
  for (Precision p : precisions()) {
    SCOPED_TRACE(precision_name(p));
    std::vector<float> eval_y[2];
    for (bool prologue : {false, true}) {
      UseStatsBackend backend(with_sums(), {}, {prologue, {}});
      test::BlockChain chain(p, p != Precision::fp32, kSpecs, kSample, nullptr);
      chain.step();
      Kokkos::fence();
      const test::LiveBlocks before = test::live_blocks();
      const int prologues = backend.calls().prologues;
      for (std::size_t i = 0; i < chain.blocks.size(); ++i)
        chain.blocks[i]->layer->forward(i ? chain.acts[i - 1] : chain.x, chain.acts[i], false);
      Kokkos::fence();
      std::int64_t blocks = 0;
      const std::int64_t allocated = test::allocated_since(before, &blocks);
      eval_y[prologue] = test::to_host(chain.acts.back().data, chain.acts.back().numel());
      if (prologue && !on_gpu()) {
        EXPECT_EQ(allocated, 0) << "the eval forward allocated " << blocks << " blocks";
        EXPECT_EQ(backend.calls().prologues - prologues, kBeforeConvs);
      }
    }
    const double y = norm_relative_error(eval_y[1], eval_y[0]);
    std::printf("  %s eval applied on the way in against written: y %.1e\n", precision_name(p), y);
    EXPECT_LT(y, p == Precision::fp32 ? 1e-5 : p == Precision::bf16 ? 1e-2 : 2e-3);
  }
}

// What the blocks allocate in a training forward and backward with the sums from
// their convolutions (ResBlock::kept_floats: besides the stages', one buffer of sums
// a block), with the batch norms before a convolution applied on its way in (no r,
// the map's 2C floats) or not, against what they plan: the same floats, as
// MemoryPlan's tests hold the blocks without. (The plan with the prologue is less
// by the r it no longer writes.)
TEST(ConvolutionStatistics, BlocksPlanWhatTheyAllocate) {
  const test::RecordAllocations recording;
  for (Precision p : precisions()) {
    std::int64_t planned[2] = {0, 0};
    for (bool prologue : {false, true}) {
      SCOPED_TRACE(std::string(precision_name(p)) + (prologue ? " with the prologue" : " without"));
      UseStatsBackend backend(with_sums(), {}, {prologue, {}});
      test::BlockChain chain(p, p != Precision::fp32, kSpecs, kSample, nullptr);
      const test::ChainMemory m = test::step_memory(chain);
      std::printf("  %s%s: planned %lld floats, allocated %lld in %lld blocks\n", precision_name(p),
                  prologue ? " with the prologue" : "", (long long)m.planned, (long long)m.allocated,
                  (long long)m.blocks);
      planned[prologue] = m.planned;
      // cuDNN may decline a shape's prologue (forward or weights' gradient): that r is
      // written then, beyond the plan, as much as the plan without the prologue holds.
      const int declines = backend.calls().prologues_declined + backend.calls().wgrads_declined;
      if (on_gpu() && prologue && declines > 0) {
        std::printf("  %s: cuDNN declined %d prologues\n", precision_name(p), declines);
        EXPECT_LE(m.allocated, planned[0] + kScaleShiftFloats);
      } else {
        EXPECT_EQ(m.allocated, m.planned);
      }
      if (!on_gpu()) {
        EXPECT_GT(backend.calls().made, 0);
        EXPECT_EQ(backend.calls().prologues > 0, prologue);
      }
    }
    if (!on_gpu()) {
      EXPECT_LT(planned[1], planned[0]) << precision_name(p);
    }
  }
}

}  // namespace
}  // namespace ddp
