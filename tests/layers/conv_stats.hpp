#pragma once
// Convolution kernels that hand the batch norm after them the sums of their output
// (ConvKernels::forward_stats: cuDNN's "conv -> genstats" graph in the GPU build), in
// a test backend around the process's own: StatsMode::Hide says they have none (the
// batch norms take their own sums), Pass hands the calls to the process's kernels
// (the GPU's), and Emulate runs the process's forward and then sums its output on the
// host in double (the CPU build, whose oneDNN has no such pass), declining the
// convolutions `declines` names as cuDNN declines a shape it has no engine for.
// Emulated, they apply the batch norm before them and its relu on the way in too
// (ConvKernels::forward_stats_after and backward_weights_after: cuDNN's
// "scale-bias-relu -> conv -> genstats" and "scale-bias-relu -> wgrad"), the input
// rectified on the host into a vector of the test's, unless Prologue::on is off;
// they decline forward_stats_after where they decline forward_stats, and
// backward_weights_after where Prologue::wgrad_declines says so. The data gradient of
// such a convolution comes through that batch norm's relu with its backward's sums
// (ConvKernels::backward_data_sums: cuDNN's dgrad with its epilogue's mask and sums),
// the mask and sums taken on the host after the process's backward_data, unless
// Prologue::dgrad is off; declined where Prologue::dgrad_declines says so.
// Layers made while a UseStatsBackend lives take these kernels; they must be gone
// before it is.

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "comm/check.hpp"
#include "forwarding_backend.hpp"

namespace ddp::test {

enum class StatsMode { Hide, Pass, Emulate };

struct StatsCalls {
  int made = 0;      // forward_stats and forward_stats_after calls that wrote the sums
  int declined = 0;  // forward_stats calls that did not
  int prologues = 0, prologues_declined = 0;  // forward_stats_after calls that wrote y and the sums, did not
  int wgrads = 0, wgrads_declined = 0;        // backward_weights_after calls that wrote dweight, did not
  int dgrads = 0, dgrads_declined = 0;        // backward_data_sums calls that wrote dx and the sums, did not
};

struct Prologue {
  using Declines = std::function<bool(const ConvGeometry&)>;
  Prologue(bool on_ = true, Declines wgrad = {}, bool dgrad_ = true, Declines dgrad_declined = {})
      : on(on_), wgrad_declines(std::move(wgrad)), dgrad(dgrad_), dgrad_declines(std::move(dgrad_declined)) {}
  bool on;
  Declines wgrad_declines;
  bool dgrad;
  Declines dgrad_declines;
};

// The index of element (b, c, p) of a (B, C, P) tensor of `layout` (a blocked one's
// channels padded to Cp).
inline std::int64_t element_at(Layout layout, std::int64_t b, std::int64_t c, std::int64_t p, std::int64_t C,
                               std::int64_t P) {
  const std::int64_t blk = channel_block(layout), Cp = (C + blk - 1) / blk * blk;
  if (layout == Layout::nchw) return (b * C + c) * P + p;
  if (layout == Layout::nhwc) return (b * P + p) * C + c;
  return ((b * (Cp / blk) + c / blk) * P + p) * blk + c % blk;
}

class StatsConv final : public ForwardingConvKernels {
 public:
  StatsConv(std::unique_ptr<ConvKernels> inner, const ConvGeometry& g, StatsMode mode, StatsCalls& calls,
            bool declines, bool prologue, bool wgrad_declines, bool dgrad, bool dgrad_declines)
      : ForwardingConvKernels(std::move(inner)),
        g_(g),
        mode_(mode),
        calls_(calls),
        declines_(declines),
        prologue_(prologue),
        wgrad_declines_(wgrad_declines),
        dgrad_(dgrad),
        dgrad_declines_(dgrad_declines) {}

  void configure(Precision precision, bool fused_relu, ConvSide in, ConvSide out) override {
    fused_relu_ = fused_relu;
    in_ = in;
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
  bool has_forward_prologue() const override {
    if (mode_ == StatsMode::Hide) return false;
    if (mode_ == StatsMode::Pass) return prologue_ && inner_->has_forward_prologue();
    return prologue_ && has_forward_stats();
  }
  bool forward_stats_after(std::int64_t B, const float* x, const float* scale_shift, const float* weight,
                           float* y, float* sums) override {
    bool made = false;
    if (mode_ == StatsMode::Pass) {
      made = inner_->forward_stats_after(B, x, scale_shift, weight, y, sums);
    } else if (mode_ == StatsMode::Emulate && B > 0 && !declines_) {
      const std::vector<float> r = rectified(B, x, scale_shift);
      inner_->forward(B, r.data(), weight, nullptr, y);
      host_sums(B, y, sums);
      made = true;
    }
    ++(made ? calls_.prologues : calls_.prologues_declined);
    calls_.made += made;
    return made;
  }
  bool backward_weights_after(std::int64_t B, const float* x, const float* scale_shift, const float* dy,
                              float* dweight, bool accumulate) override {
    bool made = false;
    if (mode_ == StatsMode::Pass) {
      made = inner_->backward_weights_after(B, x, scale_shift, dy, dweight, accumulate);
    } else if (mode_ == StatsMode::Emulate && B > 0 && !wgrad_declines_) {
      const std::vector<float> r = rectified(B, x, scale_shift);
      inner_->backward_weights(B, r.data(), dy, dweight, nullptr, accumulate);
      made = true;
    }
    ++(made ? calls_.wgrads : calls_.wgrads_declined);
    return made;
  }
  bool has_backward_data_sums() const override {
    if (mode_ == StatsMode::Pass) return prologue_ && dgrad_ && inner_->has_backward_data_sums();
    return dgrad_ && has_forward_prologue();
  }
  bool backward_data_sums(std::int64_t B, const float* dy, const float* weight, const float* x,
                          const float* scale_shift, const float* mean, float* dx, float* sums) override {
    bool made = false;
    if (mode_ == StatsMode::Pass) {
      made = inner_->backward_data_sums(B, dy, weight, x, scale_shift, mean, dx, sums);
    } else if (mode_ == StatsMode::Emulate && B > 0 && !dgrad_declines_) {
      inner_->backward_data(B, dy, weight, dx, false);
      masked_sums(B, x, scale_shift, mean, dx, sums);
      made = true;
    }
    ++(made ? calls_.dgrads : calls_.dgrads_declined);
    return made;
  }

 private:
  // relu(x scale + shift) per channel, of x's size and layout (zero in a blocked
  // layout's padding channels), on the host.
  std::vector<float> rectified(std::int64_t B, const float* x, const float* scale_shift) const {
    DDP_REQUIRE(!compute_backend().device_memory() && in_.type == Precision::fp32,
                "the emulated prologue reads an fp32 input on the host");
    Kokkos::fence();
    const std::int64_t C = g_.in, P = g_.h * g_.w, blk = channel_block(in_.layout),
                       Cp = (C + blk - 1) / blk * blk;
    std::vector<float> r(std::size_t(B * Cp * P), 0.0f);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t p = 0; p < P; ++p) {
          const std::int64_t at = element_at(in_.layout, b, c, p, C, P);
          const float v = x[at] * scale_shift[c] + scale_shift[C + c];
          r[std::size_t(at)] = v > 0.0f ? v : 0.0f;
        }
    return r;
  }

  // dx (fp32, the input side's layout) through the mask x scale + shift > 0, and its
  // channels' sums, then those of dx (x - mean), in double, stored as floats, on the host.
  void masked_sums(std::int64_t B, const float* x, const float* scale_shift, const float* mean, float* dx,
                   float* sums) const {
    DDP_REQUIRE(!compute_backend().device_memory() && in_.type == Precision::fp32,
                "the emulated data gradient's sums read an fp32 input on the host");
    Kokkos::fence();
    const std::int64_t C = g_.in, P = g_.h * g_.w;
    std::vector<double> sum(std::size_t(C), 0.0), centred(std::size_t(C), 0.0);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t p = 0; p < P; ++p) {
          const std::int64_t at = element_at(in_.layout, b, c, p, C, P);
          if (!(x[at] * scale_shift[c] + scale_shift[C + c] > 0.0f)) dx[at] = 0.0f;
          sum[std::size_t(c)] += dx[at];
          centred[std::size_t(c)] += double(dx[at]) * (double(x[at]) - mean[c]);
        }
    for (std::int64_t c = 0; c < C; ++c) {
      sums[c] = float(sum[std::size_t(c)]);
      sums[C + c] = float(centred[std::size_t(c)]);
    }
  }

  // The channels' sums of y (fp32, in the configured output layout) and of y^2, in
  // double, stored as floats (as cuDNN's are).
  void host_sums(std::int64_t B, const float* y, float* sums) const {
    DDP_REQUIRE(!compute_backend().device_memory() && out_.type == Precision::fp32,
                "the emulated statistics read an fp32 output on the host");
    Kokkos::fence();
    const std::int64_t C = g_.out, P = g_.ho() * g_.wo();
    std::vector<double> sum(std::size_t(C), 0.0), sq(std::size_t(C), 0.0);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t p = 0; p < P; ++p) {
          const double v = y[element_at(out_.layout, b, c, p, C, P)];
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
  bool prologue_;
  bool wgrad_declines_;
  bool dgrad_;
  bool dgrad_declines_;
  bool fused_relu_ = false;
  ConvSide in_, out_;
};

class StatsBackend final : public ForwardingBackend {
 public:
  StatsBackend(ComputeBackend& inner, StatsMode mode, std::function<bool(const ConvGeometry&)> declines,
               Prologue prologue)
      : ForwardingBackend(inner),
        mode_(mode),
        declines_(std::move(declines)),
        prologue_(std::move(prologue)) {}
  std::unique_ptr<ConvKernels> make_conv(const ConvGeometry& g) override {
    return std::make_unique<StatsConv>(inner_.make_conv(g), g, mode_, calls, declines_ && declines_(g),
                                       prologue_.on, prologue_.wgrad_declines && prologue_.wgrad_declines(g),
                                       prologue_.dgrad,
                                       prologue_.dgrad_declines && prologue_.dgrad_declines(g));
  }
  StatsCalls calls;

 private:
  StatsMode mode_;
  std::function<bool(const ConvGeometry&)> declines_;
  Prologue prologue_;
};

// A StatsBackend as the process's backend while it lives.
class UseStatsBackend {
 public:
  explicit UseStatsBackend(StatsMode mode, std::function<bool(const ConvGeometry&)> declines = {},
                           Prologue prologue = {}) {
    auto b =
        std::make_unique<StatsBackend>(compute_backend(), mode, std::move(declines), std::move(prologue));
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
