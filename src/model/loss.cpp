#include "model/loss.hpp"

#include <cmath>

namespace ddp {

namespace {
#if KOKKOS_VERSION >= 30700
using Kokkos::exp;
using Kokkos::log;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
#endif
}  // namespace

void loss_forward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets, View1 loss,
                  View1 correct, float smoothing) {
  const std::int64_t B = out.batch(), C = out.sample_numel();
  ConstView1 o = out.data;
  if (kind == LossKind::CrossEntropy) {
    const float on_label = 1.0f - smoothing, per_class = smoothing / static_cast<float>(C);
    const bool smooth = smoothing != 0.0f;
    Kokkos::parallel_for(
        "CrossEntropy::forward", Range(0, B), KOKKOS_LAMBDA(std::int64_t b) {
          const float* row = &o(b * C);
          std::int64_t argmax = 0;
          for (std::int64_t c = 1; c < C; ++c)
            if (row[c] > row[argmax]) argmax = c;
          const float m = row[argmax];
          float sum = 0.0f;
          for (std::int64_t c = 0; c < C; ++c) sum += exp(row[c] - m);
          const std::int32_t label = labels(b);
          const bool valid = label >= 0 && label < C;
          float spread = 0.0f;  // s / C sum_c out_bc
          if (smooth) {
            for (std::int64_t c = 0; c < C; ++c) spread += row[c];
            spread *= per_class;
          }
          loss(b) = valid
                        ? (smooth ? m + log(sum) - on_label * row[label] - spread : m + log(sum) - row[label])
                        : NAN;
          correct(b) = valid && argmax == label ? 1.0f : 0.0f;
        });
  } else {
    Kokkos::parallel_for(
        "MSE::forward", Range(0, B), KOKKOS_LAMBDA(std::int64_t b) {
          float sum = 0.0f;
          for (std::int64_t c = 0; c < C; ++c) {
            const float d = o(b * C + c) - targets(b * C + c);
            sum += d * d;
          }
          loss(b) = sum / C;
        });
  }
}

void loss_backward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets,
                   float scale, Tensor& dout, float smoothing) {
  const std::int64_t B = out.batch(), C = out.sample_numel();
  resize_like(dout, out, "Loss::dout");
  ConstView1 o = out.data;
  View1 d = dout.data;
  if (kind == LossKind::CrossEntropy) {
    // d loss_b / d out_bc = softmax(out_b)_c - (1 - s) [c == label_b] - s / C; with
    // s = 0 the same floats as softmax - [c == label_b] (x - 0 is x).
    const float on_label = scale * (1.0f - smoothing), per_class = scale * smoothing / static_cast<float>(C);
    Kokkos::parallel_for(
        "CrossEntropy::backward", Range(0, B), KOKKOS_LAMBDA(std::int64_t b) {
          const float* row = &o(b * C);
          float m = row[0];
          for (std::int64_t c = 1; c < C; ++c) m = row[c] > m ? row[c] : m;
          float sum = 0.0f;
          for (std::int64_t c = 0; c < C; ++c) sum += exp(row[c] - m);
          const float inv = scale / sum;
          const std::int32_t label = labels(b);
          for (std::int64_t c = 0; c < C; ++c)
            d(b * C + c) = exp(row[c] - m) * inv - (c == label ? on_label : 0.0f) - per_class;
        });
  } else {
    // d loss_b / d out_bc = 2 (out_bc - target_bc) / C
    const float k = 2.0f * scale / C;
    Kokkos::parallel_for(
        "MSE::backward", Range(0, B * C), KOKKOS_LAMBDA(std::int64_t i) { d(i) = k * (o(i) - targets(i)); });
  }
}

void loss_forward_backward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets,
                           float scale, View1 loss, View1 correct, Tensor& dout, float smoothing) {
  const std::int64_t B = out.batch(), C = out.sample_numel();
  resize_like(dout, out, "Loss::dout");
  ConstView1 o = out.data;
  View1 d = dout.data;
  if (kind == LossKind::CrossEntropy) {
    // loss_forward's constants, then loss_backward's (scaled)
    const float on_label = 1.0f - smoothing, per_class = smoothing / static_cast<float>(C);
    const float on_label_d = scale * (1.0f - smoothing), per_class_d = scale * smoothing / static_cast<float>(C);
    const bool smooth = smoothing != 0.0f;
    Kokkos::parallel_for(
        "CrossEntropy::forward_backward", Range(0, B), KOKKOS_LAMBDA(std::int64_t b) {
          const float* row = &o(b * C);
          std::int64_t argmax = 0;
          for (std::int64_t c = 1; c < C; ++c)
            if (row[c] > row[argmax]) argmax = c;
          const float m = row[argmax];  // loss_backward's running maximum is the same float
          float sum = 0.0f;
          for (std::int64_t c = 0; c < C; ++c) sum += exp(row[c] - m);
          const std::int32_t label = labels(b);
          const bool valid = label >= 0 && label < C;
          float spread = 0.0f;
          if (smooth) {
            for (std::int64_t c = 0; c < C; ++c) spread += row[c];
            spread *= per_class;
          }
          loss(b) = valid
                        ? (smooth ? m + log(sum) - on_label * row[label] - spread : m + log(sum) - row[label])
                        : NAN;
          correct(b) = valid && argmax == label ? 1.0f : 0.0f;
          const float inv = scale / sum;
          for (std::int64_t c = 0; c < C; ++c)
            d(b * C + c) = exp(row[c] - m) * inv - (c == label ? on_label_d : 0.0f) - per_class_d;
        });
  } else {
    const float k = 2.0f * scale / C;
    Kokkos::parallel_for(
        "MSE::forward_backward", Range(0, B), KOKKOS_LAMBDA(std::int64_t b) {
          float sum = 0.0f;
          for (std::int64_t c = 0; c < C; ++c) {
            const float diff = o(b * C + c) - targets(b * C + c);
            sum += diff * diff;
            d(b * C + c) = k * diff;
          }
          loss(b) = sum / C;
        });
  }
}

}  // namespace ddp
