#pragma once
// The residual blocks of torchvision's ResNets:
//   resblock(channels[, stride=s][, zero_init][, sync]): BasicBlock (ResNet-18/34)
//     conv1 3x3 stride s -> bn1 -> relu -> conv2 3x3 -> bn2; out = channels
//   bottleneck(width[, stride=s][, zero_init][, sync]): Bottleneck of ResNet-50 v1.5
//     conv1 1x1 -> bn1 -> relu -> conv2 3x3 stride s -> bn2 -> relu -> conv3 1x1 -> bn3;
//     out = 4 * width (the stride sits in the 3x3, as in v1.5 and torchvision)
// y = relu(branch(x) + shortcut(x)); 3x3 convolutions pad 1, no convolution has a
// bias. shortcut is the identity, or downsample = 1x1 conv (stride s, no bias) + bn
// when the stride is not 1 or the channel count changes. zero_init starts the last
// batch norm's gamma at 0 (torchvision's zero_init_residual). Parameter and buffer
// names are torchvision's ("conv1.weight", "bn3.running_mean", "downsample.0.weight",
// ...), so the model's "layers.<i>." prefix gives the keys of an nn.Sequential of blocks.
// In the model's plan (set_layouts), the block computes in its convolutions' blocked
// layout (nChw8c / nChw16c on the host), batch norms and relus included; x and y are
// reordered at its edges only where the model hands over or wants another layout.

#include <memory>

#include "model/batchnorm.hpp"
#include "model/conv2d.hpp"

namespace ddp {

class ResBlock : public Layer {
 public:
  enum Kind { Basic, Bottleneck };
  // channels: BasicBlock's output channels, or Bottleneck's width (output 4 * width).
  ResBlock(Kind kind, std::int64_t channels, std::int64_t stride, bool zero_init, bool sync);

  std::string kind() const override { return kind_ == Basic ? "resblock" : "bottleneck"; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  std::vector<ParamSpec> buffer_specs() const override;
  void bind_buffers(float* buffers) override;
  void init(Rng& rng) override;
  void set_communicator(Communicator* comm) override;
  std::string graph_obstacle() const override;
  void set_precision(Precision p) override;
  void set_overwrite_gradients(bool on) override;
  // Every stage's activations and gradients (a, da; r, dr but in the last; b
  // unfused), the shortcut's, the sums its convolutions hand to the batch norms,
  // the pre-relu sum's gradient where dx does not hold it,
  // x and y reordered at its edges, its convolutions' own (Conv2d::kept_floats), and
  // where the library's batch norm runs (DDP_CUDNN_BATCHNORM=1) what its calls keep.
  std::int64_t kept_floats(std::int64_t batch) const override;
  std::int64_t library_bytes(std::int64_t batch) const override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

  // The layout the block's convolutions all read and write natively at the current
  // precision (nchw when they do not agree on a blocked one).
  Layout native_layout() const;
  // The layouts of x and dx (in), of the block's own activations (inside) and of y
  // and dy (out); nchw unless set.
  void set_layouts(Layout in, Layout inside, Layout out);
  // Fewer passes over the activations (Model::fuse_layers): each relu of the branch
  // inside the batch norm before it, and the last batch norm, the shortcut's, the
  // sum and the relu in one pass forward (so b of the last stage is never written,
  // nor s2 but where the library's batch norm adds it: set_library_batch_norm).
  // Fused, in training, a batch norm takes its statistics from the sums the
  // convolution before it wrote with its output, where the backend's kernels do
  // (ConvKernels::forward_stats: cuDNN's graph API), and makes no pass for them; and
  // where the next convolution's kernels apply a batch norm and its relu on the way in
  // (ConvKernels::has_forward_prologue: cuDNN's "scale-bias-relu -> conv -> genstats"),
  // a batch norm of the branch but the last writes nothing: the next convolution reads
  // its input a with the batch norm's map (of the batch's statistics, or in eval the
  // running ones), and in backward takes its weights' gradient from the same (or,
  // where the kernels decline that, from r written then), and the batch norm's
  // backward its relu's mask from a (prologue_after).
  void fuse_passes();
  // The element types of x and dx (in), of the block's own activations and their
  // gradients (inside: every convolution's output, every batch norm's, the
  // shortcut's) and of y and dy (out); fp32 unless set. A narrow type inside (bf16,
  // fp16) is what PyTorch's AMP keeps; the model sets it where the convolutions'
  // results are narrow anyway (the GPU's narrow cuDNN kernels), and hands it from
  // one block to the next. in and out: fp32 or the type inside. Fused passes only.
  void set_types(Precision in, Precision inside, Precision out);
  // Its batch norms' set_library_kernels (model/batchnorm.hpp). Where the library's
  // batch norm runs the last one, it adds the shortcut and rectifies in its own
  // call (y = relu(bn3(a) + shortcut)) and its backward writes the shortcut's
  // gradient. A projection's shortcut is then its batch norm's output stored in the
  // narrow type before the add (as in PyTorch's AMP), where the fused pass here
  // adds it unrounded.
  void set_library_batch_norm(BatchNormKernels* kernels);

  // The block's output y = relu(bn3(a) + shortcut) in one pass (fused), from a and
  // s1 narrow (Narrow) or fp32, x (NarrowX) and y (NarrowY) too. Public only because
  // CUDA's extended lambdas may not live in private members.
  template <bool Narrow, bool NarrowX, bool NarrowY>
  void fused_output(const Tensor& x, Tensor& y);

 private:
  struct Part {  // a sub-layer and the name prefix of its parameters
    Layer* layer;
    std::string prefix;
  };
  std::vector<Part> parts() const;  // conv1, bn1, conv2, bn2[, conv3, bn3][, downsample.0, downsample.1]
  std::vector<Conv2d*> convs() const;
  // Backward writes the pre-relu sum's gradient g into dx (the identity's gradient),
  // to which the first convolution then adds the branch's.
  bool grad_sum_in_dx() const { return !projection_ && needs_input_grad() && in_type_ == out_type_; }
  // fused_output for the types of the tensors at hand
  void write_output(const Tensor& x, Tensor& y);
  // Whether a convolution here computes the sums of its output in its own pass
  // (Conv2d::computes_sums), and the floats of conv_sums_: two per channel of the widest.
  bool any_conv_sums() const;
  std::int64_t conv_sums_floats() const;
  // Whether stage k's batch norm and relu go into the next convolution's prologue in a
  // fused training forward (r not written): the next convolution takes a prologue
  // (Conv2d::takes_prologue), and neither batch norm, stage k's nor the next one's,
  // runs in the library. `plan`: as the memory plan foresees it
  // (BatchNorm2d::library_would_run), else as the forward at hand runs.
  bool prologue_after(std::size_t k, bool plan) const;
  // What the library's batch norm adds in forward (library_output_), as the plan foresees it.
  bool library_output_planned() const;

  // One conv -> bn step of the residual branch, with its activations, all
  // (B, C_k, Ho_k, Wo_k): the convolution's output a, the batch norm's b, and, on
  // every step but the last, r = relu(b), the next step's input. Fused, b is not
  // written (the batch norm writes r), nor r where the next convolution applies the
  // batch norm and relu to a on its way in (deferred).
  struct Stage {
    std::unique_ptr<Conv2d> conv;
    std::unique_ptr<BatchNorm2d> bn;
    Tensor a, b, r;
    Tensor da, dr;             // gradients of a and of r (then of b, in place)
    bool deferred = false;     // the last forward left the batch norm and relu to the next convolution
    bool grad_summed = false;  // and the last backward's dr came masked, with its sums, in conv_sums_
    View1 scale_shift;         // the batch norm's map for it (BatchNorm2d::scale_shift), 2C floats
  };

  Kind kind_;
  std::int64_t channels_, stride_;
  bool projection_ = false;
  bool fused_ = false;
  bool library_output_ = false;  // the last forward's output came from the library's batch norm
  Precision in_type_ = Precision::fp32, narrow_ = Precision::fp32, out_type_ = Precision::fp32;  // set_types
  Shape in_sample_, out_sample_;  // (C_in, H, W), (C_out, Ho, Wo)
  std::vector<Stage> stages_;     // the residual branch, input to output
  std::unique_ptr<Conv2d> down_conv_;
  std::unique_ptr<BatchNorm2d> down_bn_;
  // shortcut conv, bn (s2 unfused, or for the library's batch norm to add): (B, C_out, Ho, Wo)
  Tensor s1_, s2_;
  Tensor g_, ds1_;  // gradient of the pre-relu sum (where it is not written into dx), of s1
  Layout in_ = Layout::nchw, inside_ = Layout::nchw, out_ = Layout::nchw;
  // Where in_ or out_ is not inside_: x, dx, y and dy in the inside layout
  Tensor x_in_, dx_in_, y_in_, dy_in_;
  // The sums a convolution wrote with its output (sum, then sum of squares, a channel
  // each) for the batch norm after it, fused and in training, where any_conv_sums()
  View1 conv_sums_;
};

}  // namespace ddp
