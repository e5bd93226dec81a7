#include "model/model.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "comm/check.hpp"
#include "comm/trace.hpp"
#include "model/activation.hpp"
#include "model/batchnorm.hpp"
#include "model/conv2d.hpp"
#include "model/embedding.hpp"
#include "model/layer_registry.hpp"
#include "model/linear.hpp"
#include "model/pool.hpp"
#include "model/resblock.hpp"
#include "model/transformer_block.hpp"

namespace ddp {

namespace {
std::string trim(const std::string& s) {
  std::size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
}  // namespace

Model::Model(const std::vector<std::string>& specs, const Shape& sample_shape, std::uint64_t seed, bool fuse)
    : fuse_(fuse) {
  if (specs.empty()) throw InputError("model.layers is empty: give at least one layer");
  for (std::int64_t d : sample_shape)
    if (d < 1) throw InputError("input sample shape " + shape_str(sample_shape) + " has an empty dimension");

  // Build the layers, propagating the per-sample shape and laying out parameters.
  shapes_.push_back(sample_shape);
  std::int64_t total = 0, total_buffers = 0;
  std::vector<std::int64_t> layer_buffers;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    specs_.push_back(trim(specs[i]));
    trace_names_.push_back("layers." + std::to_string(i) + " " + specs_.back());
    try {
      layers_.push_back(make_layer(specs[i]));
      shapes_.push_back(layers_.back()->output_shape(shapes_.back()));
    } catch (const InputError& e) {
      throw InputError("model.layers(" + std::to_string(i + 1) + ") = '" + specs[i] + "': " + e.what());
    }
    std::int64_t n = 0;
    for (const Layer::ParamSpec& p : layers_.back()->parameter_specs()) {
      std::int64_t size = shape_numel(p.shape);
      table_.push_back({"layers." + std::to_string(i) + "." + p.suffix, p.shape, total + n, size});
      n += size;
    }
    layer_params_.push_back(n);
    total += n;
    std::int64_t nb = 0;
    for (const Layer::ParamSpec& b : layers_.back()->buffer_specs()) {
      std::int64_t size = shape_numel(b.shape);
      buffer_table_.push_back(
          {"layers." + std::to_string(i) + "." + b.suffix, b.shape, total_buffers + nb, size});
      nb += size;
    }
    layer_buffers.push_back(nb);
    total_buffers += nb;
  }
  buffers_ = make_buffer("Model::buffers", total_buffers);

  params_ = make_buffer("Model::parameters", total);
  grads_ = make_buffer("Model::gradients", total);  // zero-initialised
  Rng rng(seed);
  first_trained_ = layers_.size();
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    layer_offset_.push_back(offset);
    offset += layer_params_[i];
  }
  find_ties();
  bind_layers();
  std::int64_t buffer_offset = 0;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->bind_buffers(buffers_.data() + buffer_offset);
    buffer_offset += layer_buffers[i];
    layers_[i]->init(rng);
    if (layer_params_[i] > 0 && first_trained_ == layers_.size()) first_trained_ = i;
  }
  // Nothing upstream of the first trained layer needs a gradient.
  if (first_trained_ < layers_.size()) layers_[first_trained_]->set_needs_input_grad(false);
  reseed_dropout(hash64(seed, ~0ull));
  layouts_.assign(layers_.size(), Layout::nchw);
  types_.assign(layers_.size(), Precision::fp32);
  if (fuse_) fuse_layers();
  acts_.resize(layers_.size());
  grad_.resize(layers_.size());
}

// A tied head (linear(n, tied)) takes the model's token embedding's table as its
// weight: one embedding before it, whose (vocab, d) is the head's (n, in). The
// table stays the embedding's tensor (layers.<e>.weight); the head has none.
void Model::find_ties() {
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const auto* head = dynamic_cast<const Linear*>(layers_[i].get());
    if (!head || !head->tied()) continue;
    const std::string where = "model.layers(" + std::to_string(i + 1) + ") = '" + specs_[i] + "': ";
    std::size_t e = i;
    for (std::size_t j = 0; j < i; ++j)
      if (dynamic_cast<const Embedding*>(layers_[j].get())) {
        if (e != i)
          throw InputError(where +
                           "a tied head needs one embedding before it to share its table, but "
                           "model.layers(" +
                           std::to_string(e + 1) + ") and model.layers(" + std::to_string(j + 1) +
                           ") are both embeddings");
        e = j;
      }
    if (e == i)
      throw InputError(where +
                       "a tied head shares the token embedding's table, but no embedding comes "
                       "before it: give the model an embedding(vocab, d) or drop 'tied'");
    const auto* emb = dynamic_cast<const Embedding*>(layers_[e].get());
    if (emb->vocab() != head->out_features() || emb->features() != head->in_features())
      throw InputError(where + "a tied head's weight is model.layers(" + std::to_string(e + 1) + ") " +
                       specs_[e] + "'s table, (" + std::to_string(emb->vocab()) + ", " +
                       std::to_string(emb->features()) + "), but this head needs (" +
                       std::to_string(head->out_features()) + ", " + std::to_string(head->in_features()) +
                       "): its outputs must be the vocabulary and its input the embedding's width");
    for (const Tie& t : ties_)
      if (t.embedding == e)
        throw InputError(where + "model.layers(" + std::to_string(t.head + 1) + ") " + specs_[t.head] +
                         " is already tied to model.layers(" + std::to_string(e + 1) + ") " + specs_[e] +
                         "'s table: one tied head an embedding");
    ties_.push_back({i, e});
  }
}

// Each layer bound to its range of the two buffers; a tied head to its embedding's.
void Model::bind_layers() {
  for (std::size_t i = 0; i < layers_.size(); ++i)
    layers_[i]->bind(params_.data() + layer_offset_[i], grads_.data() + layer_offset_[i]);
  for (const Tie& t : ties_)
    static_cast<Linear*>(layers_[t.head].get())
        ->tie(params_.data() + layer_offset_[t.embedding], grads_.data() + layer_offset_[t.embedding]);
}

// Each relu stays a layer in its place (checkpoint names are positional) but hands
// its passes over the activation to a neighbour where one does them for free:
// conv2d -> relu: the convolution's output is rectified by a oneDNN post-op;
// batchnorm2d -> relu: the batch norm's pass writes the rectified output, and its
// backward masks the gradient by it; linear -> relu: the bias pass writes it, and
// backward masks dy in place; relu -> maxpool: the pool's backward masks its
// gradient by its output (> 0). Residual blocks fuse their own passes.
void Model::fuse_layers() {
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (auto* block = dynamic_cast<ResBlock*>(layers_[i].get())) block->fuse_passes();
    auto* relu = dynamic_cast<ReLU*>(layers_[i].get());
    if (!relu) continue;
    if (auto* conv = i > 0 ? dynamic_cast<Conv2d*>(layers_[i - 1].get()) : nullptr) {
      conv->fuse_relu();
      relu->fuse_forward();
    }
    // linear -> relu, unless the relu is last: its backward would mask the trainer's dout in place
    auto* linear = i > 0 ? dynamic_cast<Linear*>(layers_[i - 1].get()) : nullptr;
    if (linear && i + 1 < layers_.size()) {
      linear->fuse_relu();
      relu->fuse_forward();
      relu->fuse_backward();
    }
    if (auto* bn = i > 0 ? dynamic_cast<BatchNorm2d*>(layers_[i - 1].get()) : nullptr) {
      bn->fuse_relu();
      relu->fuse_forward();
      relu->fuse_backward();
    }
    auto* pool = i + 1 < layers_.size() ? dynamic_cast<Pool2d*>(layers_[i + 1].get()) : nullptr;
    if (pool && pool->kind() == "maxpool") {
      pool->absorb_relu_backward();
      relu->fuse_backward();
    }
  }
  plan_layouts();
}

// A convolution's kernels read and write a layout of their own choosing (oneDNN:
// nChw8c with AVX2, nChw16c with AVX-512; cuDNN in bf16/fp16: nhwc), and a resblock
// computes in its convolutions' one. From such a layer, the activation (and,
// backward, its gradient) stays in that layout through the layers that work in any
// layout (relu, tanh, batchnorm2d) up to the next layer that reads it: a convolution
// or a resblock whose kernels read that layout, a max-pool that takes it (2x2 for the
// blocked layouts, any for nhwc), or globalavgpool. A max-pool there
// writes it too when such a reader follows (through the any-layout layers again).
// So no reorder to NCHW and back runs around a convolution that feeds a pool, a batch
// norm or another convolution, forward or backward. Anything else gets NCHW (from the
// pool, from the convolution's own reorder, or from the resblock's), so flatten keeps
// PyTorch's order.
void Model::plan_layouts() {
  const std::size_t n = layers_.size();
  std::vector<Layout> out(n, Layout::nchw);  // out[i]: the layout of layer i's output
  auto conv_at = [&](std::size_t i) { return i < n ? dynamic_cast<Conv2d*>(layers_[i].get()) : nullptr; };
  auto block_at = [&](std::size_t i) { return i < n ? dynamic_cast<ResBlock*>(layers_[i].get()) : nullptr; };
  auto pool_at = [&](std::size_t i) { return i < n ? dynamic_cast<Pool2d*>(layers_[i].get()) : nullptr; };
  auto any_layout = [&](std::size_t i) {
    Layer* l = layers_[i].get();
    return dynamic_cast<ReLU*>(l) || dynamic_cast<Tanh*>(l) || dynamic_cast<BatchNorm2d*>(l);
  };
  // The first layer from i on that does not work in any layout (n if none).
  auto past_any_layout = [&](std::size_t i) {
    while (i < n && any_layout(i)) ++i;
    return i;
  };
  // The layouts convolutions and resblocks read (native_in) and write (native_out)
  // natively, nchw for other layers: asked once (each question plans oneDNN primitives).
  std::vector<Layout> native_in(n, Layout::nchw), native_out(n, Layout::nchw);
  for (std::size_t i = 0; i < n; ++i) {
    if (Conv2d* conv = conv_at(i)) {
      native_in[i] = conv->native_input_layout();
      native_out[i] = conv->native_output_layout();
    } else if (ResBlock* block = block_at(i)) {
      native_in[i] = native_out[i] = block->native_layout();
    }
  }
  // Whether layer i reads `layout` with no reorder.
  auto reads = [&](std::size_t i, Layout layout) {
    if (conv_at(i) || block_at(i)) return native_in[i] == layout;
    if (Pool2d* pool = pool_at(i)) return pool->takes(layout);
    return i < n && dynamic_cast<GlobalAvgPool*>(layers_[i].get()) != nullptr;
  };
  for (std::size_t c = 0; c < n; ++c) {
    const Layout blocked = native_out[c];
    if (blocked == Layout::nchw) continue;
    const std::size_t j = past_any_layout(c + 1);
    if (!reads(j, blocked)) continue;
    std::fill(out.begin() + c, out.begin() + j, blocked);
    if (pool_at(j)) {
      const std::size_t k = past_any_layout(j + 1);
      if (reads(k, blocked)) std::fill(out.begin() + j, out.begin() + k, blocked);
    }
  }
  layouts_ = out;
  types_ = plan_types();
  // Residual blocks (and transformer blocks) keep their activations inside in the
  // narrow type wherever the model keeps any so.
  const Precision inside = narrow_activations() ? precision_ : Precision::fp32;
  for (std::size_t i = 0; i < n; ++i) {
    const Layout in = i > 0 ? out[i - 1] : Layout::nchw;
    const Precision in_type = i > 0 ? types_[i - 1] : Precision::fp32;
    if (Conv2d* conv = conv_at(i)) {
      conv->set_layouts(in, out[i]);
      conv->set_types(in_type, types_[i]);
    }
    if (Pool2d* pool = pool_at(i)) pool->set_layouts(in, out[i]);
    if (ResBlock* block = block_at(i)) {
      block->set_layouts(in, native_out[i], out[i]);
      block->set_types(in_type, inside, types_[i]);
    }
    // Transformer blocks likewise, their residual stream fp32 (as AMP's).
    if (auto* block = dynamic_cast<TransformerBlock*>(layers_[i].get())) block->set_types(inside);
  }
}

bool Model::narrow_activations() const {
  return precision_ != Precision::fp32 &&
         (narrow_asked_ || compute_backend().narrow_convolution_results(precision_));
}

// Where the convolutions' results are narrow anyway (the GPU's narrow cuDNN kernels),
// the activations between layers are kept in that type, as PyTorch's AMP keeps them:
// half the bytes for every pass, and no casts around the convolutions. From a layer
// that writes it (a convolution without bias or fused relu, a residual block) through
// the layers that keep their input's type (batch norm, a relu that passes its
// neighbours' tensors on, a max-pool on nhwc) to a layer that reads it (a convolution,
// a residual block, globalavgpool on nhwc), forward and backward: in ResNet-50 from
// the stem's convolution to the global pool. fp32 elsewhere (the input, the layers
// after the pool, an MLP).
std::vector<Precision> Model::plan_types() const {
  const std::size_t n = layers_.size();
  std::vector<Precision> types(n, Precision::fp32);
  if (!fuse_ || !narrow_activations()) return types;
  auto at = [&](std::size_t i) { return i < n ? layers_[i].get() : nullptr; };
  auto in_layout = [&](std::size_t i) { return i > 0 ? layouts_[i - 1] : Layout::nchw; };
  auto writes = [&](std::size_t i) {
    const auto* conv = dynamic_cast<const Conv2d*>(at(i));
    return (conv && conv->output_may_be_narrow()) || dynamic_cast<const ResBlock*>(at(i));
  };
  auto keeps = [&](std::size_t i) {
    const auto* relu = dynamic_cast<const ReLU*>(at(i));
    const auto* pool = dynamic_cast<const Pool2d*>(at(i));
    return dynamic_cast<const BatchNorm2d*>(at(i)) || (relu && relu->passes_through()) ||
           (pool && pool->kind() == "maxpool" && in_layout(i) == Layout::nhwc);
  };
  auto reads = [&](std::size_t i) {
    return dynamic_cast<const Conv2d*>(at(i)) || dynamic_cast<const ResBlock*>(at(i)) ||
           (i < n && keeps(i)) || (dynamic_cast<const GlobalAvgPool*>(at(i)) && in_layout(i) == Layout::nhwc);
  };
  std::vector<bool> narrow(n);  // narrow[i]: layer i's output
  for (std::size_t i = 0; i < n; ++i) narrow[i] = (writes(i) || keeps(i)) && reads(i + 1);
  // A layer that keeps its input's type has both sides narrow or neither.
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t i = 0; i < n; ++i) {
      if (!keeps(i) || narrow[i] == (i > 0 && narrow[i - 1])) continue;
      narrow[i] = false;
      if (i > 0) narrow[i - 1] = false;
      changed = true;
    }
  }
  for (std::size_t i = 0; i < n; ++i)
    if (narrow[i]) types[i] = precision_;
  return types;
}

void Model::plan_narrow_activations(bool on) {
  narrow_asked_ = on;
  if (fuse_) plan_layouts();
}

std::int64_t Model::activation_floats(std::int64_t batch) const {
  // A narrow tensor takes half the floats (two elements to a float, rounded up), a
  // blocked layout its padding channels too.
  auto floats = [&](std::size_t i) {  // of layer i's output
    return planned_floats(batch, shapes_[i + 1], layouts_[i], types_[i]);
  };
  std::int64_t total = 0;
  SlotFloats slots{};
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]->output_is_input()) total += floats(i);                                      // acts_[i]
    if (i > first_trained_ && !layers_[i]->input_grad_is_output_grad()) total += floats(i - 1);  // grad_[i]
    total += layers_[i]->kept_floats(batch);
    layers_[i]->scratch_floats(batch, slots);
  }
  for (std::int64_t s : slots) total += s;  // the process's shared slots, each as large as asked
  return total;
}

std::int64_t Model::library_bytes(std::int64_t batch) const {
  std::int64_t bytes = 0;
  for (const auto& layer : layers_) bytes += layer->library_bytes(batch);
  return bytes;
}

const Tensor& Model::forward(const Tensor& x, bool training) {
  if (x.shape.size() != input_shape().size() + 1 ||
      !std::equal(input_shape().begin(), input_shape().end(), x.shape.begin() + 1))
    throw InputError("model input has shape " + shape_str(x.shape) + " but the model was built for (B, " +
                     shape_str(input_shape()).substr(1));
  input_ = x;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    trace::Span span(trace_names_[i], "forward");
    layers_[i]->forward(i == 0 ? input_ : acts_[i - 1], acts_[i], training);
    if (span.on()) Kokkos::fence();  // a GPU's kernels inside their layer's span
  }
  return acts_.back();
}

void Model::backward(const Tensor& dout, const std::function<void(std::int64_t)>& on_ready) {
  for (std::size_t i = first_trained_; i < layers_.size(); ++i)
    if (layer_params_[i] > 0) layers_[i]->set_overwrite_gradients(write_grads_);
  // A tied head runs first and writes (or adds to) the table's gradient; its
  // embedding adds its part after it.
  for (const Tie& t : ties_) {
    layers_[t.head]->set_overwrite_gradients(write_grads_);
    layers_[t.embedding]->set_overwrite_gradients(false);
  }
  write_grads_ = false;
  // Layer i reads the gradient w.r.t. its output: grad_[i + 1], or dout for the last.
  for (std::size_t i = layers_.size(); i-- > first_trained_;) {
    {
      trace::Span span(trace_names_[i], "backward");
      layers_[i]->backward(i == 0 ? input_ : acts_[i - 1], acts_[i],
                           i + 1 == layers_.size() ? dout : grad_[i + 1], grad_[i]);
      if (span.on()) Kokkos::fence();
    }
    if (on_ready && layer_params_[i] > 0) on_ready(layer_offset_[i]);
  }
}

void Model::zero_grad() { write_grads_ = true; }

void Model::place_gradients(float* storage) {
  if (storage ? storage == grads_.data() : !grads_placed_) return;
  // Placed elsewhere, the model's own buffer goes with the last View of it (a rank
  // holds its gradients once, as the start-up memory line counts); taken back, the
  // gradients get a buffer of the model's own again.
  const View1 to =
      storage ? View1(storage, grads_.extent(0))
              : make_buffer("Model::gradients", std::int64_t(grads_.extent(0)), /*uninitialised=*/true);
  Kokkos::deep_copy(to, grads_);
  grads_ = to;
  grads_placed_ = storage != nullptr;
  bind_layers();
}

void Model::set_communicator(Communicator* comm) {
  for (auto& layer : layers_) layer->set_communicator(comm);
}

void Model::set_precision(Precision p) {
  // setup and the trainer both set it: plan (oneDNN descriptors per convolution) once.
  if (p == precision_) return;
  precision_ = p;
  for (auto& layer : layers_) layer->set_precision(p);
  if (fuse_) plan_layouts();
}

std::string Model::graph_obstacle() const {
  for (std::size_t i = 0; i < layers_.size(); ++i)
    if (std::string why = layers_[i]->graph_obstacle(); !why.empty())
      return "model.layers(" + std::to_string(i + 1) + ") " + specs_[i] + ": " + why;
  return {};
}

void Model::reseed_dropout(std::uint64_t seed) {
  for (std::size_t i = 0; i < layers_.size(); ++i) layers_[i]->reseed(hash64(seed, i));
}

std::string Model::summary() const {
  // Columns as wide as their longest entry; "layout" only when some output is blocked
  // or narrow, or some transformer block keeps its inner activations narrow.
  const auto layout_text = [&](std::size_t i) -> std::string {
    const auto* block = dynamic_cast<const TransformerBlock*>(layers_[i].get());
    const Precision inside = block ? block->inside_type() : Precision::fp32;
    if (layouts_[i] == Layout::nchw && types_[i] == Precision::fp32 && inside == Precision::fp32) return {};
    return std::string(layout_name(layouts_[i])) +
           (types_[i] != Precision::fp32 ? std::string(" ") + precision_name(types_[i]) : "") +
           (inside != Precision::fp32 ? std::string(", ") + precision_name(inside) + " inside" : "");
  };
  std::size_t w_layer = 5, w_out = shape_str(input_shape()).size(), w_params = 10;
  bool blocked = false;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    w_layer = std::max(w_layer, specs_[i].size());
    w_out = std::max(w_out, shape_str(shapes_[i + 1]).size());
    blocked = blocked || !layout_text(i).empty();
  }
  w_layer += 2;
  w_out += 2;
  w_params += 2;
  std::ostringstream os;
  os << std::left << std::setw(4) << "#" << std::setw(w_layer) << "layer" << std::setw(w_out) << "output"
     << (blocked ? std::setw(w_params) : std::setw(0)) << "parameters" << (blocked ? "layout" : "") << "\n";
  os << std::setw(4) << "" << std::setw(w_layer) << "input" << shape_str(input_shape()) << "\n";
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    os << std::setw(4) << i << std::setw(w_layer) << specs_[i] << std::setw(w_out)
       << shape_str(shapes_[i + 1]);
    if (const std::string text = layout_text(i); !text.empty())
      os << std::setw(w_params) << layer_params_[i] << text;
    else
      os << layer_params_[i];
    os << "\n";
  }
  os << "total parameters: " << num_parameters() << "\n";
  return os.str();
}

}  // namespace ddp
