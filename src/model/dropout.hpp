#pragma once
// dropout(p): inverted dropout, PyTorch's nn.Dropout. Training: keep each element
// with probability 1-p and scale it by 1/(1-p); eval: identity (y aliases x).
// The mask of call c, element i is a pure function of (seed, c, i), so a run is
// reproducible and independent of how the kernel is scheduled.

#include "model/layer.hpp"

namespace ddp {

class Dropout : public Layer {
 public:
  explicit Dropout(float p) : p_(p) {}

  std::string kind() const override { return "dropout"; }
  Shape output_shape(const Shape& in_sample) override { return sample_ = in_sample; }
  void reseed(std::uint64_t seed) override;
  std::string graph_obstacle() const override {
    return "dropout draws its masks from a stream the host moves on at every step";
  }
  // Its mask (y and dx are its own, and the model's slots alias them).
  bool output_is_input() const override { return p_ == 0.0f; }
  bool input_grad_is_output_grad() const override { return p_ == 0.0f; }
  std::int64_t kept_floats(std::int64_t batch) const override {
    return p_ > 0.0f ? batch * shape_numel(sample_) : 0;
  }
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

 private:
  float p_;
  Shape sample_;
  std::uint64_t seed_ = 0;
  std::uint64_t calls_ = 0;  // training forwards since reseed: the stream's counter
  bool masked_ = false;      // the last forward applied a mask (else y aliased x)
  // Owned rather than written into the model's slots, because in eval those slots
  // alias x and dy.
  Tensor mask_;  // (B, sample...) 0 or 1/(1-p)
  Tensor y_;     // (B, sample...)
  Tensor dx_;    // (B, sample...)
};

}  // namespace ddp
