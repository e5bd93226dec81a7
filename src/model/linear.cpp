#include "model/linear.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "comm/check.hpp"
#include "model/elements.hpp"
#include "model/gemm.hpp"
#include "model/select.hpp"

namespace ddp {

namespace {
// dy's first n elements zeroed where the fused relu's output y did not pass: the
// relu's backward, in place (dy is the relu's to mask: no layer reads it after the
// linear). A function of its own: CUDA's extended lambdas may not live in a private
// member.
void mask_by_relu(const Tensor& y, const Tensor& dy, std::int64_t n) {
  ConstView1 yv = y.data;
  View1 dyv = dy.data;
  Kokkos::parallel_for(
      "Linear::relu_backward", Range(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { dyv(i) = select_or_zero(relu_passes(yv(i)), dyv(i)); });
}
}  // namespace

// (in) -> (out), or a sequence (T, in) -> (T, out), as nn.Linear on (B, T, in). An
// image (C, H, W) stays an error: acting on its width is almost never what is meant.
Shape Linear::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 1 && in_sample.size() != 2)
    throw InputError("linear needs a flat input (features) but gets " + shape_str(in_sample) +
                     ": add 'flatten' before it");
  in_ = in_sample.back();
  in_sample_ = in_sample;
  out_sample_ = in_sample;
  out_sample_.back() = out_;
  return out_sample_;
}

std::vector<Layer::ParamSpec> Linear::parameter_specs() const {
  std::vector<ParamSpec> specs;
  if (!tied_) specs.push_back({"weight", {out_, in_}});
  if (has_bias_) specs.push_back({"bias", {out_}});
  return specs;
}

void Linear::bind(float* params, float* grads) {
  const std::int64_t own = tied_ ? 0 : out_ * in_;
  if (!tied_) {
    weight_ = params;
    dweight_ = grads;
  }
  bias_ = has_bias_ ? params + own : nullptr;
  dbias_ = has_bias_ ? grads + own : nullptr;
}

void Linear::tie(float* weight, float* dweight) {
  DDP_REQUIRE(tied_, "Linear::tie on a linear layer that is not tied");
  weight_ = weight;
  dweight_ = dweight;
}

void Linear::init(Rng& rng) {
  // kaiming_uniform_(a=sqrt(5)) on the weight and PyTorch's bias rule both reduce
  // to U(-1/sqrt(in), 1/sqrt(in)). A tied weight is the embedding's to initialise.
  float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  const std::uint64_t weight_key = rng.next_u64(), bias_key = rng.next_u64();
  if (!tied_) fill_uniform(weight_, out_ * in_, -bound, bound, weight_key);
  if (has_bias_) fill_uniform(bias_, out_, -bound, bound, bias_key);
}

void Linear::set_types(Precision in, Precision out) {
  DDP_REQUIRE(!fused_relu_ || (in == Precision::fp32 && out == Precision::fp32),
              "linear: narrow activations with a fused relu");
  in_type_ = in;
  out_type_ = out;
}

// x: (B, [T,] in) -> y: (B, [T,] out); the GEMM over its N = B (or B T) rows.
void Linear::forward(const Tensor& x, Tensor& y, bool training) { forward_adding(x, nullptr, y, training); }

void Linear::forward_adding(const Tensor& x, const Tensor* add, Tensor& y, bool /*training*/) {
  DDP_REQUIRE(x.type == in_type_,
              "linear: the input is " << precision_name(x.type) << ", planned " << precision_name(in_type_));
  const std::int64_t N = x.numel() / in_;
  DDP_REQUIRE(!add || (add->type == Precision::fp32 && out_type_ == Precision::fp32 && !fused_relu_ &&
                       add->numel() == N * out_),
              "linear: a residual of another shape or type than its fp32 output");
  resize(y, x.batch(), out_sample_, "Linear::y", Layout::nchw, out_type_);
  // y (N, out) = [add +] x (N, in) W^T (in, out) + b, relu'd where fused
  GemmEpilogue e;
  e.bias = bias_;
  e.add = add ? add->data.data() : nullptr;
  if (fused_relu_) e.act = GemmEpilogue::Act::relu;
  gemm_epilogue(false, true, N, out_, in_, x.data.data(), in_, weight_, in_, y.data.data(), out_, precision(),
                {x.type, Precision::fp32, out_type_}, e);
}

// pre, y: (B, [T,] out), both of the output type.
void Linear::forward_gelu(const Tensor& x, Tensor& pre, Tensor& y, bool tanh) {
  DDP_REQUIRE(x.type == in_type_ && !fused_relu_,
              "linear: the input is " << precision_name(x.type) << ", planned " << precision_name(in_type_));
  const std::int64_t N = x.numel() / in_;
  resize(pre, x.batch(), out_sample_, "Linear::y", Layout::nchw, out_type_);
  resize(y, x.batch(), out_sample_, "Gelu::y", Layout::nchw, out_type_);
  GemmEpilogue e;
  e.bias = bias_;
  e.act = GemmEpilogue::Act::gelu;
  e.tanh = tanh;
  e.pre = pre.data.data();
  gemm_epilogue(false, true, N, out_, in_, x.data.data(), in_, weight_, in_, y.data.data(), out_, precision(),
                {x.type, Precision::fp32, out_type_}, e);
}

// Backward's column of ones for the bias (grown only), and dy's narrow copy.
std::int64_t Linear::kept_floats(std::int64_t batch) const {
  return has_bias_ ? batch * shape_numel(in_sample_) / in_ : 0;
}

void Linear::scratch_floats(std::int64_t batch, SlotFloats& most) const {
  if (!needs_input_grad() || out_type_ != Precision::fp32) return;  // a narrow dy is read as it is
  std::int64_t& m = most[std::size_t(ScratchSlot::narrow_dy)];
  m = std::max(m, compute_backend().narrow_copy_floats(batch * shape_numel(out_sample_), precision()));
}

void Linear::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  backward_into(x, y, dy, dx, GemmEpilogue{});
}

void Linear::backward_gelu(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& pre, Tensor& dx,
                           bool tanh) {
  DDP_REQUIRE(needs_input_grad() && pre.type == in_type_ && pre.numel() == x.numel(),
              "linear: the GELU's input is not this layer's input's kind");
  GemmEpilogue e;
  e.act = GemmEpilogue::Act::dgelu;
  e.tanh = tanh;
  e.pre = const_cast<float*>(pre.data.data());  // read, not written
  backward_into(x, y, dy, dx, e);
}

void Linear::backward_into(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx,
                           const GemmEpilogue& dx_epilogue) {
  DDP_REQUIRE(dy.type == out_type_, "linear: the output gradient is " << precision_name(dy.type)
                                                                      << ", planned "
                                                                      << precision_name(out_type_));
  const std::int64_t N = x.numel() / in_, in = in_, out = out_;  // rows, as forward's
  const bool add = !overwrite_gradients(), narrow_dy = dy.type != Precision::fp32;
  if (fused_relu_) mask_by_relu(y, dy, N * out);
  // Read by two products where dx is wanted: narrowed once (a narrow dy is read as it is).
  std::optional<NarrowedOnce> dy_once;
  if (needs_input_grad() && !narrow_dy)
    dy_once.emplace(ScratchSlot::narrow_dy, dy.data.data(), N * out, precision(), "Linear::dy_narrow");
  // dW (out, in) += (or =) dy^T (out, N) x (N, in)
  gemm_stored(true, false, out, in, N, 1.0f, dy.data.data(), out, x.data.data(), in, add ? 1.0f : 0.0f,
              dweight_, in, precision(), {dy.type, x.type, Precision::fp32});
  // db (1, out) += (or =) ones^T (1, N) dy (N, out): a GEMV streams dy's rows once. A
  // sum per feature down dy's column ran scalar and strided on the host, 3% of the
  // MLP's 2-rank training time (perf, AVX2 EPYC). In fp32 whatever the precision: a
  // bias gradient was never rounded. A narrow dy at its own type, with ones (exact in
  // it): each product is dy's value, the sums fp32 as before.
  if (has_bias_) {
    if (ones_.extent(0) < std::size_t(N)) {  // grown only: a smaller batch uses a prefix
      ones_ = View1("Linear::ones", std::size_t(N));
      Kokkos::deep_copy(ones_, 1.0f);
    }
    gemm_stored(false, false, 1, out, N, 1.0f, ones_.data(), std::max<std::int64_t>(N, 1), dy.data.data(),
                out, add ? 1.0f : 0.0f, dbias_, out, dy.type, {Precision::fp32, dy.type, Precision::fp32});
  }
  if (!needs_input_grad()) return;
  resize(dx, x.batch(), in_sample_, "Linear::dx", Layout::nchw, in_type_);
  // dx (N, in) = dy (N, out) W (out, in), through the GELU before this layer where
  // backward_gelu asks
  gemm_epilogue(false, false, N, in, out, dy.data.data(), out, weight_, in, dx.data.data(), in, precision(),
                {dy.type, Precision::fp32, in_type_}, dx_epilogue);
}

}  // namespace ddp
