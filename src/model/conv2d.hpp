#pragma once
// conv2d(out, k, stride=s, pad=p, bias=true): PyTorch's nn.Conv2d (square kernel,
// symmetric zero padding, no dilation or groups) on float32 through oneDNN; NCHW
// activations, or blocked16 where the model sets it (set_layouts).
// Weight (out, in, k, k), bias (out). The primitives for a batch size are created
// once and cached; every call only points them at the current buffers.

#include <map>
#include <memory>

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
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
  // bf16: oneDNN's bf16 kernels (fp32 destinations) where the CPU has them; fp16, and
  // bf16 elsewhere: emulated (operands rounded to fp16/bf16 values in the primitives'
  // fp32 copies). Drops the cached primitives.
  void set_precision(Precision p) override;

  // Floating-point operations of one forward at batch B (2 per multiply-add).
  double forward_flops(std::int64_t B) const;

  // The model's conv2d -> relu fusion: forward applies max(y, 0) as a oneDNN post-op,
  // saving the relu layer a pass over the activation (the relu then passes x on).
  // Backward is unchanged: the relu layer (or a max-pool after it) still masks dy.
  // Call before the first forward.
  void fuse_relu() { fused_relu_ = true; }

  // The model keeps an activation between a convolution and a max-pool in the
  // blocked16 layout where oneDNN's kernels read and write that layout anyway, forward
  // and backward: no reorder to or from NCHW on that side. These ask oneDNN, at the
  // current precision, whether that holds for x and dx, and for y and dy.
  bool blocked_input_fits() const;
  bool blocked_output_fits() const;
  // The layouts of x and dx (in), of y and dy (out); nchw unless set. Drops the
  // cached primitives.
  void set_layouts(Layout in, Layout out);

 private:
  struct Descs;       // oneDNN's primitive descriptors of one batch size
  struct Primitives;  // oneDNN descriptors, primitives and memories of one batch size
  Descs descs(std::int64_t B) const;
  Primitives& primitives(std::int64_t B);

  std::int64_t out_, k_, stride_, pad_;
  bool has_bias_;
  bool fused_relu_ = false;
  Layout in_layout_ = Layout::nchw, out_layout_ = Layout::nchw;
  std::int64_t in_ = 0, h_ = 0, w_ = 0, ho_ = 0, wo_ = 0;
  Shape in_sample_, out_sample_;  // (in, h, w), (out, ho, wo)
  float* weight_ = nullptr;       // (out, in, k, k)
  float* bias_ = nullptr;         // (out) or none
  float* dweight_ = nullptr;      // (out, in, k, k)
  float* dbias_ = nullptr;        // (out) or none
  View1 dparams_scratch_;         // (out*in*k*k + out): oneDNN overwrites, we accumulate
  std::map<std::int64_t, std::unique_ptr<Primitives>> by_batch_;
};

}  // namespace ddp
