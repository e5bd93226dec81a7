#include "model/transformer_block.hpp"

#include <algorithm>

#include "comm/check.hpp"

namespace ddp {

TransformerBlock::TransformerBlock(std::int64_t heads, std::int64_t mlp_ratio, bool causal, bool tanh,
                                   float eps, std::int64_t block, bool fused)
    : mlp_ratio_(mlp_ratio),
      ln1_(std::make_unique<LayerNorm>(eps)),
      ln2_(std::make_unique<LayerNorm>(eps)),
      attn_(std::make_unique<Attention>(heads, causal, block, fused)),
      gelu_(std::make_unique<Gelu>(tanh)) {}

std::vector<TransformerBlock::Part> TransformerBlock::parts() const {
  return {{ln1_.get(), "ln_1."},
          {attn_.get(), "self_attention."},
          {ln2_.get(), "ln_2."},
          {fc_.get(), "mlp.0."},
          {proj_.get(), "mlp.3."}};
}

Shape TransformerBlock::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 2)
    throw InputError("transformer_block needs a sequence (tokens, features) but gets " +
                     shape_str(in_sample));
  const std::int64_t d = in_sample[1];
  sample_ = in_sample;
  fc_ = std::make_unique<Linear>(mlp_ratio_ * d);
  proj_ = std::make_unique<Linear>(d);
  Shape s = ln1_->output_shape(in_sample);
  s = attn_->output_shape(s);  // heads not dividing d: its own line
  s = ln2_->output_shape(s);
  s = fc_->output_shape(s);
  s = gelu_->output_shape(s);
  s = proj_->output_shape(s);
  for (Layer* l :
       {static_cast<Layer*>(attn_.get()), static_cast<Layer*>(ln2_.get()), static_cast<Layer*>(fc_.get()),
        static_cast<Layer*>(gelu_.get()), static_cast<Layer*>(proj_.get())})
    l->set_needs_input_grad(true);
  return s;
}

std::vector<Layer::ParamSpec> TransformerBlock::parameter_specs() const {
  std::vector<ParamSpec> specs;
  for (const Part& p : parts())
    for (ParamSpec s : p.layer->parameter_specs()) {
      s.suffix = p.prefix + s.suffix;
      specs.push_back(std::move(s));
    }
  return specs;
}

void TransformerBlock::bind(float* params, float* grads) {
  for (const Part& p : parts()) {
    p.layer->bind(params, grads);
    std::int64_t n = 0;
    for (const ParamSpec& s : p.layer->parameter_specs()) n += shape_numel(s.shape);
    params += n;
    grads += n;
  }
}

void TransformerBlock::init(Rng& rng) {
  for (const Part& p : parts()) p.layer->init(rng);
}

std::string TransformerBlock::graph_obstacle() const {
  for (const Part& p : parts()) {
    std::string why = p.layer->graph_obstacle();
    if (!why.empty()) return p.prefix + " " + why;
  }
  return {};
}

void TransformerBlock::set_precision(Precision p) {
  Layer::set_precision(p);
  for (Layer* l : {static_cast<Layer*>(ln1_.get()), static_cast<Layer*>(attn_.get()),
                   static_cast<Layer*>(ln2_.get()), static_cast<Layer*>(gelu_.get())})
    l->set_precision(p);
  if (fc_) fc_->set_precision(p);
  if (proj_) proj_->set_precision(p);
}

void TransformerBlock::set_types(Precision inside) {
  DDP_REQUIRE(
      inside == Precision::fp32 || inside == precision(),
      "transformer_block: " << precision_name(inside) << " activations at " << precision_name(precision()));
  inside_ = inside;
  ln1_->set_output_type(inside);
  attn_->set_types(inside, Precision::fp32);
  ln2_->set_output_type(inside);
  if (fc_) fc_->set_types(inside, inside);
  if (proj_) proj_->set_types(inside, Precision::fp32);
}

void TransformerBlock::set_overwrite_gradients(bool on) {
  Layer::set_overwrite_gradients(on);
  for (const Part& p : parts())
    if (p.layer) p.layer->set_overwrite_gradients(on);
}

// Kept: a, r and c (N d each), f and g (N mlp d each) and what the parts keep. The
// shared slots: the gradients between the parts, and the parts' own. The
// inner ones (a, c, f, g, their gradients) in floats of the inside type.
std::int64_t TransformerBlock::kept_floats(std::int64_t batch) const {
  const std::int64_t N = batch * sample_[0], d = sample_[1];
  const auto in = [&](std::int64_t n) { return inside_ == Precision::fp32 ? n : (n + 1) / 2; };
  std::int64_t floats = N * d + 2 * in(N * d) + 2 * in(N * mlp_ratio_ * d);
  for (const Part& p : parts()) floats += p.layer->kept_floats(batch);
  return floats + gelu_->kept_floats(batch);
}

void TransformerBlock::scratch_floats(std::int64_t batch, SlotFloats& most) const {
  const std::int64_t N = batch * sample_[0], d = sample_[1];
  const auto in = [&](std::int64_t n) { return inside_ == Precision::fp32 ? n : (n + 1) / 2; };
  const std::int64_t wide = in(N * mlp_ratio_ * d);
  const std::pair<ScratchSlot, std::int64_t> mine[] = {{ScratchSlot::block_df, wide},
                                                       {ScratchSlot::block_dc, in(N * d)},
                                                       {ScratchSlot::block_dr, N * d},
                                                       {ScratchSlot::block_da, in(N * d)}};
  for (const auto& [slot, floats] : mine) most[std::size_t(slot)] = std::max(most[std::size_t(slot)], floats);
  for (const Part& p : parts()) p.layer->scratch_floats(batch, most);
}

void TransformerBlock::forward(const Tensor& x, Tensor& y, bool training) {
  require_nchw(x, Precision::fp32, "transformer_block", "the input");
  ln1_->forward(x, a_, training);
  attn_->forward_adding(a_, &x, r_, training);  // r = x + attention(a)
  ln2_->forward(r_, c_, training);
  fc_->forward_gelu(c_, f_, g_, gelu_->tanh_approximation());  // f = fc(c), g = gelu(f)
  proj_->forward_adding(g_, &r_, y, training);                 // y = r + proj(g)
}

// dy flows into both sums: dr = dy + ln_2's input gradient, dx = dr + ln_1's, each
// added by the layer norm's backward as it writes its input gradient.
void TransformerBlock::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  SharedScratch scratch;  // the gradients between the parts: the process's shared slots
  // Each gradient of its activation's type: as many floats.
  scratch.hold(df_.data, ScratchSlot::block_df, f_.storage_floats(), "TransformerBlock::df");
  scratch.hold(dc_.data, ScratchSlot::block_dc, c_.storage_floats(), "TransformerBlock::dc");
  scratch.hold(dr_.data, ScratchSlot::block_dr, r_.storage_floats(), "TransformerBlock::dr");
  scratch.hold(da_.data, ScratchSlot::block_da, a_.storage_floats(), "TransformerBlock::da");
  // The attention's and proj's backward read not their outputs (r - x, y - r, which
  // forward never stored): the tensors handed as them are the sums.
  proj_->backward_gelu(g_, y, dy, f_, df_, gelu_->tanh_approximation());  // df = (dy W) gelu'(f)
  fc_->backward(c_, f_, df_, dc_);
  ln2_->backward_adding(r_, dc_, dy, dr_);  // dr = dy + ln_2's input gradient
  attn_->backward(a_, r_, dr_, da_);
  ln1_->set_needs_input_grad(needs_input_grad());
  if (needs_input_grad())
    ln1_->backward_adding(x, da_, dr_, dx);  // dx = dr + ln_1's
  else
    ln1_->backward(x, a_, da_, dx);  // the parameters' gradients only
}

}  // namespace ddp
