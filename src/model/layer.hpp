#pragma once
// The layer interface. A layer owns the buffers it writes (outputs, input
// gradients, masks) and binds its parameters and gradients to sub-ranges of the
// model's two contiguous buffers. Shapes: B is the batch; "sample" shapes have no
// batch dimension.

#include <string>
#include <vector>

#include "model/precision.hpp"
#include "model/rng.hpp"
#include "model/tensor.hpp"

namespace ddp {

class Communicator;

class Layer {
 public:
  virtual ~Layer() = default;

  virtual std::string kind() const = 0;  // "linear"

  // Per-sample output shape for a per-sample input shape. Called once, when the
  // model is built; the layer remembers its input shape. Throws InputError (the
  // message without the "model.layers(i)" prefix, which the model adds) when the
  // input does not fit.
  virtual Shape output_shape(const Shape& in_sample) = 0;

  struct ParamSpec {
    std::string suffix;  // "weight", "bias"
    Shape shape;         // PyTorch layout: Linear weight (out, in), bias (out)
  };
  virtual std::vector<ParamSpec> parameter_specs() const { return {}; }

  // params, grads: this layer's sub-ranges of the model's buffers, in
  // parameter_specs() order. Both live in the default memory space.
  virtual void bind(float* /*params*/, float* /*grads*/) {}

  // Non-trained state saved with the model (BatchNorm's running statistics), in
  // PyTorch's names and layouts; bound to a sub-range of the model's buffer block.
  virtual std::vector<ParamSpec> buffer_specs() const { return {}; }
  virtual void bind_buffers(float* /*buffers*/) {}

  // PyTorch's default initialisation of the bound parameters; keys come from rng.
  virtual void init(Rng& /*rng*/) {}

  // Layers that synchronise across ranks (SyncBatchNorm) reduce through `comm`;
  // nullptr (the default) makes them behave as their per-rank version.
  virtual void set_communicator(Communicator* /*comm*/) {}

  // Stochastic layers (dropout) restart their random stream from `seed`.
  virtual void reseed(std::uint64_t /*seed*/) {}

  // Why a CUDA graph of this layer's training forward and backward could not be
  // replayed (a kernel argument the host changes every step, a host wait), or empty.
  // Composite layers ask their parts.
  virtual std::string graph_obstacle() const { return {}; }

  // The start-up memory plan (Model::activation_floats). kept_floats: the floats this
  // layer holds at `batch` of its own, from forward to backward or as its scratch,
  // beyond its output and its input gradient (the model plans those); what is small
  // beside them (per-channel sums) may be left out. scratch_floats: the process's
  // shared slots (tensor.hpp) its calls hold at `batch`, each entry of `most` raised
  // to at least the floats it asks. Composite layers add their parts'.
  virtual std::int64_t kept_floats(std::int64_t /*batch*/) const { return 0; }
  virtual void scratch_floats(std::int64_t /*batch*/, SlotFloats& /*most*/) const {}
  // The bytes a library holds for this layer's calls at `batch`, outside the buffers
  // above (oneDNN's copies and scratchpads for a convolution: ConvKernels::held_bytes).
  virtual std::int64_t library_bytes(std::int64_t /*batch*/) const { return 0; }
  // In training, the output is the input's buffer (flatten; a relu done in the passes
  // of the layer before; dropout of p 0), and the input gradient the output
  // gradient's (the same, and a relu whose mask the max-pool after it applies): the
  // plan counts no buffer for them.
  virtual bool output_is_input() const { return false; }
  virtual bool input_grad_is_output_grad() const { return false; }

  // x: (B, in_sample...) -> y: (B, out_sample...); y is resized by the layer.
  virtual void forward(const Tensor& x, Tensor& y, bool training) = 0;

  // After forward(x, y). Accumulates (+=) parameter gradients, as PyTorch does, or
  // writes them (=) while overwrite_gradients() is on, and writes dx (B, in_sample...)
  // unless needs_input_grad() is off.
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) = 0;

  // On: backward writes the parameter gradients over what their buffer holds, so
  // that buffer is never zeroed nor read (Model::zero_grad turns it on for the next
  // backward, as PyTorch's zero_grad(set_to_none=True) does). Off (the default):
  // backward adds to them. Composite layers pass it on.
  virtual void set_overwrite_gradients(bool on) { overwrite_gradients_ = on; }
  bool overwrite_gradients() const { return overwrite_gradients_; }

  // The model turns this off for the first layer with parameters: nothing upstream
  // needs its input gradient, and for linear that saves the largest GEMM of backward.
  void set_needs_input_grad(bool on) { needs_input_grad_ = on; }
  bool needs_input_grad() const { return needs_input_grad_; }

  // The precision of this layer's GEMM and convolution operands (train.precision);
  // layers without either ignore it. Composite layers pass it on.
  virtual void set_precision(Precision p) { precision_ = p; }
  Precision precision() const { return precision_; }

 private:
  bool needs_input_grad_ = true;
  bool overwrite_gradients_ = false;
  Precision precision_ = Precision::fp32;
};

}  // namespace ddp
