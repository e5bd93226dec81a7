#include "model/conv2d.hpp"

#include <cmath>
#include <cstdlib>
#include <string>

#include "comm/check.hpp"
#include "model/dnnl_engine.hpp"
#include "model/kernel_trace.hpp"
#include "model/precision.hpp"

namespace ddp {

using dnnl::memory;
using tag = dnnl::memory::format_tag;

namespace {
// DDP_CONV_LAYOUT=plain keeps every primitive on NCHW/OIHW (no reorders); the
// default lets oneDNN choose, which on AVX-512 means nChw16c blocked kernels.
tag layout_tag() {
  static const bool plain = [] {
    const char* v = std::getenv("DDP_CONV_LAYOUT");
    return v && std::string(v) == "plain";
  }();
  return plain ? tag::nchw : tag::any;
}

// Our buffer of an activation or its gradient, in its layout.
memory::desc our_md(const memory::dims& dims, Layout layout) {
  return memory::desc(dims, memory::data_type::f32, layout == Layout::blocked16 ? tag::nChw16c : tag::nchw);
}

// Whether a primitive's operand lies as blocked16, whatever its data type: a bf16
// operand then costs our blocked buffer a conversion, not a reorder.
bool is_blocked16(const memory::desc& md) {
  return md == memory::desc(md.dims(), md.data_type(), tag::nChw16c);
}

// The batch the layout queries ask at: oneDNN's choice of layouts does not depend on
// it for these kernels (and if it ever did, the ports would reorder, correctly).
constexpr std::int64_t kLayoutProbeBatch = 64;
}  // namespace

// Activations live in our buffers (NCHW, or blocked16 as the model sets) and weights
// in PyTorch's OIHW layout. oneDNN picks each primitive's layouts (format_tag::any):
// where it prefers another layout or type than our buffer's (nChw16c with AVX-512;
// bf16), a Port reorders between our buffer and a copy it owns, allocated once;
// where it takes ours, it works on our buffer directly. Scratchpads are ours too
// (user mode), allocated once.
namespace {
// For a benchmark's floor: a replay of the primitive call just made. Forward,
// backward-data and backward-weights each cost the forward's flops.
void trace(const char* what, double flops, const dnnl::primitive& prim,
           const std::unordered_map<int, memory>& args) {
  if (!kernel_trace::recording()) return;
  kernel_trace::record({what, flops, [prim, args] {
                          prim.execute(dnnl_stream(), args);
                          dnnl_stream().wait();
                        }});
}

struct Port {
  memory ours;      // over our buffer; the handle is re-pointed on every call
  memory internal;  // the primitive's layout and type: == ours when no reorder is needed
  dnnl::reorder reorder;
  bool reordered = false;
  Precision rounding = Precision::fp32;  // an input whose fp32 copy is rounded to bf16/fp16 values

  Port() = default;
  // to_internal: our buffer is an input of the primitive (else an output).
  // emulate: (inputs only) bf16 or fp16 emulated in fp32: always copy, and round the
  // copy to that precision's values.
  Port(const memory::desc& our_md, const memory::desc& want, bool to_internal, dnnl::engine& eng,
       Precision emulate = Precision::fp32)
      : ours(our_md, eng, DNNL_MEMORY_NONE),
        reordered(want != our_md || emulate != Precision::fp32),
        rounding(emulate) {
    if (!reordered) {
      internal = ours;
      return;
    }
    internal = memory(want, eng);
    reorder = to_internal ? dnnl::reorder(ours, internal) : dnnl::reorder(internal, ours);
  }
  // An input: point at `data` and bring it into the primitive's layout and type.
  const memory& in(const float* data, dnnl::stream& s) {
    ours.set_data_handle(const_cast<float*>(data));
    if (reordered) reorder.execute(s, ours, internal);
    if (rounding != Precision::fp32) {
      s.wait();
      float* p = static_cast<float*>(internal.get_data_handle());
      round_to_precision(rounding, p, p, std::int64_t(internal.get_desc().get_size() / sizeof(float)));
    }
    return internal;
  }
  // An output: point at `data`; finish() copies the result there.
  const memory& out(float* data) {
    ours.set_data_handle(data);
    return internal;
  }
  void finish(dnnl::stream& s) {
    if (reordered) reorder.execute(s, internal, ours);
  }
};
}  // namespace

struct Conv2d::Descs {
  dnnl::convolution_forward::primitive_desc fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights;
};

struct Conv2d::Primitives {
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights bwd_weights;
  memory b, db;                // bias, its gradient: always plain (x)
  Port fwd_x, fwd_w, fwd_y;    // forward: src, weights, dst
  Port bwd_dy, bwd_w, bwd_dx;  // backward data: diff_dst, weights, diff_src
  Port bww_x, bww_dy, bww_dw;  // backward weights: src, diff_dst, diff_weights
  bool shared_dy = false;      // backward data reads bww_dy's blocked copy of dy: one reorder, not two
  memory fwd_scratch, bwd_data_scratch, bwd_weights_scratch;
};

Conv2d::Conv2d(std::int64_t out_channels, std::int64_t kernel, std::int64_t stride, std::int64_t pad,
               bool bias)
    : out_(out_channels), k_(kernel), stride_(stride), pad_(pad), has_bias_(bias) {}

Conv2d::~Conv2d() = default;

Shape Conv2d::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 3)
    throw InputError("conv2d needs an image input (channels, height, width) but gets " +
                     shape_str(in_sample));
  in_ = in_sample[0];
  h_ = in_sample[1];
  w_ = in_sample[2];
  if (h_ + 2 * pad_ < k_ || w_ + 2 * pad_ < k_)
    throw InputError("kernel " + std::to_string(k_) + " is larger than the padded input " +
                     shape_str(in_sample));
  ho_ = (h_ + 2 * pad_ - k_) / stride_ + 1;
  wo_ = (w_ + 2 * pad_ - k_) / stride_ + 1;
  in_sample_ = in_sample;
  out_sample_ = {out_, ho_, wo_};
  return out_sample_;
}

std::vector<Layer::ParamSpec> Conv2d::parameter_specs() const {
  std::vector<ParamSpec> specs = {{"weight", {out_, in_, k_, k_}}};
  if (has_bias_) specs.push_back({"bias", {out_}});
  return specs;
}

void Conv2d::bind(float* params, float* grads) {
  const std::int64_t nw = out_ * in_ * k_ * k_;
  weight_ = params;
  dweight_ = grads;
  bias_ = has_bias_ ? params + nw : nullptr;
  dbias_ = has_bias_ ? grads + nw : nullptr;
  dparams_scratch_ = View1("Conv2d::dparams_scratch", nw + out_);
}

void Conv2d::init(Rng& rng) {
  // kaiming_uniform_(a=sqrt(5)) and PyTorch's bias rule: U(-1/sqrt(fan_in), +) with
  // fan_in = in * k * k.
  float bound = 1.0f / std::sqrt(static_cast<float>(in_ * k_ * k_));
  fill_uniform(weight_, out_ * in_ * k_ * k_, -bound, bound, rng.next_u64());
  if (has_bias_) fill_uniform(bias_, out_, -bound, bound, rng.next_u64());
}

void Conv2d::set_precision(Precision p) {
  if (p != precision()) by_batch_.clear();
  Layer::set_precision(p);
}

bool Conv2d::blocked_input_fits() const {
  const Descs d = descs(kLayoutProbeBatch);
  return is_blocked16(d.fwd.src_desc()) && is_blocked16(d.bwd_weights.src_desc()) &&
         is_blocked16(d.bwd_data.diff_src_desc());
}

bool Conv2d::blocked_output_fits() const {
  const Descs d = descs(kLayoutProbeBatch);
  return is_blocked16(d.fwd.dst_desc()) && is_blocked16(d.bwd_weights.diff_dst_desc()) &&
         is_blocked16(d.bwd_data.diff_dst_desc());
}

void Conv2d::set_layouts(Layout in, Layout out) {
  if (in != in_layout_ || out != out_layout_) by_batch_.clear();
  in_layout_ = in;
  out_layout_ = out;
}

double Conv2d::forward_flops(std::int64_t B) const { return 2.0 * B * out_ * ho_ * wo_ * in_ * k_ * k_; }

Conv2d::Descs Conv2d::descs(std::int64_t B) const {
  dnnl_stream();  // pins this thread's OpenMP count first: kernels plan their threads at creation
  dnnl::engine& eng = dnnl_engine();
  const memory::dims x_dims = {B, in_, h_, w_}, y_dims = {B, out_, ho_, wo_}, w_dims = {out_, in_, k_, k_},
                     b_dims = {out_}, strides = {stride_, stride_}, padding = {pad_, pad_};
  const auto f32 = memory::data_type::f32;
  // Operands (x, w, and dy in backward) in bf16 for bf16 where oneDNN has bf16
  // kernels; results (y, dx, dw) in fp32. Emulated precisions run fp32 kernels.
  const auto op = precision() == Precision::bf16 && dnnl_bf16().native ? memory::data_type::bf16 : f32;
  memory::desc b_md(b_dims, f32, tag::x), no_md;
  memory::desc x_any(x_dims, op, layout_tag()), y_any(y_dims, f32, layout_tag()),
      w_any(w_dims, op, layout_tag()), dy_any(y_dims, op, layout_tag()), dx_any(x_dims, f32, layout_tag()),
      dw_any(w_dims, f32, layout_tag());
  dnnl::primitive_attr attr, fwd_attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  fwd_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (fused_relu_) {
    dnnl::post_ops relu;
    relu.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    fwd_attr.set_post_ops(relu);
  }
  const auto algo = dnnl::algorithm::convolution_direct;
  dnnl::convolution_forward::primitive_desc fwd_pd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, x_any, w_any,
                                      has_bias_ ? b_md : no_md, y_any, strides, padding, padding),
      fwd_attr, eng);
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd(
      dnnl::convolution_backward_data::desc(algo, dx_any, w_any, dy_any, strides, padding, padding), attr,
      eng, fwd_pd);
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd(
      dnnl::convolution_backward_weights::desc(algo, x_any, dw_any, has_bias_ ? b_md : no_md, dy_any, strides,
                                               padding, padding),
      attr, eng, fwd_pd);
  return {fwd_pd, bwd_data_pd, bwd_weights_pd};
}

Conv2d::Primitives& Conv2d::primitives(std::int64_t B) {
  auto it = by_batch_.find(B);
  if (it != by_batch_.end()) return *it->second;

  const Descs d = descs(B);
  dnnl::engine& eng = dnnl_engine();
  // The precision the ports emulate by rounding fp32 copies: fp16 always, bf16 where
  // oneDNN has no bf16 kernels.
  const Precision emulate =
      precision() == Precision::fp16 || (precision() == Precision::bf16 && !dnnl_bf16().native)
          ? precision()
          : Precision::fp32;
  const auto f32 = memory::data_type::f32;
  const memory::desc x_md = our_md({B, in_, h_, w_}, in_layout_),
                     y_md = our_md({B, out_, ho_, wo_}, out_layout_),
                     w_md({out_, in_, k_, k_}, f32, tag::oihw), b_md({out_}, f32, tag::x);
  auto p = std::make_unique<Primitives>();
  p->fwd = dnnl::convolution_forward(d.fwd);
  p->bwd_data = dnnl::convolution_backward_data(d.bwd_data);
  p->bwd_weights = dnnl::convolution_backward_weights(d.bwd_weights);
  p->fwd_x = Port(x_md, d.fwd.src_desc(), true, eng, emulate);
  p->fwd_w = Port(w_md, d.fwd.weights_desc(), true, eng, emulate);
  p->fwd_y = Port(y_md, d.fwd.dst_desc(), false, eng);
  p->bwd_dy = Port(y_md, d.bwd_data.diff_dst_desc(), true, eng, emulate);
  p->bwd_w = Port(w_md, d.bwd_data.weights_desc(), true, eng, emulate);
  p->bwd_dx = Port(x_md, d.bwd_data.diff_src_desc(), false, eng);
  p->bww_x = Port(x_md, d.bwd_weights.src_desc(), true, eng, emulate);
  p->bww_dy = Port(y_md, d.bwd_weights.diff_dst_desc(), true, eng, emulate);
  p->bww_dw = Port(w_md, d.bwd_weights.diff_weights_desc(), false, eng);
  p->shared_dy = p->bww_dy.reordered && d.bwd_data.diff_dst_desc() == d.bwd_weights.diff_dst_desc();
  p->b = memory(b_md, eng, DNNL_MEMORY_NONE);
  p->db = memory(b_md, eng, DNNL_MEMORY_NONE);
  p->fwd_scratch = memory(d.fwd.scratchpad_desc(), eng);
  p->bwd_data_scratch = memory(d.bwd_data.scratchpad_desc(), eng);
  p->bwd_weights_scratch = memory(d.bwd_weights.scratchpad_desc(), eng);
  return *by_batch_.emplace(B, std::move(p)).first->second;
}

// x: (B, in, h, w) -> y: (B, out, ho, wo), rectified when fused with a relu
void Conv2d::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  DDP_REQUIRE(x.layout == in_layout_, "conv2d input in another layout than the model set");
  const std::int64_t B = x.batch();
  resize(y, B, out_sample_, "Conv2d::y", out_layout_);
  if (B == 0) return;
  Primitives& p = primitives(B);
  dnnl::stream& s = dnnl_stream();
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, p.fwd_x.in(x.data.data(), s)},
                                          {DNNL_ARG_WEIGHTS, p.fwd_w.in(weight_, s)},
                                          {DNNL_ARG_DST, p.fwd_y.out(y.data.data())},
                                          {DNNL_ARG_SCRATCHPAD, p.fwd_scratch}};
  if (has_bias_) {
    p.b.set_data_handle(bias_);
    args[DNNL_ARG_BIAS] = p.b;
  }
  p.fwd.execute(s, args);
  trace("conv2d fwd", forward_flops(B), p.fwd, args);
  p.fwd_y.finish(s);
  s.wait();
}

// dy: (B, out, ho, wo) -> dW (out, in, k, k) +=, db (out) +=, dx: (B, in, h, w)
void Conv2d::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  DDP_REQUIRE(dy.layout == out_layout_, "conv2d output gradient in another layout than the model set");
  const std::int64_t B = x.batch();
  if (B > 0) {
    Primitives& p = primitives(B);
    dnnl::stream& s = dnnl_stream();
    const std::int64_t nw = out_ * in_ * k_ * k_, nparams = nw + (has_bias_ ? out_ : 0);
    float* scratch = dparams_scratch_.data();
    std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, p.bww_x.in(x.data.data(), s)},
                                            {DNNL_ARG_DIFF_DST, p.bww_dy.in(dy.data.data(), s)},
                                            {DNNL_ARG_DIFF_WEIGHTS, p.bww_dw.out(scratch)},
                                            {DNNL_ARG_SCRATCHPAD, p.bwd_weights_scratch}};
    if (has_bias_) {
      p.db.set_data_handle(scratch + nw);
      args[DNNL_ARG_DIFF_BIAS] = p.db;
    }
    p.bwd_weights.execute(s, args);
    trace("conv2d bwd_weights", forward_flops(B), p.bwd_weights, args);
    p.bww_dw.finish(s);
    s.wait();
    // Accumulate, as PyTorch does: weight then bias sit contiguously in both.
    float* dparams = dweight_;
    Kokkos::parallel_for(
        "Conv2d::accumulate_dparams", Range(0, nparams),
        KOKKOS_LAMBDA(std::int64_t i) { dparams[i] += scratch[i]; });
  }
  if (!needs_input_grad()) return;
  resize(dx, B, in_sample_, "Conv2d::dx", in_layout_);
  if (B == 0) return;
  Primitives& p = primitives(B);
  dnnl::stream& s = dnnl_stream();
  // Backward weights ran just before (B > 0) and left dy's blocked copy in bww_dy.
  const memory& dy_mem = p.shared_dy ? p.bww_dy.internal : p.bwd_dy.in(dy.data.data(), s);
  const std::unordered_map<int, memory> args = {{DNNL_ARG_DIFF_DST, dy_mem},
                                                {DNNL_ARG_WEIGHTS, p.bwd_w.in(weight_, s)},
                                                {DNNL_ARG_DIFF_SRC, p.bwd_dx.out(dx.data.data())},
                                                {DNNL_ARG_SCRATCHPAD, p.bwd_data_scratch}};
  p.bwd_data.execute(s, args);
  trace("conv2d bwd_data", forward_flops(B), p.bwd_data, args);
  p.bwd_dx.finish(s);
  s.wait();
}

}  // namespace ddp
