#pragma once
// Convolution kernels that hand the batch norm after them the sums of their output
// (ConvKernels::forward_stats: cuDNN's "conv -> genstats" graph in the GPU build), in
// a test backend around the process's own: StatsMode::Hide says they have none (the
// batch norms take their own sums), Pass hands the calls to the process's kernels
// (the GPU's), and Emulate runs the process's forward and then sums its output on the
// host in double (the CPU build, whose oneDNN has no such pass), declining the
// convolutions `declines` names as cuDNN declines a shape it has no engine for.
// Layers made while a UseStatsBackend lives take these kernels; they must be gone
// before it is.

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/check.hpp"
#include "forwarding_backend.hpp"

namespace ddp::test {

enum class StatsMode { Hide, Pass, Emulate };

struct StatsCalls {
  int made = 0;      // forward_stats calls that wrote the sums
  int declined = 0;  // and that did not
};

class StatsConv final : public ForwardingConvKernels {
 public:
  StatsConv(std::unique_ptr<ConvKernels> inner, const ConvGeometry& g, StatsMode mode, StatsCalls& calls,
            bool declines)
      : ForwardingConvKernels(std::move(inner)), g_(g), mode_(mode), calls_(calls), declines_(declines) {}

  void configure(Precision precision, bool fused_relu, ConvSide in, ConvSide out) override {
    fused_relu_ = fused_relu;
    out_ = out;
    ForwardingConvKernels::configure(precision, fused_relu, in, out);
  }
  bool has_forward_stats() const override {
    if (mode_ == StatsMode::Hide) return false;
    if (mode_ == StatsMode::Pass) return inner_->has_forward_stats();
    return !g_.bias && !fused_relu_;
  }
  bool forward_stats(std::int64_t B, const float* x, const float* weight, float* y, float* sums) override {
    bool made = false;
    if (mode_ == StatsMode::Pass) {
      made = inner_->forward_stats(B, x, weight, y, sums);
    } else if (mode_ == StatsMode::Emulate && B > 0 && !declines_) {
      inner_->forward(B, x, weight, nullptr, y);
      host_sums(B, y, sums);
      made = true;
    }
    ++(made ? calls_.made : calls_.declined);
    return made;
  }

 private:
  // The channels' sums of y (fp32, in the configured output layout) and of y^2, in
  // double, stored as floats (as cuDNN's are).
  void host_sums(std::int64_t B, const float* y, float* sums) const {
    DDP_REQUIRE(!compute_backend().device_memory() && out_.type == Precision::fp32,
                "the emulated statistics read an fp32 output on the host");
    Kokkos::fence();
    const std::int64_t C = g_.out, P = g_.ho() * g_.wo(), blk = channel_block(out_.layout),
                       Cp = (C + blk - 1) / blk * blk;
    std::vector<double> sum(std::size_t(C), 0.0), sq(std::size_t(C), 0.0);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t p = 0; p < P; ++p) {
          std::int64_t at;
          if (out_.layout == Layout::nchw)
            at = (b * C + c) * P + p;
          else if (out_.layout == Layout::nhwc)
            at = (b * P + p) * C + c;
          else
            at = ((b * (Cp / blk) + c / blk) * P + p) * blk + c % blk;
          const double v = y[at];
          sum[std::size_t(c)] += v;
          sq[std::size_t(c)] += v * v;
        }
    for (std::int64_t c = 0; c < C; ++c) {
      sums[c] = float(sum[std::size_t(c)]);
      sums[C + c] = float(sq[std::size_t(c)]);
    }
  }

  ConvGeometry g_;
  StatsMode mode_;
  StatsCalls& calls_;
  bool declines_;
  bool fused_relu_ = false;
  ConvSide out_;
};

class StatsBackend final : public ForwardingBackend {
 public:
  StatsBackend(ComputeBackend& inner, StatsMode mode, std::function<bool(const ConvGeometry&)> declines)
      : ForwardingBackend(inner), mode_(mode), declines_(std::move(declines)) {}
  std::unique_ptr<ConvKernels> make_conv(const ConvGeometry& g) override {
    return std::make_unique<StatsConv>(inner_.make_conv(g), g, mode_, calls, declines_ && declines_(g));
  }
  StatsCalls calls;

 private:
  StatsMode mode_;
  std::function<bool(const ConvGeometry&)> declines_;
};

// A StatsBackend as the process's backend while it lives.
class UseStatsBackend {
 public:
  explicit UseStatsBackend(StatsMode mode, std::function<bool(const ConvGeometry&)> declines = {}) {
    auto b = std::make_unique<StatsBackend>(compute_backend(), mode, std::move(declines));
    backend_ = b.get();
    own_ = swap_compute_backend(std::move(b));
  }
  ~UseStatsBackend() { swap_compute_backend(std::move(own_)); }
  UseStatsBackend(const UseStatsBackend&) = delete;
  UseStatsBackend& operator=(const UseStatsBackend&) = delete;
  const StatsCalls& calls() const { return backend_->calls; }

 private:
  std::unique_ptr<ComputeBackend> own_;
  StatsBackend* backend_;
};

}  // namespace ddp::test
