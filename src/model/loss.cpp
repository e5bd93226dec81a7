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

// One row of logits: its first maximum, that value, and sum_c exp(row_c - max).
// (loss_backward's running maximum row_c > m ? row_c : m is the same float.)
struct SoftmaxRow {
  std::int64_t argmax;
  float m, sum;
};

KOKKOS_INLINE_FUNCTION SoftmaxRow softmax_row(const float* row, std::int64_t C) {
  std::int64_t argmax = 0;
  for (std::int64_t c = 1; c < C; ++c)
    if (row[c] > row[argmax]) argmax = c;
  const float m = row[argmax];
  float sum = 0.0f;
  for (std::int64_t c = 0; c < C; ++c) sum += exp(row[c] - m);
  return {argmax, m, sum};
}

// Cross-entropy's per-sample loss and correct flag (loss_forward's contract).
struct CrossEntropyLoss {
  float on_label, per_class;  // 1 - s, s / C
  bool smooth;
  KOKKOS_INLINE_FUNCTION void operator()(const float* row, std::int64_t C, std::int32_t label,
                                         const SoftmaxRow& s, float& loss, float& correct) const {
    const bool valid = label >= 0 && label < C;
    float spread = 0.0f;  // s / C sum_c out_bc
    if (smooth) {
      for (std::int64_t c = 0; c < C; ++c) spread += row[c];
      spread *= per_class;
    }
    loss = valid
               ? (smooth ? s.m + log(s.sum) - on_label * row[label] - spread : s.m + log(s.sum) - row[label])
               : NAN;
    correct = valid && s.argmax == label ? 1.0f : 0.0f;
  }
};

// d loss_b / d out_bc = softmax(out_b)_c - (1 - s) [c == label_b] - s / C, times scale;
// with s = 0 the same floats as softmax - [c == label_b] (x - 0 is x).
struct CrossEntropyGrad {
  float scale, on_label, per_class;  // scale, scale (1 - s), scale s / C
  KOKKOS_INLINE_FUNCTION void operator()(const float* row, std::int64_t C, std::int32_t label,
                                         const SoftmaxRow& s, float* d) const {
    const float inv = scale / s.sum;
    for (std::int64_t c = 0; c < C; ++c)
      d[c] = exp(row[c] - s.m) * inv - (c == label ? on_label : 0.0f) - per_class;
  }
};

// One row's mean squared error over its C values; with d, also d_c = k (out_c - target_c).
// The sum is one fused multiply-add per value, written out: left to the compiler,
// `sum += diff * diff` became an FMA where the loop stayed scalar and a rounded
// product where it vectorised the loop (GCC 12, -march=native, AMD EPYC), and the
// fused kernel's losses differed from loss_forward's in the last bit.
KOKKOS_INLINE_FUNCTION float mse_row(const float* out, const float* target, std::int64_t C, float k = 0.0f,
                                     float* d = nullptr) {
  float sum = 0.0f;
  for (std::int64_t c = 0; c < C; ++c) {
    const float diff = out[c] - target[c];
    sum = fmaf(diff, diff, sum);
    if (d) d[c] = k * diff;
  }
  return sum / C;
}

// A sample's loss and hits as the mean over its rows (tokens): sums in double, in row
// order. One row: its own floats (double(l) / 1 rounds back to l).
struct PerSample {
  double loss = 0.0, correct = 0.0;
  KOKKOS_INLINE_FUNCTION void add(float l, float c) {
    loss += l;
    correct += c;
  }
  KOKKOS_INLINE_FUNCTION void put(std::int64_t rows, float& l, float& c) const {
    l = static_cast<float>(loss / double(rows));
    c = static_cast<float>(correct / double(rows));
  }
};

// The gradient's scale of one row: the sample's loss is the mean over its rows.
float row_scale(float scale, std::int64_t rows) {
  return rows == 1 ? scale : static_cast<float>(double(scale) / double(rows));
}

CrossEntropyLoss cross_entropy_loss(std::int64_t C, float smoothing) {
  return {1.0f - smoothing, smoothing / static_cast<float>(C), smoothing != 0.0f};
}

CrossEntropyGrad cross_entropy_grad(std::int64_t C, float scale, float smoothing) {
  return {scale, scale * (1.0f - smoothing), scale * smoothing / static_cast<float>(C)};
}

namespace {

// The rows of the three cross-entropy kernels: row i's loss and correct flag (l is
// left alone where it is not asked for: top_k_hits), and with a gradient, its row of
// dout.
struct RowLoss {
  ConstView1 o;
  LabelView labels;
  std::int64_t C;
  CrossEntropyLoss ce;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, float& l, float& c) const {
    const float* row = &o(i * C);
    ce(row, C, labels(i), softmax_row(row, C), l, c);
  }
};
struct RowLossGrad {
  ConstView1 o;
  LabelView labels;
  std::int64_t C;
  CrossEntropyLoss ce;
  CrossEntropyGrad grad;
  View1 d;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, float& l, float& c) const {
    const float* row = &o(i * C);
    const SoftmaxRow s = softmax_row(row, C);
    ce(row, C, labels(i), s, l, c);
    grad(row, C, labels(i), s, &d(i * C));
  }
};
struct RowHit {
  ConstView1 o;
  LabelView labels;
  std::int64_t C, k;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, float& /*l*/, float& c) const {
    const float* row = &o(i * C);
    const std::int32_t label = labels(i);
    bool hit = false;
    if (label >= 0 && label < C && row[label] == row[label]) {  // not NaN
      const float v = row[label];
      std::int64_t place = 0;
      for (std::int64_t j = 0; j < C; ++j) place += row[j] > v || (j < label && row[j] == v);
      hit = place < k;
    }
    c = hit ? 1.0f : 0.0f;
  }
};

// Each sample's loss and correct (loss may be empty: hits alone) from its rows' (B
// rows rows): one row, one thread a sample writes them. Rows (a language model's
// tokens): one thread a row puts its two floats into scratch (2 B rows floats: held
// by the caller, or allocated here for the call), and a second kernel adds each
// sample's in row order (PerSample), so that the work spreads over every token rather
// than one thread a sample (16 threads for GPT-2's batch, each walking 1024 rows of
// 50,304 logits); the same floats as a thread a sample adding its rows as it goes.
template <class Row>
void per_sample(const char* name, std::int64_t B, std::int64_t rows, const Row& row_fn, View1 loss,
                View1 correct, const View1& scratch) {
  const bool with_loss = loss.extent(0) > 0;
  if (rows == 1) {
    Kokkos::parallel_for(
        name, Range(0, B), KOKKOS_LAMBDA(std::int64_t b) {
          float l = 0.0f, c = 0.0f;
          row_fn(b, l, c);
          if (with_loss) loss(b) = l;
          correct(b) = c;
        });
    return;
  }
  const std::int64_t n = B * rows;
  View1 v = scratch.extent(0) >= std::size_t(2 * n)
                ? scratch
                : View1(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Loss::rows"), std::size_t(2 * n));
  Kokkos::parallel_for(
      name, Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        float l = 0.0f, c = 0.0f;
        row_fn(i, l, c);
        v(i) = l;
        v(n + i) = c;
      });
  Kokkos::parallel_for(
      "CrossEntropy::sample_means", Range(0, B), KOKKOS_LAMBDA(std::int64_t b) {
        PerSample mean;
        for (std::int64_t r = 0; r < rows; ++r) mean.add(v(b * rows + r), v(n + b * rows + r));
        float l, c;
        mean.put(rows, l, c);
        if (with_loss) loss(b) = l;
        correct(b) = c;
      });
}

}  // namespace

void loss_forward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets, View1 loss,
                  View1 correct, float smoothing, std::int64_t rows, const View1& row_scratch) {
  const std::int64_t B = out.batch();
  ConstView1 o = out.data;
  if (kind == LossKind::CrossEntropy) {
    const std::int64_t C = out.sample_numel() / rows;
    per_sample("CrossEntropy::forward", B, rows, RowLoss{o, labels, C, cross_entropy_loss(C, smoothing)},
               loss, correct, row_scratch);
  } else {
    const std::int64_t C = out.sample_numel();
    Kokkos::parallel_for(
        "MSE::forward", Range(0, B),
        KOKKOS_LAMBDA(std::int64_t b) { loss(b) = mse_row(&o(b * C), &targets(b * C), C); });
  }
}

void loss_backward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets,
                   float scale, Tensor& dout, float smoothing, std::int64_t rows) {
  const std::int64_t B = out.batch(), C = out.sample_numel();
  resize_like(dout, out, "Loss::dout");
  ConstView1 o = out.data;
  View1 d = dout.data;
  if (kind == LossKind::CrossEntropy) {
    const std::int64_t V = C / rows;
    const CrossEntropyGrad grad = cross_entropy_grad(V, row_scale(scale, rows), smoothing);
    Kokkos::parallel_for(
        "CrossEntropy::backward", Range(0, B * rows), KOKKOS_LAMBDA(std::int64_t i) {
          const float* row = &o(i * V);
          grad(row, V, labels(i), softmax_row(row, V), &d(i * V));
        });
  } else {
    // d loss_b / d out_bc = 2 (out_bc - target_bc) / C
    const float k = 2.0f * scale / C;
    Kokkos::parallel_for(
        "MSE::backward", Range(0, B * C), KOKKOS_LAMBDA(std::int64_t i) { d(i) = k * (o(i) - targets(i)); });
  }
}

void loss_forward_backward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets,
                           float scale, View1 loss, View1 correct, Tensor& dout, float smoothing,
                           std::int64_t rows, const View1& row_scratch) {
  const std::int64_t B = out.batch(), C = out.sample_numel();
  resize_like(dout, out, "Loss::dout");
  ConstView1 o = out.data;
  View1 d = dout.data;
  if (kind == LossKind::CrossEntropy) {
    const std::int64_t V = C / rows;
    const RowLossGrad row{o,
                          labels,
                          V,
                          cross_entropy_loss(V, smoothing),
                          cross_entropy_grad(V, row_scale(scale, rows), smoothing),
                          d};
    per_sample("CrossEntropy::forward_backward", B, rows, row, loss, correct, row_scratch);
  } else {
    const float k = 2.0f * scale / C;
    Kokkos::parallel_for(
        "MSE::forward_backward", Range(0, B),
        KOKKOS_LAMBDA(std::int64_t b) { loss(b) = mse_row(&o(b * C), &targets(b * C), C, k, &d(b * C)); });
  }
}

void top_k_hits(const Tensor& out, const LabelView& labels, std::int64_t k, View1 hits, std::int64_t rows,
                const View1& row_scratch) {
  const std::int64_t B = out.batch(), C = out.sample_numel() / rows;
  per_sample("CrossEntropy::top_k_hits", B, rows, RowHit{out.data, labels, C, k}, View1(), hits, row_scratch);
}

}  // namespace ddp
