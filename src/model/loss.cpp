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
    float row_sum = 0.0f;  // times s / C: sum_c out_bc's share of the loss
    if (smooth)
      for (std::int64_t c = 0; c < C; ++c) row_sum += row[c];
    finish(row, C, label, s, row_sum, loss, correct);
  }
  // row_sum: sum_c row_c, used where smoothing.
  KOKKOS_INLINE_FUNCTION void finish(const float* row, std::int64_t C, std::int32_t label,
                                     const SoftmaxRow& s, float row_sum, float& loss, float& correct) const {
    const bool valid = label >= 0 && label < C;
    const float spread = row_sum * per_class;
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
    for (std::int64_t c = 0; c < C; ++c) d[c] = at(row[c], c, label, s.m, inv);
  }
  // One logit's: x = out_bc, m the row's maximum, inv = scale / sum_c exp(out_bc - m).
  KOKKOS_INLINE_FUNCTION float at(float x, std::int64_t c, std::int32_t label, float m, float inv) const {
    return exp(x - m) * inv - (c == label ? on_label : 0.0f) - per_class;
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

// The caller's scratch where it holds the floats, else a buffer for the call.
View1 scratch_for(const View1& scratch, std::size_t floats) {
  return scratch.extent(0) >= floats
             ? scratch
             : View1(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Loss::rows"), floats);
}

// Each sample's loss and correct from its rows' in v (v(i), v(n + i), n = B rows): a
// thread a sample adds its rows' in row order (PerSample).
void sample_means(std::int64_t B, std::int64_t rows, const View1& v, View1 loss, View1 correct) {
  const bool with_loss = loss.extent(0) > 0;
  const std::int64_t n = B * rows;
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

// Each sample's loss and correct (loss may be empty: hits alone) from its rows' (B
// rows rows): one row, one thread a sample writes them. Rows (a language model's
// tokens): one thread a row puts its two floats into scratch (2 B rows floats: held
// by the caller, or allocated here for the call), and sample_means adds each sample's,
// so that the work spreads over every token rather than one thread a sample (16
// threads for GPT-2's batch); the same floats as a thread a sample adding its rows as
// it goes.
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
  const View1 v = scratch_for(scratch, std::size_t(2 * n));
  Kokkos::parallel_for(
      name, Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        float l = 0.0f, c = 0.0f;
        row_fn(i, l, c);
        v(i) = l;
        v(n + i) = c;
      });
  sample_means(B, rows, v, loss, correct);
}

// The rows in lanes (lanes L > 0, rows > 1: the GPU's way). A thread a row walks its
// row alone: at GPT-2's vocabulary a warp's 32 threads read 32 rows 200 KB apart, and
// 16,384 threads are too few to hide that. Here L neighbouring threads share a row,
// lane j reading logits j, j + L, ... (a warp reads 32 neighbouring floats), a thread
// a row merges the lanes' statistics in lane order, and the gradient is a thread a
// logit. The formulas are a thread a row's, the sums in another order (the online
// softmax's, rescaled as the maximum grows): other last bits, in an order fixed by L,
// so the same floats run to run. top-k's places are counts: a thread a row's exactly.
//
// The scratch (row_scratch_floats): v(i), v(n + i) the rows' loss and correct, as
// per_sample's; each row's maximum and exp sum (v(2 n + i), v(3 n + i)); from 4 n the
// lanes' (t = i L + j) maximum, exp sum, plain sum and first maximum's index (a float:
// exact below 2^24 logits), 4 n L, or their top-k counts, n L.

// Softmax statistics of some of a row's logits, added in increasing c: the first
// maximum's index (argmax < 0: none yet) and value m, s = sum exp(x - m) (rescaled as
// m grows) and the plain sum (label smoothing's). A NaN makes s NaN, as softmax_row's.
// e(a, b) = exp(a - b), 1 where a == b: a lane's -inf logits under its maximum -inf
// add 1 each (exp(-inf + inf) would be NaN), and weigh 0 once a finite maximum comes,
// as in softmax_row, whose maximum is the row's.
struct OnlineSoftmax {
  float m = 0.0f, s = 0.0f, sum = 0.0f;
  std::int64_t argmax = -1;
  static KOKKOS_INLINE_FUNCTION float e(float a, float b) { return a == b ? 1.0f : exp(a - b); }
  KOKKOS_INLINE_FUNCTION void add(float x, std::int64_t c) {
    sum += x;
    if (argmax < 0) {
      m = x;
      s = 1.0f;
      argmax = c;
    } else if (x > m) {
      s = s * e(m, x) + 1.0f;
      m = x;
      argmax = c;
    } else {
      s += e(x, m);
    }
  }
  // Another lane's: the greater maximum wins, a tie goes to the lower index.
  KOKKOS_INLINE_FUNCTION void merge(const OnlineSoftmax& o) {
    if (o.argmax < 0) return;
    if (argmax < 0) {
      *this = o;
      return;
    }
    sum += o.sum;
    if (o.m > m || (o.m == m && o.argmax < argmax)) {
      s = s * e(m, o.m) + o.s;
      m = o.m;
      argmax = o.argmax;
    } else {
      s += o.s * e(o.m, m);
    }
  }
};

// The rows' cross-entropy in lanes: loss and correct into the scratch, then the
// samples' means; with grad, the gradient into d (n = B rows rows of C).
void cross_entropy_lanes(const char* name, std::int64_t B, std::int64_t rows, std::int64_t C, std::int64_t L,
                         const ConstView1& o, const LabelView& labels, const CrossEntropyLoss& ce,
                         const CrossEntropyGrad* grad, const View1& d, View1 loss, View1 correct,
                         const View1& scratch) {
  const std::int64_t n = B * rows, nL = n * L;
  const View1 v = scratch_for(scratch, row_scratch_floats(B, rows, C, L));
  Kokkos::parallel_for(
      name, Range(0, nL), KOKKOS_LAMBDA(std::int64_t t) {
        const std::int64_t i = t / L, j = t % L;
        const float* row = &o(i * C);
        OnlineSoftmax st;
        for (std::int64_t c = j; c < C; c += L) st.add(row[c], c);
        v(4 * n + t) = st.m;
        v(4 * n + nL + t) = st.s;
        v(4 * n + 2 * nL + t) = st.sum;
        v(4 * n + 3 * nL + t) = static_cast<float>(st.argmax);
      });
  Kokkos::parallel_for(
      "CrossEntropy::merge_lanes", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        OnlineSoftmax st;
        for (std::int64_t t = i * L; t < (i + 1) * L; ++t) {
          OnlineSoftmax lane;
          lane.m = v(4 * n + t);
          lane.s = v(4 * n + nL + t);
          lane.sum = v(4 * n + 2 * nL + t);
          lane.argmax = static_cast<std::int64_t>(v(4 * n + 3 * nL + t));
          st.merge(lane);
        }
        float l, c;
        ce.finish(&o(i * C), C, labels(i), SoftmaxRow{st.argmax, st.m, st.s}, st.sum, l, c);
        v(i) = l;
        v(n + i) = c;
        v(2 * n + i) = st.m;
        v(3 * n + i) = st.s;
      });
  if (grad) {
    const CrossEntropyGrad g = *grad;
    Kokkos::parallel_for(
        "CrossEntropy::gradient", rows_range(n, C), KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) {
          d(i * C + c) = g.at(o(i * C + c), c, labels(i), v(2 * n + i), g.scale / v(3 * n + i));
        });
  }
  sample_means(B, rows, v, loss, correct);
}

// Top-k hits in lanes: each lane counts the logits placed before the label among its
// own, a thread a row adds the counts in lane order (exact: integers in floats).
void top_k_lanes(std::int64_t B, std::int64_t rows, std::int64_t C, std::int64_t L, const ConstView1& o,
                 const LabelView& labels, std::int64_t k, View1 hits, const View1& scratch) {
  const std::int64_t n = B * rows;
  const View1 v = scratch_for(scratch, row_scratch_floats(B, rows, C, L));
  Kokkos::parallel_for(
      "CrossEntropy::top_k_hits", Range(0, n * L), KOKKOS_LAMBDA(std::int64_t t) {
        const std::int64_t i = t / L, j0 = t % L;
        const float* row = &o(i * C);
        const std::int32_t label = labels(i);
        std::int64_t place = 0;
        if (label >= 0 && label < C) {
          const float x = row[label];
          for (std::int64_t j = j0; j < C; j += L) place += row[j] > x || (j < label && row[j] == x);
        }
        v(4 * n + t) = static_cast<float>(place);
      });
  Kokkos::parallel_for(
      "CrossEntropy::top_k_merge", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int32_t label = labels(i);
        bool hit = false;
        if (label >= 0 && label < C && o(i * C + label) == o(i * C + label)) {  // not NaN
          std::int64_t place = 0;
          for (std::int64_t t = i * L; t < (i + 1) * L; ++t) place += static_cast<std::int64_t>(v(4 * n + t));
          hit = place < k;
        }
        v(i) = 0.0f;  // no loss, but sample_means reads it
        v(n + i) = hit ? 1.0f : 0.0f;
      });
  sample_means(B, rows, v, View1(), hits);
}

// The lanes a call takes: the caller's, else the build's; none for one row a sample or
// where an index would not be exact in a float.
std::int64_t lanes_for(std::int64_t rows, std::int64_t C, std::int64_t lanes) {
  if (rows == 1 || C >= (std::int64_t(1) << 24)) return 0;
  return lanes >= 0 ? lanes : row_lanes(C);
}

}  // namespace

std::int64_t row_lanes(std::int64_t C) {
  if (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) return 0;
  std::int64_t L = 128;  // whole warps, at least 16 logits a lane; shorter rows a thread each
  while (L > 32 && 16 * L > C) L /= 2;
  return 16 * L > C ? 0 : L;
}

std::size_t row_scratch_floats(std::int64_t B, std::int64_t rows, std::int64_t C, std::int64_t lanes) {
  if (rows == 1) return 0;
  const std::int64_t L = lanes_for(rows, C, lanes);
  return std::size_t(B * rows * (L > 0 ? 4 + 4 * L : 2));
}

void loss_forward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets, View1 loss,
                  View1 correct, float smoothing, std::int64_t rows, const View1& row_scratch,
                  std::int64_t lanes) {
  const std::int64_t B = out.batch();
  ConstView1 o = out.data;
  if (kind == LossKind::CrossEntropy) {
    const std::int64_t C = out.sample_numel() / rows, L = lanes_for(rows, C, lanes);
    if (L > 0)
      cross_entropy_lanes("CrossEntropy::forward", B, rows, C, L, o, labels, cross_entropy_loss(C, smoothing),
                          nullptr, View1(), loss, correct, row_scratch);
    else
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
                           std::int64_t rows, const View1& row_scratch, std::int64_t lanes) {
  const std::int64_t B = out.batch(), C = out.sample_numel();
  resize_like(dout, out, "Loss::dout");
  ConstView1 o = out.data;
  View1 d = dout.data;
  if (kind == LossKind::CrossEntropy) {
    const std::int64_t V = C / rows, L = lanes_for(rows, V, lanes);
    const RowLossGrad row{o,
                          labels,
                          V,
                          cross_entropy_loss(V, smoothing),
                          cross_entropy_grad(V, row_scale(scale, rows), smoothing),
                          d};
    if (L > 0)
      cross_entropy_lanes("CrossEntropy::forward_backward", B, rows, V, L, o, labels, row.ce, &row.grad, d,
                          loss, correct, row_scratch);
    else
      per_sample("CrossEntropy::forward_backward", B, rows, row, loss, correct, row_scratch);
  } else {
    const float k = 2.0f * scale / C;
    Kokkos::parallel_for(
        "MSE::forward_backward", Range(0, B),
        KOKKOS_LAMBDA(std::int64_t b) { loss(b) = mse_row(&o(b * C), &targets(b * C), C, k, &d(b * C)); });
  }
}

void top_k_hits(const Tensor& out, const LabelView& labels, std::int64_t k, View1 hits, std::int64_t rows,
                const View1& row_scratch, std::int64_t lanes) {
  const std::int64_t B = out.batch(), C = out.sample_numel() / rows, L = lanes_for(rows, C, lanes);
  if (L > 0)
    top_k_lanes(B, rows, C, L, out.data, labels, k, hits, row_scratch);
  else
    per_sample("CrossEntropy::top_k_hits", B, rows, RowHit{out.data, labels, C, k}, View1(), hits,
               row_scratch);
}

}  // namespace ddp
