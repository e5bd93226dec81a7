#include "model/resblock.hpp"

#include <algorithm>

#include "comm/check.hpp"
#include "model/activation.hpp"
#include "model/elements.hpp"
#include "model/planes.hpp"
#include "model/select.hpp"

namespace ddp {

namespace {
// A convolution with no bias: none in a torchvision block has one.
std::unique_ptr<Conv2d> conv(std::int64_t out, std::int64_t k, std::int64_t stride) {
  return std::make_unique<Conv2d>(out, k, stride, k / 2, false);
}
}  // namespace

ResBlock::ResBlock(Kind kind, std::int64_t channels, std::int64_t stride, bool zero_init, bool sync)
    : kind_(kind), channels_(channels), stride_(stride), down_bn_(std::make_unique<BatchNorm2d>(sync)) {
  auto stage = [&](std::unique_ptr<Conv2d> c) {
    stages_.emplace_back();
    stages_.back().conv = std::move(c);
    stages_.back().bn = std::make_unique<BatchNorm2d>(sync);
  };
  if (kind == Basic) {
    stage(conv(channels, 3, stride));
    stage(conv(channels, 3, 1));
  } else {
    stage(conv(channels, 1, 1));
    stage(conv(channels, 3, stride));
    stage(conv(4 * channels, 1, 1));
  }
  stages_.back().bn->set_zero_gamma(zero_init);
}

Shape ResBlock::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 3)
    throw InputError(kind() + " needs an image input (channels, height, width) but gets " +
                     shape_str(in_sample));
  in_sample_ = in_sample;
  Shape s = in_sample;
  for (Stage& st : stages_) {
    s = st.conv->output_shape(s);
    st.bn->output_shape(s);
  }
  projection_ = stride_ != 1 || in_sample[0] != s[0];
  if (projection_) {
    down_conv_ = conv(s[0], 1, stride_);
    down_bn_->output_shape(down_conv_->output_shape(in_sample));
  }
  out_sample_ = s;
  return out_sample_;
}

std::vector<ResBlock::Part> ResBlock::parts() const {
  std::vector<Part> p;
  for (std::size_t k = 0; k < stages_.size(); ++k) {
    const std::string n = std::to_string(k + 1);
    p.push_back({stages_[k].conv.get(), "conv" + n + "."});
    p.push_back({stages_[k].bn.get(), "bn" + n + "."});
  }
  if (projection_) {
    p.push_back({down_conv_.get(), "downsample.0."});
    p.push_back({down_bn_.get(), "downsample.1."});
  }
  return p;
}

std::vector<Conv2d*> ResBlock::convs() const {
  std::vector<Conv2d*> c;
  for (const Stage& st : stages_) c.push_back(st.conv.get());
  if (projection_) c.push_back(down_conv_.get());
  return c;
}

std::vector<Layer::ParamSpec> ResBlock::parameter_specs() const {
  std::vector<ParamSpec> specs;
  for (const Part& part : parts())
    for (const ParamSpec& s : part.layer->parameter_specs())
      specs.push_back({part.prefix + s.suffix, s.shape});
  return specs;
}

void ResBlock::bind(float* params, float* grads) {
  for (const Part& part : parts()) {
    part.layer->bind(params, grads);
    for (const ParamSpec& s : part.layer->parameter_specs()) {
      params += shape_numel(s.shape);
      grads += shape_numel(s.shape);
    }
  }
}

std::vector<Layer::ParamSpec> ResBlock::buffer_specs() const {
  std::vector<ParamSpec> specs;
  for (const Part& part : parts())
    for (const ParamSpec& s : part.layer->buffer_specs()) specs.push_back({part.prefix + s.suffix, s.shape});
  return specs;
}

void ResBlock::bind_buffers(float* buffers) {
  for (const Part& part : parts()) {
    part.layer->bind_buffers(buffers);
    for (const ParamSpec& s : part.layer->buffer_specs()) buffers += shape_numel(s.shape);
  }
}

void ResBlock::init(Rng& rng) {
  for (const Part& part : parts()) part.layer->init(rng);
}

void ResBlock::set_communicator(Communicator* comm) {
  for (const Part& part : parts()) part.layer->set_communicator(comm);
}

std::string ResBlock::graph_obstacle() const {
  for (const Part& part : parts())
    if (std::string why = part.layer->graph_obstacle(); !why.empty()) return why;
  return {};
}

void ResBlock::set_precision(Precision p) {
  Layer::set_precision(p);
  for (const Part& part : parts()) part.layer->set_precision(p);
}

void ResBlock::set_overwrite_gradients(bool on) {
  Layer::set_overwrite_gradients(on);
  for (const Part& part : parts()) part.layer->set_overwrite_gradients(on);
}

Layout ResBlock::native_layout() const {
  const Layout layout = stages_.front().conv->native_input_layout();
  for (const Conv2d* c : convs())
    if (c->native_input_layout() != layout || c->native_output_layout() != layout) return Layout::nchw;
  return layout;
}

void ResBlock::set_layouts(Layout in, Layout inside, Layout out) {
  in_ = in;
  inside_ = inside;
  out_ = out;
  for (Conv2d* c : convs()) c->set_layouts(inside, inside);
}

void ResBlock::fuse_passes() {
  fused_ = true;
  for (std::size_t k = 0; k + 1 < stages_.size(); ++k) stages_[k].bn->fuse_relu();
}

void ResBlock::set_library_batch_norm(BatchNormKernels* kernels) {
  for (Stage& st : stages_) st.bn->set_library_kernels(kernels);
  down_bn_->set_library_kernels(kernels);
}

void ResBlock::set_types(Precision in, Precision inside, Precision out) {
  const bool narrow = in != Precision::fp32 || inside != Precision::fp32 || out != Precision::fp32;
  DDP_REQUIRE(fused_ || !narrow, kind() << " keeps narrow activations with fused passes only");
  DDP_REQUIRE((in == Precision::fp32 || in == inside) && (out == Precision::fp32 || out == inside),
              kind() << "'s input and output are fp32 or of the type inside");
  in_type_ = in;
  narrow_ = inside;
  out_type_ = out;
  for (std::size_t k = 0; k < stages_.size(); ++k) stages_[k].conv->set_types(k == 0 ? in : inside, inside);
  if (down_conv_) down_conv_->set_types(in, inside);
}

std::int64_t ResBlock::kept_floats(std::int64_t batch) const {
  const Precision fp32 = Precision::fp32;
  auto inside = [&](const Shape& sample, Precision type) {
    return planned_floats(batch, sample, inside_, type);
  };
  const bool dx = needs_input_grad(), g_in_dx = grad_sum_in_dx();
  std::int64_t floats = 0;
  // A stage whose batch norm the next convolution applies on its way in writes no r
  // but keeps the map (where the kernels decline a shape's forward_after or
  // backward_after, r is written then: more than planned).
  for (std::size_t k = 0; k < stages_.size(); ++k) {
    const Shape& a = stages_[k].conv->output_sample();
    floats += 2 * inside(a, narrow_);  // a, da
    if (prologue_after(k, true))
      floats += inside(a, narrow_) + 2 * a[0];  // dr, scale_shift
    else if (k + 1 < stages_.size())
      floats += 2 * inside(a, narrow_);      // r, dr
    if (!fused_) floats += inside(a, fp32);  // b
    floats += stages_[k].conv->kept_floats(batch, k > 0 || dx, k == 0 && g_in_dx);
  }
  if (projection_) {
    floats += 2 * inside(out_sample_, narrow_);        // s1, ds1
    if (!fused_) floats += inside(out_sample_, fp32);  // s2
    floats += down_conv_->kept_floats(batch, dx, dx);
  }
  // The library's batch norm (forward's library_output_): the projection's batch norm
  // written out (s2) for the last one to add, and each one's reserve in the library;
  // the branch's other batch norms run there wherever their input is narrow nhwc.
  const Stage& last = stages_.back();
  const bool library_output = library_output_planned();
  for (std::size_t k = 0; k + 1 < stages_.size(); ++k)
    floats += stages_[k].bn->library_reserve_floats(batch, inside_, narrow_, false);
  if (library_output) {
    floats += last.bn->library_reserve_floats(batch, inside_, narrow_, true);
    if (projection_)
      floats +=
          inside(out_sample_, narrow_) + down_bn_->library_reserve_floats(batch, inside_, narrow_, false);
  }
  if (fused_ && any_conv_sums()) floats += conv_sums_floats();                // conv_sums
  if (!g_in_dx) floats += inside(out_sample_, out_type_);                     // g
  if (in_ != inside_) floats += inside(in_sample_, in_type_) * (dx ? 2 : 1);  // x_in, dx_in
  if (out_ != inside_) floats += 2 * inside(out_sample_, out_type_);          // y_in, dy_in
  return floats;
}

bool ResBlock::library_output_planned() const {
  return fused_ && out_type_ == narrow_ && (projection_ || in_type_ == narrow_) &&
         stages_.back().bn->library_would_run(inside_, narrow_);
}

bool ResBlock::prologue_after(std::size_t k, bool plan) const {
  if (!fused_ || k + 1 >= stages_.size() || !stages_[k + 1].conv->takes_prologue()) return false;
  const auto library = [&](const BatchNorm2d& bn) {
    return plan ? bn.library_would_run(inside_, narrow_) : bn.library_runs(inside_, narrow_);
  };
  const bool next_library = k + 2 == stages_.size() ? (plan ? library_output_planned() : library_output_)
                                                    : library(*stages_[k + 1].bn);
  return !library(*stages_[k].bn) && !next_library;
}

bool ResBlock::any_conv_sums() const {
  for (const Conv2d* c : convs())
    if (c->computes_sums()) return true;
  return false;
}

std::int64_t ResBlock::conv_sums_floats() const {
  std::int64_t channels = 0;
  for (const Conv2d* c : convs()) channels = std::max(channels, c->output_sample()[0]);
  return 2 * channels;
}

std::int64_t ResBlock::library_bytes(std::int64_t batch) const {
  std::int64_t bytes = 0;
  for (const Conv2d* c : convs()) bytes += c->library_bytes(batch);
  return bytes;
}

namespace {
// relu(bn(a) + down(s)) (Projection) or relu(bn(a) + s) of channel c; at8: for
// map_vectors, its constants 8 channels a load (model/elements.hpp).
template <bool Projection, class K = ChannelValues>
struct BlockOutput {
  BatchNormAffineOf<K> bn, down;  // down: where Projection
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t c, float a, float s) const {
    float v;
    if constexpr (Projection)
      v = bn(c, a) + down(c, s);
    else
      v = bn(c, a) + s;
    return select_or_zero(relu_passes(v), v);
  }
  KOKKOS_INLINE_FUNCTION BlockOutput<Projection, ChannelValues8> at8(std::int64_t c0) const {
    if constexpr (Projection)
      return {bn.at8(c0), down.at8(c0)};
    else
      return {bn.at8(c0), {}};
  }
  bool aligned() const { return bn.aligned() && (!Projection || down.aligned()); }
};
}  // namespace

// y = relu(bn3(a3) + shortcut), shortcut = bn_down(s1) or x, with both batch norms'
// statistics already taken: the same floats as the unfused passes, in one.
// Narrow: a and s1 are; NarrowX: x; NarrowY: y.
template <bool Narrow, bool NarrowX, bool NarrowY>
void ResBlock::fused_output(const Tensor& x, Tensor& y) {
  const Tensor& a = stages_.back().a;
  const std::int64_t B = a.batch(), C = a.shape[1], hw = a.shape[2] * a.shape[3];
  resize(y, B, out_sample_, "ResBlock::y", a.layout, out_type_);
  const BatchNormAffine bn = stages_.back().bn->affine();
  const auto av = elements<Narrow>(a);
  const auto yv = elements<NarrowY>(y);
  if (projection_)
    map_elements("ResBlock::bn_add_relu", a.layout, B, C, hw, BlockOutput<true>{bn, down_bn_->affine()}, yv,
                 av, elements<Narrow>(s1_));
  else
    map_elements("ResBlock::bn_add_relu", a.layout, B, C, hw, BlockOutput<false>{bn, {}}, yv, av,
                 elements<NarrowX>(x));
}

void ResBlock::write_output(const Tensor& x, Tensor& y) {
  const bool narrow_x = in_type_ != Precision::fp32, narrow_y = out_type_ != Precision::fp32;
  if (narrow_ == Precision::fp32)
    fused_output<false, false, false>(x, y);
  else if (narrow_x)
    narrow_y ? fused_output<true, true, true>(x, y) : fused_output<true, true, false>(x, y);
  else
    narrow_y ? fused_output<true, false, true>(x, y) : fused_output<true, false, false>(x, y);
}

// x: (B, C_in, H, W) -> y: (B, C_out, Ho, Wo)
void ResBlock::forward(const Tensor& x_given, Tensor& y_given, bool training) {
  DDP_REQUIRE(x_given.layout == in_ && x_given.type == in_type_,
              kind() << " input in another layout or type than the model set");
  const bool convert_in = in_ != inside_, convert_out = out_ != inside_;
  if (convert_in) convert_layout(x_given, x_in_, inside_, "ResBlock::x_in");
  const Tensor& x = convert_in ? x_in_ : x_given;
  Tensor& y = convert_out ? y_in_ : y_given;
  Stage& last = stages_.back();
  // The library's batch norm adds the shortcut before its relu itself, where the
  // shortcut is of the branch's layout and type and y of that type: the identity's
  // x, or the projection's batch norm written out (s2). Every convolution writes its
  // output (a, s1) in the layout and type inside.
  library_output_ = fused_ && training && last.bn->library_runs(inside_, narrow_) && out_type_ == narrow_ &&
                    (projection_ || (x.layout == inside_ && x.type == narrow_));
  // Fused, in training, a convolution whose kernels take the statistics of their output
  // as they write it (cuDNN's "conv -> genstats") hands them to the batch norm after it,
  // which then makes no pass of its own for them; not where the library's batch norm
  // takes its own. Each batch norm takes them from conv_sums_ before the next
  // convolution writes there.
  // A convolution that applies a batch norm on its way in writes the sums too: in eval
  // there (unread), as the stages whose r is not planned take that way in eval as well.
  float *sums = nullptr, *prologue_sums = nullptr;
  if (fused_ && any_conv_sums()) {
    if (conv_sums_.extent(0) == 0) conv_sums_ = make_buffer("ResBlock::conv_sums", conv_sums_floats());
    prologue_sums = conv_sums_.data();
    if (training) sums = prologue_sums;
  }
  // The convolution's forward, with the sums where they are wanted: whether it wrote them.
  const auto conv_forward = [&](Conv2d& conv, const Tensor& in, Tensor& out, bool library_bn) {
    if (sums && !library_bn) return conv.forward_with_sums(in, out, sums);
    conv.forward(in, out, training);
    return false;
  };
  // A stage whose batch norm's statistics are taken (the batch's, or in eval the
  // running ones) and whose map waits for the next convolution to apply it on its way
  // in (prologue_after), with its relu: its r is written only where that convolution's
  // kernels decline. Whether the sums for training were written, as conv_forward.
  Stage* pending = nullptr;
  const auto next_forward = [&](Stage& st, const Tensor* h, bool library_bn) {
    if (!pending) return conv_forward(*st.conv, *h, st.a, library_bn);
    Stage& before = *pending;
    pending = nullptr;
    before.deferred = st.conv->forward_after(before.a, before.scale_shift.data(), st.a, prologue_sums);
    if (before.deferred) return sums != nullptr;
    before.bn->normalise_taken(before.a, before.r);
    return conv_forward(*st.conv, before.r, st.a, library_bn);
  };
  const Tensor* h = &x;
  bool last_with_sums = false;
  for (std::size_t k = 0; k < stages_.size(); ++k) {
    Stage& st = stages_[k];
    st.deferred = false;
    if (k + 1 == stages_.size()) {
      last_with_sums = next_forward(st, h, library_output_);
      if (last_with_sums) st.bn->statistics_from_sums(st.a, sums);
      break;
    }
    const bool with_sums = next_forward(st, h, st.bn->library_runs(inside_, narrow_));
    if (prologue_sums && prologue_after(k, false)) {
      if (with_sums)
        st.bn->statistics_from_sums(st.a, sums);
      else
        st.bn->statistics(st.a, training);
      if (st.scale_shift.extent(0) == 0)
        st.scale_shift = make_buffer("ResBlock::scale_shift", 2 * st.a.shape[1]);
      st.bn->scale_shift(st.scale_shift.data());
      pending = &st;
      continue;  // h: the next convolution reads st.a
    }
    if (with_sums) {
      st.bn->forward_from_sums(st.a, sums, st.r);  // relu inside
    } else if (fused_) {
      st.bn->forward(st.a, st.r, training);  // relu inside
    } else {
      st.bn->forward(st.a, st.b, training);
      resize_like(st.r, st.b, "ResBlock::r");
      relu_forward(st.b.data, st.r.data, st.b.storage_numel());
    }
    h = &st.r;
  }
  const bool down_with_sums = projection_ && conv_forward(*down_conv_, x, s1_, library_output_);
  if (down_with_sums) down_bn_->statistics_from_sums(s1_, sums);
  if (library_output_) {
    if (projection_) down_bn_->forward(s1_, s2_, training);
    last.bn->forward_add_relu(last.a, projection_ ? s2_ : x, y);
  } else if (fused_) {
    if (!last_with_sums) last.bn->statistics(last.a, training);
    if (projection_ && !down_with_sums) down_bn_->statistics(s1_, training);
    write_output(x, y);
  } else {
    last.bn->forward(last.a, last.b, training);
    if (projection_) down_bn_->forward(s1_, s2_, training);
    const Tensor& shortcut = projection_ ? s2_ : x;
    resize_like(y, last.b, "ResBlock::y");
    ConstView1 bv = last.b.data, sc = shortcut.data;
    View1 yv = y.data;
    Kokkos::parallel_for(
        "ResBlock::add_relu", Range(0, y.storage_numel()), KOKKOS_LAMBDA(std::int64_t i) {
          const float v = bv(i) + sc(i);
          yv(i) = select_or_zero(relu_passes(v), v);
        });
  }
  if (convert_out) convert_layout(y_in_, y_given, out_, "ResBlock::y");
}

// dy: (B, C_out, Ho, Wo) -> parameter gradients += (or =), dx: (B, C_in, H, W)
void ResBlock::backward(const Tensor& x_given, const Tensor& y_given, const Tensor& dy_given,
                        Tensor& dx_given) {
  const bool convert_in = in_ != inside_, convert_out = out_ != inside_;
  if (convert_out) convert_layout(dy_given, dy_in_, inside_, "ResBlock::dy_in");
  const Tensor &x = convert_in ? x_in_ : x_given, &y = convert_out ? y_in_ : y_given,
               &dy = convert_out ? dy_in_ : dy_given;
  Tensor& dx = convert_in ? dx_in_ : dx_given;
  DDP_REQUIRE(dy.type == out_type_, kind() << " output gradient in another type than the model set");
  // g = dy where the output is positive: the gradient of both branches' sum, and the
  // identity shortcut's gradient of x. Where dx takes g as it is (of dy's type), g is
  // written into dx, and the first convolution adds the branch's gradient of x to it
  // (in its kernel where the backend can: no pass of its own). A projection's
  // convolution adds its gradient of x to the branch's likewise.
  const bool g_in_dx = grad_sum_in_dx();
  Tensor& g = g_in_dx ? dx : g_;
  resize_like(g, dy, g_in_dx ? "ResBlock::dx" : "ResBlock::g");
  // In the library's batch norm, its backward takes dy through the relu's mask and
  // writes g as it goes.
  if (!library_output_) relu_backward(y, dy, g);
  const Tensor* grad = &g;  // the gradient of the current stage's batch-norm output
  for (std::size_t k = stages_.size(); k-- > 0;) {
    Stage& st = stages_[k];
    // The batch norm's output: r where it is rectified inside (fused, not the last
    // stage); not read otherwise.
    const Tensor& bn_out = fused_ && k + 1 < stages_.size() ? st.r : st.a;
    if (library_output_ && k + 1 == stages_.size())
      st.bn->backward_add_relu(st.a, y, dy, st.da, g);
    else if (st.deferred && st.grad_summed)
      st.bn->backward_from_sums(st.a, *grad, conv_sums_.data(), st.da);
    else if (st.deferred)
      st.bn->backward_unwritten(st.a, *grad, st.da);
    else
      st.bn->backward(st.a, bn_out, *grad, st.da);
    if (k == 0) {
      st.conv->set_needs_input_grad(needs_input_grad());
      st.conv->set_accumulate_input_grad(g_in_dx);
      st.conv->backward(x, st.a, st.da, dx);
      break;
    }
    Stage& before = stages_[k - 1];
    // Where the forward applied before's batch norm on the way in, its weights'
    // gradient does too, unless the kernels decline: then r is written for it. Its
    // input gradient then comes through that batch norm's relu, with the sums of its
    // backward, where the kernels can (into conv_sums_, which backward does not
    // otherwise use): the batch norm's backward is then one pass.
    Conv2d::InputGradSums grad_sums{before.bn->batch_mean(), conv_sums_.data()};
    const bool ask_sums = before.deferred && before.bn->normalised_by_batch();
    const bool after = before.deferred && st.conv->backward_after(before.a, before.scale_shift.data(), st.da,
                                                                  before.dr, ask_sums ? &grad_sums : nullptr);
    before.grad_summed = after && grad_sums.written;
    if (!after) {
      if (before.deferred) before.bn->normalise_taken(before.a, before.r);
      st.conv->backward(before.r, st.a, st.da, before.dr);
    }
    if (!fused_) relu_backward(before.r, before.dr, before.dr);
    grad = &before.dr;
  }
  if (projection_) {
    down_bn_->backward(s1_, library_output_ ? s2_ : s1_, g_, ds1_);
    down_conv_->set_needs_input_grad(needs_input_grad());
    down_conv_->set_accumulate_input_grad(needs_input_grad());
    down_conv_->backward(x, s1_, ds1_, dx);  // dx = branch gradient + shortcut gradient
  }
  if (!needs_input_grad()) return;
  if (!projection_ && !g_in_dx) add_elements("ResBlock::add_shortcut_grad", g_, dx);
  if (convert_in) convert_layout(dx_in_, dx_given, in_, "ResBlock::dx");
}

}  // namespace ddp
