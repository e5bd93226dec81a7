#pragma once
// Test backends that hand every call to another backend (the process's own), for a
// test to override what it changes: ForwardingBackend for the compute backend,
// ForwardingConvKernels for a convolution's kernels.

#include <functional>
#include <memory>
#include <string>

#include "model/backend.hpp"

namespace ddp::test {

class ForwardingConvKernels : public ConvKernels {
 public:
  explicit ForwardingConvKernels(std::unique_ptr<ConvKernels> inner) : inner_(std::move(inner)) {}
  bool takes_narrow_activations(Precision p) const override { return inner_->takes_narrow_activations(p); }
  void configure(Precision precision, bool fused_relu, ConvSide in, ConvSide out) override {
    inner_->configure(precision, fused_relu, in, out);
  }
  Layout native_input_layout() override { return inner_->native_input_layout(); }
  Layout native_output_layout() override { return inner_->native_output_layout(); }
  void forward(std::int64_t B, const float* x, const float* weight, const float* bias, float* y) override {
    inner_->forward(B, x, weight, bias, y);
  }
  void backward_weights(std::int64_t B, const float* x, const float* dy, float* dweight, float* dbias,
                        bool accumulate) override {
    inner_->backward_weights(B, x, dy, dweight, dbias, accumulate);
  }
  void backward_data(std::int64_t B, const float* dy, const float* weight, float* dx,
                     bool accumulate) override {
    inner_->backward_data(B, dy, weight, dx, accumulate);
  }
  bool accumulates_input_grad() const override { return inner_->accumulates_input_grad(); }
  bool has_forward_stats() const override { return inner_->has_forward_stats(); }
  bool forward_stats(std::int64_t B, const float* x, const float* weight, float* y, float* sums) override {
    return inner_->forward_stats(B, x, weight, y, sums);
  }
  bool has_forward_prologue() const override { return inner_->has_forward_prologue(); }
  bool forward_stats_after(std::int64_t B, const float* x, const float* scale_shift, const float* weight,
                           float* y, float* sums) override {
    return inner_->forward_stats_after(B, x, scale_shift, weight, y, sums);
  }
  bool backward_weights_after(std::int64_t B, const float* x, const float* scale_shift, const float* dy,
                              float* dweight, bool accumulate) override {
    return inner_->backward_weights_after(B, x, scale_shift, dy, dweight, accumulate);
  }
  bool has_backward_data_sums() const override { return inner_->has_backward_data_sums(); }
  bool backward_data_sums(std::int64_t B, const float* dy, const float* weight, const float* x,
                          const float* scale_shift, const float* mean, float* dx, float* sums) override {
    return inner_->backward_data_sums(B, dy, weight, x, scale_shift, mean, dx, sums);
  }
  std::int64_t held_bytes(std::int64_t B) const override { return inner_->held_bytes(B); }

 protected:
  std::unique_ptr<ConvKernels> inner_;
};

class ForwardingBackend : public ComputeBackend {
 public:
  explicit ForwardingBackend(ComputeBackend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  std::string precision_text(Precision p) const override { return inner_.precision_text(p); }
  bool narrow_convolution_results(Precision p) const override { return inner_.narrow_convolution_results(p); }
  std::string precision_unsupported(Precision p) const override { return inner_.precision_unsupported(p); }
  std::string allow_tf32(bool allow) override { return inner_.allow_tf32(allow); }
  bool device_memory() const override { return inner_.device_memory(); }
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc, Precision p) override {
    inner_.gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, p);
  }
  bool gemm_takes_stored() const override { return inner_.gemm_takes_stored(); }
  void gemm_stored(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a, int lda,
                   const void* b, int ldb, float beta, void* c, int ldc, Precision p,
                   GemmStored stored) override {
    inner_.gemm_stored(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, p, stored);
  }
  bool gemm_epilogue(bool trans_a, bool trans_b, int m, int n, int k, const void* a, int lda, const void* b,
                     int ldb, void* c, int ldc, Precision p, GemmStored stored,
                     const GemmEpilogue& epilogue) override {
    return inner_.gemm_epilogue(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, p, stored, epilogue);
  }
  void gemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                    std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta,
                    float* c, int ldc, std::int64_t stride_c, int batch, Precision p) override {
    inner_.gemm_batched(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                        stride_c, batch, p);
  }
  void gemm_batched_groups(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                           int lda, const float* b, int ldb, float beta, float* c, int ldc, int batch,
                           GemmSteps item, int groups, GemmSteps group, Precision p) override {
    inner_.gemm_batched_groups(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, batch, item,
                               groups, group, p);
  }
  std::int64_t narrow_copy_floats(std::int64_t n, Precision p) const override {
    return inner_.narrow_copy_floats(n, p);
  }
  void narrow_copy(const float* from, std::int64_t n, Precision p, float* to) override {
    inner_.narrow_copy(from, n, p, to);
  }
  void forget_narrow_copy(const float* from) override { inner_.forget_narrow_copy(from); }
  bool has_fused_attention(std::int64_t hs, Precision p) const override {
    return inner_.has_fused_attention(hs, p);
  }
  void fused_attention_forward(const FusedAttention& a, const float* qkv, float* o, float* stats) override {
    inner_.fused_attention_forward(a, qkv, o, stats);
  }
  void fused_attention_backward(const FusedAttention& a, const float* qkv, const float* o, const float* d_o,
                                const float* stats, float* delta, float* dqkv) override {
    inner_.fused_attention_backward(a, qkv, o, d_o, stats, delta, dqkv);
  }
  std::unique_ptr<ConvKernels> make_conv(const ConvGeometry& g) override { return inner_.make_conv(g); }
  BatchNormKernels* batch_norm() override { return inner_.batch_norm(); }
  bool batch_norm_in_library() const override { return inner_.batch_norm_in_library(); }
  void synchronize() override { inner_.synchronize(); }
  std::string graphs_unsupported() const override { return inner_.graphs_unsupported(); }
  std::unique_ptr<CapturedWork> capture(const std::function<void()>& record) override {
    return inner_.capture(record);
  }

 protected:
  ComputeBackend& inner_;
};

}  // namespace ddp::test
