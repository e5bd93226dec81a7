#pragma once
// The model: a sequence of layers built from the input file's model.layers, with
// every parameter in ONE contiguous buffer and every gradient in another of the
// same layout, so gradient buckets are plain ranges and a checkpoint is a table.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/layer.hpp"

namespace ddp {

class Model {
 public:
  // specs: the model.layers strings; sample_shape: one input sample, e.g. {1, 28, 28};
  // seed: initialisation (and the default dropout streams). Throws InputError for a
  // bad spec or a layer that does not fit its input, naming model.layers(i), 1-based.
  // fuse: let neighbouring layers share passes over the activations (conv2d -> relu
  // forward, relu -> maxpool backward) and keep the activations between convolutions,
  // resblocks, batch norms and max-pools in the convolutions' own layout (oneDNN's
  // blocked one; nhwc for cuDNN's bf16/fp16 kernels); same results up to float
  // rounding, off for tests.
  Model(const std::vector<std::string>& specs, const Shape& sample_shape, std::uint64_t seed,
        bool fuse = true);

  std::int64_t num_parameters() const { return static_cast<std::int64_t>(params_.extent(0)); }
  View1 parameters() const { return params_; }  // (num_parameters)
  View1 gradients() const { return grads_; }    // (num_parameters), same layout
  // Moves the gradients into `storage` (num_parameters floats of the tensors' memory
  // space, kept alive by the caller until it calls this again) and binds the layers to
  // it: a shared-memory window that other ranks read in place (comm/shm_reducer.hpp).
  // nullptr: back into the model's own buffer. The values move with them. While they
  // are elsewhere the model holds no buffer of its own for them.
  void place_gradients(float* storage);

  struct ParamEntry {
    std::string name;  // "layers.<i>.weight": i counts every layer, as in nn.Sequential
    Shape shape;       // PyTorch layout
    std::int64_t offset;
    std::int64_t size;
  };
  const std::vector<ParamEntry>& parameter_table() const { return table_; }

  // Non-trained state (BatchNorm running statistics): one block, its own table,
  // saved in checkpoints beside the parameters ("layers.<i>.running_mean").
  View1 buffers() const { return buffers_; }
  const std::vector<ParamEntry>& buffer_table() const { return buffer_table_; }

  const Shape& input_shape() const { return shapes_.front(); }  // per sample, e.g. {1, 28, 28}
  const Shape& output_shape() const { return shapes_.back(); }  // per sample, e.g. {10}

  // x: (B, sample...) -> (B, output...). The result stays valid until the next forward;
  // x's buffer is kept, not copied, so it must stay unchanged until backward().
  // Throws InputError when x's sample shape is not the one the model was built for.
  const Tensor& forward(const Tensor& x, bool training);
  // dout: (B, output...), after forward(). Accumulates into gradients(), or writes
  // them when it is the first backward after zero_grad().
  // on_ready(offset), when given, is called as soon as every gradient at offsets
  // >= offset is final: after each layer with parameters, last layer first, so a
  // bucketed all-reduce can start while backward goes on.
  void backward(const Tensor& dout, const std::function<void(std::int64_t)>& on_ready = nullptr);
  // The next backward writes the gradients instead of adding to them, as after
  // PyTorch's zero_grad(set_to_none=True): nothing is written now (a pass over the
  // buffer, and the backward GEMMs' read of it, saved), so gradients() keeps its old
  // values until then.
  void zero_grad();
  // The communicator SyncBatchNorm layers reduce their statistics through (the
  // trainer's); without one (or nullptr) they behave as plain BatchNorm. Not owned.
  void set_communicator(Communicator* comm);
  // The precision of every GEMM and convolution operand (train.precision). Plans the
  // layouts again: the kernels for another precision may want others (cuDNN's bf16
  // and fp16 ones nhwc).
  void set_precision(Precision p);
  Precision precision() const { return precision_; }
  // How layer i's output (and the gradient flowing back into it) lies in memory, as
  // planned: the convolutions' own layout (nChw8c, nChw16c on the host; nhwc for
  // cuDNN's bf16/fp16) from a convolution or resblock to the next layer that reads it
  // (plan_layouts), else nchw.
  Layout output_layout(std::size_t i) const { return layouts_[i]; }
  // The type layer i's output and the gradient w.r.t. it are stored in: fp32, or the
  // narrow precision where the model keeps activations so (plan_types).
  Precision output_type(std::size_t i) const { return types_[i]; }
  // Whether activations are kept narrow where layers allow: at bf16/fp16 where the
  // backend's convolutions write narrow results (the GPU's narrow cuDNN kernels), or
  // where asked (plan_narrow_activations).
  bool narrow_activations() const;
  // Keep activations narrow at bf16/fp16 also where the backend's convolutions take
  // fp32 (they then run on widened copies): the GPU's plan, checked on the host by
  // the tests.
  void plan_narrow_activations(bool on);
  // Restart the dropout streams from `seed` (the trainer makes them differ per rank).
  void reseed_dropout(std::uint64_t seed);
  // Why a training step of this model cannot be replayed from a CUDA graph, naming
  // the first layer that stops it ("model.layers(3) dropout(0.5): ..."), or empty.
  std::string graph_obstacle() const;
  // Whether the next backward writes the gradients (zero_grad since the last one): a
  // captured backward does one or the other. After replaying a captured backward,
  // replayed_backward() leaves the model as backward() would.
  bool writes_gradients() const { return write_grads_; }
  void replayed_backward() { write_grads_ = false; }

  // Floats one training step at batch `batch` keeps between layers, planned from the
  // shapes before any forward: every layer's output (B, out_i...) and the gradient
  // w.r.t. the input of every layer backward reaches after the first trained one,
  // half as many where they are narrow (output_type), blocked layouts' padding
  // channels included; what layers keep inside (Layer::kept_floats: attention's qkv
  // and probabilities, a transformer block's inner activations, a residual block's
  // stages, a convolution's fp32 copies, layer norms' statistics, pooling indices,
  // dropout masks); and the shared slots (Layer::scratch_floats), each as large as
  // the largest asks. A floor: the libraries' own memory (oneDNN's reorders and
  // scratchpads, cuDNN's workspaces) is not in it (ddp_bench measures the whole).
  std::int64_t activation_floats(std::int64_t batch) const;
  // The bytes the libraries hold for the layers' calls at `batch` (Layer::library_bytes).
  std::int64_t library_bytes(std::int64_t batch) const;

  // One line per layer (position, spec, output shape, parameters) and the total.
  std::string summary() const;

 private:
  void find_ties();    // ties_, from the tied heads (InputError for one without its embedding)
  void bind_layers();  // every layer to its ranges of params_ and grads_, a tied head to its embedding's
  void fuse_layers();
  void plan_layouts();
  std::vector<Precision> plan_types() const;  // the output types, from layouts_

  std::vector<Layout> layouts_;   // layouts_[i]: output_layout(i)
  std::vector<Precision> types_;  // types_[i]: output_type(i)
  bool narrow_asked_ = false;     // plan_narrow_activations
  Precision precision_ = Precision::fp32;
  bool fuse_;                             // fusions and blocked layouts on (planned again by set_precision)
  std::vector<std::string> specs_;        // as given, whitespace-trimmed
  std::vector<std::string> trace_names_;  // "layers.<i> <spec>": layer i's spans in the timeline (io.trace)
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Shape> shapes_;               // shapes_[i]: per-sample input of layer i; back(): output
  std::vector<std::int64_t> layer_params_;  // parameter count per layer
  std::vector<std::int64_t> layer_offset_;  // offset of each layer's parameters
  struct Tie {
    std::size_t head, embedding;  // a linear(n, tied) and the embedding whose table it shares
  };
  std::vector<Tie> ties_;
  std::vector<ParamEntry> table_;
  std::vector<ParamEntry> buffer_table_;
  std::size_t first_trained_;  // first layer with parameters (layers_.size() if none)
  bool write_grads_ = true;    // zero_grad() since the last backward (and none before the first)
  View1 params_, grads_, buffers_;
  bool grads_placed_ = false;  // grads_ is place_gradients' storage, not a buffer of the model's own
  Tensor input_;               // (B, sample...) the last forward's input (shares its buffer)
  std::vector<Tensor> acts_;   // acts_[i]: output of layer i
  std::vector<Tensor> grad_;   // grad_[i]: gradient w.r.t. the input of layer i
};

}  // namespace ddp
