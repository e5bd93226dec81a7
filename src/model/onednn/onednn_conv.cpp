#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/check.hpp"
#include "model/kernel_trace.hpp"
#include "model/onednn/dnnl_engine.hpp"
#include "model/onednn/onednn_backend.hpp"

namespace ddp {

using dnnl::memory;
using tag = dnnl::memory::format_tag;

namespace {
// DDP_CONV_LAYOUT=plain keeps every primitive on NCHW/OIHW (no reorders), =nhwc on
// channels-last (the GPU's bf16 layout, to test its paths on the host); the default
// lets oneDNN choose: nChw8c blocked kernels on AVX2, nChw16c on AVX-512.
tag layout_tag() {
  static const tag chosen = [] {
    const char* v = std::getenv("DDP_CONV_LAYOUT");
    const std::string name = v ? v : "";
    return name == "plain" ? tag::nchw : name == "nhwc" ? tag::nhwc : tag::any;
  }();
  return chosen;
}
// The weights' layout: OIHW for plain, else oneDNN's choice (its nhwc kernels take blocked weights).
tag weights_tag() { return layout_tag() == tag::nchw ? tag::nchw : tag::any; }

tag format_of(Layout layout) {
  switch (layout) {
    case Layout::nChw8c:
      return tag::nChw8c;
    case Layout::nChw16c:
      return tag::nChw16c;
    case Layout::nhwc:
      return tag::nhwc;
    case Layout::nchw:
      break;
  }
  return tag::nchw;
}

// Our buffer of an activation or its gradient, in its layout.
memory::desc our_md(const memory::dims& dims, Layout layout) {
  return memory::desc(dims, memory::data_type::f32, format_of(layout));
}

// The blocked or channels-last layout a primitive's operand lies in, whatever its
// data type (a bf16 operand then costs our buffer a conversion, not a reorder); nchw
// for any other layout.
Layout blocked_layout_of(const memory::desc& md) {
  for (Layout l : {Layout::nChw8c, Layout::nChw16c, Layout::nhwc})
    if (md == memory::desc(md.dims(), md.data_type(), format_of(l))) return l;
  return Layout::nchw;
}

// The one blocked layout all of these operands lie in; nchw if they differ or none is blocked.
Layout common_blocked_layout(std::initializer_list<memory::desc> mds) {
  const Layout first = blocked_layout_of(*mds.begin());
  for (const memory::desc& md : mds)
    if (blocked_layout_of(md) != first) return Layout::nchw;
  return first;
}

// The batch the layout queries ask at: oneDNN's choice of layouts does not depend on
// it for these kernels (and if it ever did, the ports would reorder, correctly).
constexpr std::int64_t kLayoutProbeBatch = 64;
}  // namespace

// Activations live in our buffers (NCHW, or blocked as the model sets) and weights
// in PyTorch's OIHW layout. oneDNN picks each primitive's layouts (format_tag::any):
// where it prefers another layout or type than our buffer's (nChw8c with AVX2,
// nChw16c with AVX-512; bf16), a Port reorders between our buffer and a copy it owns, allocated once;
// where it takes ours, it works on our buffer directly. Scratchpads are ours too
// (user mode), allocated once.
namespace {
// For a benchmark's floor: a replay of the primitive call just made. Forward,
// backward-data and backward-weights each cost the forward's flops.
void trace(const char* what, double flops, const dnnl::primitive& prim,
           const std::unordered_map<int, memory>& args) {
  kernel_trace::count_library_call();
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
      : ours(our_md, eng, DNNL_MEMORY_NONE), reordered(copies(our_md, want, emulate)), rounding(emulate) {
    if (!reordered) {
      internal = ours;
      return;
    }
    internal = memory(want, eng);
    reorder = to_internal ? dnnl::reorder(ours, internal) : dnnl::reorder(internal, ours);
  }
  // Whether such a port holds a copy of its own (`want`'s size).
  static bool copies(const memory::desc& our_md, const memory::desc& want, Precision emulate) {
    return want != our_md || emulate != Precision::fp32;
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

struct Descs {
  dnnl::convolution_forward::primitive_desc fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights;
};

struct Primitives {
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

class OnednnConv final : public ConvKernels {
 public:
  explicit OnednnConv(const ConvGeometry& g) : g_(g) {}

  // fp32 sides only (takes_narrow_activations: no)
  void configure(Precision precision, bool fused_relu, ConvSide in_side, ConvSide out_side) override {
    DDP_REQUIRE(in_side.type == Precision::fp32 && out_side.type == Precision::fp32,
                "oneDNN's convolutions here read and write fp32 activations");
    const Layout in = in_side.layout, out = out_side.layout;
    if (precision != precision_ || fused_relu != fused_relu_ || in != in_layout_ || out != out_layout_)
      by_batch_.clear();
    precision_ = precision;
    fused_relu_ = fused_relu;
    in_layout_ = in;
    out_layout_ = out;
  }

  Layout native_input_layout() override {
    const Descs d = descs(kLayoutProbeBatch);
    return common_blocked_layout({d.fwd.src_desc(), d.bwd_weights.src_desc(), d.bwd_data.diff_src_desc()});
  }

  Layout native_output_layout() override {
    const Descs d = descs(kLayoutProbeBatch);
    return common_blocked_layout(
        {d.fwd.dst_desc(), d.bwd_weights.diff_dst_desc(), d.bwd_data.diff_dst_desc()});
  }

  void forward(std::int64_t B, const float* x, const float* weight, const float* bias, float* y) override {
    if (B == 0) return;
    Primitives& p = primitives(B);
    dnnl::stream& s = dnnl_stream();
    std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, p.fwd_x.in(x, s)},
                                            {DNNL_ARG_WEIGHTS, p.fwd_w.in(weight, s)},
                                            {DNNL_ARG_DST, p.fwd_y.out(y)},
                                            {DNNL_ARG_SCRATCHPAD, p.fwd_scratch}};
    if (g_.bias) {
      p.b.set_data_handle(const_cast<float*>(bias));
      args[DNNL_ARG_BIAS] = p.b;
    }
    p.fwd.execute(s, args);
    trace("conv2d fwd", g_.forward_flops(B), p.fwd, args);
    p.fwd_y.finish(s);
    s.wait();
  }

  void backward_weights(std::int64_t B, const float* x, const float* dy, float* dweight, float* dbias,
                        bool accumulate) override {
    const std::int64_t nw = g_.out * g_.in * g_.k * g_.k;
    if (B == 0) {
      if (!accumulate) {
        std::fill(dweight, dweight + nw, 0.0f);
        if (dbias) std::fill(dbias, dbias + g_.out, 0.0f);
      }
      return;
    }
    Primitives& p = primitives(B);
    dnnl::stream& s = dnnl_stream();
    // oneDNN overwrites its destinations: the layer's gradients when they are to be
    // written, else a scratch buffer that is then added to them.
    float* to = accumulate ? dparams_.data() : dweight;
    std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, p.bww_x.in(x, s)},
                                            {DNNL_ARG_DIFF_DST, p.bww_dy.in(dy, s)},
                                            {DNNL_ARG_DIFF_WEIGHTS, p.bww_dw.out(to)},
                                            {DNNL_ARG_SCRATCHPAD, p.bwd_weights_scratch}};
    if (g_.bias) {
      p.db.set_data_handle(accumulate ? to + nw : dbias);
      args[DNNL_ARG_DIFF_BIAS] = p.db;
    }
    p.bwd_weights.execute(s, args);
    trace("conv2d bwd_weights", g_.forward_flops(B), p.bwd_weights, args);
    p.bww_dw.finish(s);
    s.wait();
    if (accumulate) {
      for (std::int64_t i = 0; i < nw; ++i) dweight[i] += to[i];
      if (dbias)
        for (std::int64_t i = 0; i < g_.out; ++i) dbias[i] += to[nw + i];
    }
    dy_copied_ = dy;
  }

  // oneDNN's backward data has no sum post-op: accumulates_input_grad() is false.
  void backward_data(std::int64_t B, const float* dy, const float* weight, float* dx,
                     bool accumulate) override {
    DDP_REQUIRE(!accumulate, "oneDNN's convolution backward data does not add to dx");
    if (B == 0) return;
    Primitives& p = primitives(B);
    dnnl::stream& s = dnnl_stream();
    // Right after backward weights on the same dy, bww_dy holds its blocked copy.
    const bool shared = p.shared_dy && dy_copied_ == dy;
    dy_copied_ = nullptr;
    const memory& dy_mem = shared ? p.bww_dy.internal : p.bwd_dy.in(dy, s);
    const std::unordered_map<int, memory> args = {{DNNL_ARG_DIFF_DST, dy_mem},
                                                  {DNNL_ARG_WEIGHTS, p.bwd_w.in(weight, s)},
                                                  {DNNL_ARG_DIFF_SRC, p.bwd_dx.out(dx)},
                                                  {DNNL_ARG_SCRATCHPAD, p.bwd_data_scratch}};
    p.bwd_data.execute(s, args);
    trace("conv2d bwd_data", g_.forward_flops(B), p.bwd_data, args);
    p.bwd_dx.finish(s);
    s.wait();
  }

 private:
  Descs descs(std::int64_t B) const {
    dnnl_stream();  // pins this thread's OpenMP count first: kernels plan their threads at creation
    dnnl::engine& eng = dnnl_engine();
    const memory::dims x_dims = {B, g_.in, g_.h, g_.w}, y_dims = {B, g_.out, g_.ho(), g_.wo()},
                       w_dims = {g_.out, g_.in, g_.k, g_.k}, b_dims = {g_.out},
                       strides = {g_.stride, g_.stride}, padding = {g_.pad, g_.pad};
    const auto f32 = memory::data_type::f32;
    // Operands (x, w, and dy in backward) in bf16 for bf16 where oneDNN has bf16
    // kernels; results (y, dx, dw) in fp32. Emulated precisions run fp32 kernels.
    const auto op = precision_ == Precision::bf16 && dnnl_bf16().native ? memory::data_type::bf16 : f32;
    memory::desc b_md(b_dims, f32, tag::x), no_md;
    memory::desc x_any(x_dims, op, layout_tag()), y_any(y_dims, f32, layout_tag()),
        w_any(w_dims, op, weights_tag()), dy_any(y_dims, op, layout_tag()), dx_any(x_dims, f32, layout_tag()),
        dw_any(w_dims, f32, weights_tag());
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
                                        g_.bias ? b_md : no_md, y_any, strides, padding, padding),
        fwd_attr, eng);
    dnnl::convolution_backward_data::primitive_desc bwd_data_pd(
        dnnl::convolution_backward_data::desc(algo, dx_any, w_any, dy_any, strides, padding, padding), attr,
        eng, fwd_pd);
    dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd(
        dnnl::convolution_backward_weights::desc(algo, x_any, dw_any, g_.bias ? b_md : no_md, dy_any, strides,
                                                 padding, padding),
        attr, eng, fwd_pd);
    return {fwd_pd, bwd_data_pd, bwd_weights_pd};
  }

  // The precision the ports emulate by rounding fp32 copies: fp16 always, bf16 where
  // oneDNN has no bf16 kernels.
  Precision emulated() const {
    return precision_ == Precision::fp16 || (precision_ == Precision::bf16 && !dnnl_bf16().native)
               ? precision_
               : Precision::fp32;
  }
  // Our buffers of x (and dx), y (and dy) and the weights (and their gradient).
  struct OurDescs {
    memory::desc x, y, w;
  };
  OurDescs our_descs(std::int64_t B) const {
    return {our_md({B, g_.in, g_.h, g_.w}, in_layout_), our_md({B, g_.out, g_.ho(), g_.wo()}, out_layout_),
            memory::desc({g_.out, g_.in, g_.k, g_.k}, memory::data_type::f32, tag::oihw)};
  }

 public:
  // What primitives(B) allocates: the ports' copies, the three scratchpads, and the
  // weight gradients' buffer.
  std::int64_t held_bytes(std::int64_t B) const override {
    if (B == 0) return 0;
    const Descs d = descs(B);
    const OurDescs o = our_descs(B);
    const Precision e = emulated(), none = Precision::fp32;
    auto port = [](const memory::desc& ours, const memory::desc& want, Precision emulate) -> std::int64_t {
      return Port::copies(ours, want, emulate) ? std::int64_t(want.get_size()) : 0;
    };
    std::int64_t bytes =
        port(o.x, d.fwd.src_desc(), e) + port(o.w, d.fwd.weights_desc(), e) +
        port(o.y, d.fwd.dst_desc(), none) + port(o.y, d.bwd_data.diff_dst_desc(), e) +
        port(o.w, d.bwd_data.weights_desc(), e) + port(o.x, d.bwd_data.diff_src_desc(), none) +
        port(o.x, d.bwd_weights.src_desc(), e) + port(o.y, d.bwd_weights.diff_dst_desc(), e) +
        port(o.w, d.bwd_weights.diff_weights_desc(), none);
    bytes += std::int64_t(d.fwd.scratchpad_desc().get_size() + d.bwd_data.scratchpad_desc().get_size() +
                          d.bwd_weights.scratchpad_desc().get_size());
    return bytes + std::int64_t(dparams_size() * sizeof(float));
  }

 private:
  // Kept for two batch sizes at most: the largest (training's) and the last other
  // (an epoch's short last batch, validation's), each set holding copies of the
  // weights and activations; a third size replaces the other.
  Primitives& primitives(std::int64_t B) {
    auto it = by_batch_.find(B);
    if (it != by_batch_.end()) return *it->second;
    if (by_batch_.size() >= 2) {
      by_batch_.erase(by_batch_.begin());
      dy_copied_ = nullptr;
    }

    const Descs d = descs(B);
    dnnl::engine& eng = dnnl_engine();
    dparams_.resize(dparams_size());  // at the first call, after the start-up memory check that plans it
    const Precision emulate = emulated();
    const auto f32 = memory::data_type::f32;
    const OurDescs o = our_descs(B);
    const memory::desc &x_md = o.x, &y_md = o.y, &w_md = o.w;
    const memory::desc b_md({g_.out}, f32, tag::x);
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

  ConvGeometry g_;
  Precision precision_ = Precision::fp32;
  bool fused_relu_ = false;
  Layout in_layout_ = Layout::nchw, out_layout_ = Layout::nchw;
  std::size_t dparams_size() const {
    return std::size_t(g_.out * g_.in * g_.k * g_.k + (g_.bias ? g_.out : 0));
  }
  std::vector<float> dparams_;        // (out*in*k*k + out): oneDNN's weight and bias gradients
  const float* dy_copied_ = nullptr;  // the dy whose copy the last backward weights left in bww_dy
  std::map<std::int64_t, std::unique_ptr<Primitives>> by_batch_;
};

}  // namespace

std::unique_ptr<ConvKernels> make_onednn_conv(const ConvGeometry& geometry) {
  return std::make_unique<OnednnConv>(geometry);
}

}  // namespace ddp
