#pragma once
// conv2d(out, k, stride=s, pad=p, bias=true): PyTorch's nn.Conv2d (square kernel,
// symmetric zero padding, no dilation or groups) on float32; NCHW activations, or
// the backend's blocked layout where the model sets it (set_layouts).
// Weight (out, in, k, k), bias (out). The arithmetic is the compute backend's
// (model/backend.hpp: oneDNN on the host, cuDNN on a GPU); the layer owns the
// shapes, the parameters and the buffers.

#include <memory>

#include "model/backend.hpp"
#include "model/layer.hpp"

namespace ddp {

class Conv2d : public Layer {
 public:
  Conv2d(std::int64_t out_channels, std::int64_t kernel, std::int64_t stride, std::int64_t pad, bool bias);
  ~Conv2d() override;

  std::string kind() const override { return "conv2d"; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  void init(Rng& rng) override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  // forward, and in the same pass the per-channel sums the batch norm after it needs
  // (sums: 2 * out floats, each channel's sum of y over (B, ho, wo), then of y^2)
  // where the backend's kernels have one for this call (ConvKernels::forward_stats):
  // whether the sums were written (else forward ran without them).
  bool forward_with_sums(const Tensor& x, Tensor& y, float* sums);
  // Whether forward_with_sums may compute the sums here (no bias, no fused relu, and
  // the backend's kernels have such a pass on the configured sides).
  bool computes_sums() const {
    return kernels_ && !geometry_.bias && !fused_relu_ && kernels_->has_forward_stats();
  }
  // Whether forward_after and backward_after may run here (computes_sums(), and the
  // backend's kernels apply a batch norm and relu on the way in:
  // ConvKernels::has_forward_prologue).
  bool takes_prologue() const { return computes_sums() && kernels_->has_forward_prologue(); }
  // forward_with_sums on relu(x * scale + shift), x the batch norm's input before this
  // convolution (of this one's input layout and type), scale_shift its map (in floats
  // of scale, then of shift: BatchNorm2d::scale_shift), never stored rectified:
  // whether the kernels took it (else y and sums are not to be read).
  bool forward_after(const Tensor& x, const float* scale_shift, Tensor& y, float* sums);
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
  // backward on the input forward_after rectified on the way in, from the same x and
  // map: whether the kernels took the weights' gradient so (else nothing ran, and the
  // caller writes the rectified input and runs backward).
  // With `sums`, the input gradient too is taken through that batch norm's relu, with
  // the sums of its backward, where the kernels can (ConvKernels::backward_data_sums,
  // its mean given): dx written masked and sums->written set, else dx as backward writes it.
  struct InputGradSums {
    const float* mean = nullptr;  // the batch norm's (in floats)
    float* sums = nullptr;        // 2 * in floats: of dx, then of dx (x - mean)
    bool written = false;
  };
  bool backward_after(const Tensor& x, const float* scale_shift, const Tensor& dy, Tensor& dx,
                      InputGradSums* sums = nullptr);
  // The backend plans its kernels for the new precision (model/precision.hpp says
  // how each backend runs bf16 and fp16).
  void set_precision(Precision p) override;

  // Floating-point operations of one forward at batch B (2 per multiply-add).
  double forward_flops(std::int64_t B) const { return geometry_.forward_flops(B); }

  // The model's conv2d -> relu fusion: forward applies max(y, 0) in the backend's
  // kernel (a oneDNN post-op), saving the relu layer a pass over the activation (the
  // relu then passes x on). Backward is unchanged: the relu layer (or a max-pool
  // after it) still masks dy. Call before the first forward.
  void fuse_relu();

  // The model keeps an activation between a convolution and a max-pool in the
  // blocked layout the backend's kernels read and write anyway, forward and backward:
  // no reorder to or from NCHW on that side. These ask the backend, at the current
  // precision, which layout that is for x and dx, and for y and dy (nchw: none).
  Layout native_input_layout() const { return kernels_->native_input_layout(); }
  Layout native_output_layout() const { return kernels_->native_output_layout(); }
  // The layouts of x and dx (in), of y and dy (out); nchw unless set.
  void set_layouts(Layout in, Layout out);
  // The element types of x and dx (in), of y and dy (out): fp32 unless set, the
  // narrow precision inside residual blocks (ResBlock::set_types). Where the
  // backend's kernels do not take that type, they run on fp32 copies (widened here,
  // their results narrowed after).
  void set_types(Precision in, Precision out);
  // Whether y may be of the narrow type: not where a bias or a fused relu follows the
  // convolution (they run in the kernels' fp32 epilogue).
  bool output_may_be_narrow() const { return !geometry_.bias && !fused_relu_; }
  // Backward adds the input gradient to what dx holds (dx += conv^T(dy)) instead of
  // writing it: a residual block's two gradients of its input, summed. dx must then
  // hold the input's shape, layout and type. Where the backend can (cuDNN on a dx it
  // writes as it is: beta = 1) the kernel adds as it writes, saving a pass over dx;
  // elsewhere the gradient is computed apart and added, dx + conv^T(dy).
  void set_accumulate_input_grad(bool on) { accumulate_dx_ = on; }
  const Shape& output_sample() const { return out_sample_; }

  // The memory plan: the fp32 copies the kernels run on where a side is narrow and
  // they take fp32 only, and the input gradient computed apart where backward adds it
  // and the kernels cannot. The second form with the input gradient (wanted, added)
  // as the backward to come will set them (a residual block sets them as it calls).
  std::int64_t kept_floats(std::int64_t batch) const override {
    return kept_floats(batch, needs_input_grad(), accumulate_dx_);
  }
  std::int64_t kept_floats(std::int64_t batch, bool input_grad, bool accumulate) const;
  std::int64_t library_bytes(std::int64_t batch) const override { return kernels_->held_bytes(batch); }

 private:
  void configure();  // hands precision, fusion, layouts and types to the kernels
  // forward, with the sums where `sums` is not null and the kernels write them: whether they did
  // (on relu(x scale + shift) where scale_shift is not null, with the sums then)
  bool run_forward(const Tensor& x, Tensor& y, float* sums, const float* scale_shift = nullptr);
  // backward's part after the weights' gradient: the input gradient, written or added
  void backward_input(std::int64_t B, const Tensor& dy, Tensor& dx);
  // t itself, or its fp32 copy in `wide` where t is narrow and the kernels want fp32
  const Tensor& for_kernels(const Tensor& t, Tensor& wide, const char* label) const;
  // dx = conv^T(dy), written (dx sized here)
  void input_grad(std::int64_t B, const Tensor& dy, Tensor& dx);
  // dx is narrow and the kernels write it fp32 (into dx_wide_, narrowed after)
  bool narrow_dx_from_wide() const { return widened_ && in_type_ != Precision::fp32; }

  ConvGeometry geometry_;
  bool fused_relu_ = false;
  bool accumulate_dx_ = false;
  Layout in_layout_ = Layout::nchw, out_layout_ = Layout::nchw;
  Precision in_type_ = Precision::fp32, out_type_ = Precision::fp32;
  bool widened_ = false;  // a side is narrow and the kernels take fp32: they run on these copies
  Tensor x_wide_, dy_wide_, y_wide_, dx_wide_;
  // the input gradient to add, where the kernels do not add it themselves
  Tensor dx_part_;
  Shape in_sample_, out_sample_;          // (in, h, w), (out, ho, wo)
  float* weight_ = nullptr;               // (out, in, k, k)
  float* bias_ = nullptr;                 // (out) or none
  float* dweight_ = nullptr;              // (out, in, k, k)
  float* dbias_ = nullptr;                // (out) or none
  std::unique_ptr<ConvKernels> kernels_;  // made by output_shape(), when the input is known
};

}  // namespace ddp
