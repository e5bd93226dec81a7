// Losses: values against hand-computed examples, gradients against central
// finite differences of scale * sum_b loss_b.

#include "model/loss.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "grad_check.hpp"

namespace ddp {
namespace {

using test::make_tensor;
using test::random_values;
using test::to_host;

LabelView make_labels(const std::vector<std::int32_t>& values) {
  LabelView labels("test::labels", values.size());
  auto labels_host = Kokkos::create_mirror_view(labels);
  for (std::size_t i = 0; i < values.size(); ++i) labels_host(i) = values[i];
  Kokkos::deep_copy(labels, labels_host);
  return labels;
}

TEST(CrossEntropy, HandComputedValues) {
  // Rows: logits (1, 2, 3) label 2 and label 0; a tie (1, 1) padded with -inf-ish
  // logits, where the first maximum wins; logits far apart (stability).
  Tensor out = make_tensor({4, 3}, {1, 2, 3, 1, 2, 3, 5, 5, -100, 1000, 0, 0});
  LabelView labels = make_labels({2, 0, 1, 1});
  View1 loss("test::loss", 4), correct("test::correct", 4);
  loss_forward(LossKind::CrossEntropy, out, labels, View1(), loss, correct);
  std::vector<float> l = to_host(loss, 4), c = to_host(correct, 4);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));  // 3.40760596
  EXPECT_NEAR(l[0], lse - 3, 1e-6);                                            // 0.40760596
  EXPECT_NEAR(l[1], lse - 1, 1e-6);                                            // 2.40760596
  EXPECT_NEAR(l[2], std::log(2.0), 1e-6);
  EXPECT_NEAR(l[3], 1000, 1e-3);
  EXPECT_EQ(c, (std::vector<float>{1, 0, 0, 0}));
}

// dout against central differences of scale * sum_b loss_b, at label smoothing s.
void expect_cross_entropy_gradient(const std::vector<std::int32_t>& label_values, std::uint64_t seed,
                                   float s) {
  const std::int64_t B = 4, C = 5;
  const float scale = 0.25f;
  Tensor out = make_tensor({B, C}, random_values(B * C, seed, -3.0f, 3.0f)), dout;
  LabelView labels = make_labels(label_values);
  View1 loss("test::loss", B), correct("test::correct", B);
  loss_backward(LossKind::CrossEntropy, out, labels, View1(), scale, dout, s);
  ASSERT_EQ(dout.shape, out.shape);
  auto f = [&]() {
    loss_forward(LossKind::CrossEntropy, out, labels, View1(), loss, correct, s);
    double sum = 0;
    for (float v : to_host(loss, B)) sum += v;
    return scale * sum;
  };
  test::expect_close(to_host(dout.data, B * C), test::numeric_gradient(out.data, B * C, 1e-2, f), "dout",
                     1e-2, 1e-4);
}

TEST(CrossEntropy, GradientCheck) { expect_cross_entropy_gradient({0, 4, 2, 2}, 21, 0.0f); }

// label_smoothing = s: PyTorch's target (1 - s) one-hot + s / C, written out in
// double: loss = lse - (1 - s) x_label - s / C sum_c x_c.
TEST(CrossEntropy, LabelSmoothingByHand) {
  Tensor out = make_tensor({2, 3}, {1, 2, 3, 0.5f, -1, 2});
  LabelView labels = make_labels({2, 0});
  View1 loss("test::loss", 2), correct("test::correct", 2);
  const double s = 0.1;
  loss_forward(LossKind::CrossEntropy, out, labels, View1(), loss, correct, static_cast<float>(s));
  std::vector<float> l = to_host(loss, 2);
  const double lse0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  const double lse1 = std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(2.0));
  EXPECT_NEAR(l[0], lse0 - (1 - s) * 3 - s / 3 * 6, 1e-6);
  EXPECT_NEAR(l[1], lse1 - (1 - s) * 0.5 - s / 3 * 1.5, 1e-6);
}

TEST(CrossEntropy, LabelSmoothingGradientCheck) { expect_cross_entropy_gradient({1, 4, 0, 3}, 22, 0.2f); }

// Smoothing 0 is the unsmoothed loss to the bit, forward and backward.
TEST(CrossEntropy, ZeroSmoothingIsBitwiseUnsmoothed) {
  const std::int64_t B = 6, C = 7;
  Tensor out = make_tensor({B, C}, random_values(B * C, 23, -4.0f, 4.0f)), d0, d1;
  LabelView labels = make_labels({0, 6, 2, 3, 3, 1});
  View1 l0("test::l0", B), l1("test::l1", B), correct("test::correct", B);
  loss_forward(LossKind::CrossEntropy, out, labels, View1(), l0, correct);
  loss_forward(LossKind::CrossEntropy, out, labels, View1(), l1, correct, 0.0f);
  EXPECT_EQ(to_host(l0, B), to_host(l1, B));
  loss_backward(LossKind::CrossEntropy, out, labels, View1(), 0.125f, d0);
  loss_backward(LossKind::CrossEntropy, out, labels, View1(), 0.125f, d1, 0.0f);
  EXPECT_EQ(to_host(d0.data, B * C), to_host(d1.data, B * C));
}

TEST(MSE, HandComputedValues) {
  Tensor out = make_tensor({2, 2}, {1, 2, 0, 0});
  View1 targets("test::targets", 4);
  test::from_host(targets, {0, 0, 3, -1});
  View1 loss("test::loss", 2);
  loss_forward(LossKind::MSE, out, LabelView(), targets, loss, View1());
  EXPECT_EQ(to_host(loss, 2), (std::vector<float>{2.5f, 5.0f}));  // (1+4)/2, (9+1)/2
}

TEST(MSE, GradientCheck) {
  const std::int64_t B = 3, C = 4;
  const float scale = 1.0f / 3;
  Tensor out = make_tensor({B, C}, random_values(B * C, 31)), dout;
  View1 targets("test::targets", B * C);
  test::from_host(targets, random_values(B * C, 32));
  View1 loss("test::loss", B);
  loss_backward(LossKind::MSE, out, LabelView(), targets, scale, dout);
  auto f = [&]() {
    loss_forward(LossKind::MSE, out, LabelView(), targets, loss, View1());
    double s = 0;
    for (float v : to_host(loss, B)) s += v;
    return scale * s;
  };
  test::expect_close(to_host(dout.data, B * C), test::numeric_gradient(out.data, B * C, 1e-2, f), "dout",
                     1e-2, 1e-4);
}

// The training step's one kernel gives the floats of the two separate ones: loss,
// correct and gradient, with and without smoothing, an invalid label included
// (NaN loss), and MSE.
TEST(LossForwardBackward, BitwiseTheSeparateKernels) {
  const std::int64_t B = 6, C = 7;
  Tensor out = make_tensor({B, C}, random_values(B * C, 24, -4.0f, 4.0f));
  LabelView labels = make_labels({0, 6, 2, -1, 3, 1});
  for (float s : {0.0f, 0.1f}) {
    View1 l0("test::l0", B), l1("test::l1", B), c0("test::c0", B), c1("test::c1", B);
    Tensor d0, d1;
    loss_forward(LossKind::CrossEntropy, out, labels, View1(), l0, c0, s);
    loss_backward(LossKind::CrossEntropy, out, labels, View1(), 0.375f, d0, s);
    loss_forward_backward(LossKind::CrossEntropy, out, labels, View1(), 0.375f, l1, c1, d1, s);
    const std::vector<float> a = to_host(l0, B), b = to_host(l1, B);
    ASSERT_TRUE(std::isnan(a[3]) && std::isnan(b[3])) << "smoothing " << s;
    for (std::int64_t i = 0; i < B; ++i)
      if (i != 3) {
        EXPECT_EQ(a[i], b[i]) << "loss " << i << ", smoothing " << s;
      }
    EXPECT_EQ(to_host(c0, B), to_host(c1, B)) << "smoothing " << s;
    EXPECT_EQ(to_host(d0.data, B * C), to_host(d1.data, B * C)) << "smoothing " << s;
  }
  View1 targets("test::targets", B * C), l0("test::l0", B), l1("test::l1", B);
  test::from_host(targets, random_values(B * C, 25));
  Tensor d0, d1;
  loss_forward(LossKind::MSE, out, LabelView(), targets, l0, View1());
  loss_backward(LossKind::MSE, out, LabelView(), targets, 0.25f, d0);
  loss_forward_backward(LossKind::MSE, out, LabelView(), targets, 0.25f, l1, View1(), d1);
  EXPECT_EQ(to_host(l0, B), to_host(l1, B));
  EXPECT_EQ(to_host(d0.data, B * C), to_host(d1.data, B * C));
}

// A language model's loss: (B, T, V) logits and a label a token. A sample's loss,
// correct and top-k hits are the means over its T rows of what each row gives as a
// sample of its own; its gradient is each row's at scale / T (the mean over B T tokens,
// as F.cross_entropy over (B T, V)); the fused kernel gives the separate ones' floats.
TEST(CrossEntropy, TokenRowsAreTheMeanOverTheSample) {
  const std::int64_t B = 3, T = 4, V = 6;
  const std::vector<float> logits = random_values(B * T * V, 31, -3.0f, 3.0f);
  const std::vector<std::int32_t> ids = {0, 5, 2, 2, 1, 3, 4, 0, 5, 5, 1, 2};
  const LabelView labels = make_labels(ids);
  const float scale = 0.5f;
  // Each row as a sample of its own.
  Tensor rows = make_tensor({B * T, V}, logits), drows;
  View1 lr("test::lr", B * T), cr("test::cr", B * T), hr("test::hr", B * T);
  loss_forward(LossKind::CrossEntropy, rows, labels, View1(), lr, cr);
  top_k_hits(rows, labels, 2, hr);
  loss_backward(LossKind::CrossEntropy, rows, labels, View1(), scale / T, drows);
  // As token rows of B samples.
  Tensor out = make_tensor({B, T, V}, logits), d0, d1;
  View1 l0("test::l0", B), c0("test::c0", B), h0("test::h0", B), l1("test::l1", B), c1("test::c1", B);
  loss_forward(LossKind::CrossEntropy, out, labels, View1(), l0, c0, 0.0f, T);
  top_k_hits(out, labels, 2, h0, T);
  loss_backward(LossKind::CrossEntropy, out, labels, View1(), scale, d0, 0.0f, T);
  loss_forward_backward(LossKind::CrossEntropy, out, labels, View1(), scale, l1, c1, d1, 0.0f, T);
  const std::vector<float> per_row = to_host(lr, B * T), c_row = to_host(cr, B * T),
                           h_row = to_host(hr, B * T);
  const std::vector<float> l = to_host(l0, B), c = to_host(c0, B), h = to_host(h0, B);
  for (std::int64_t b = 0; b < B; ++b) {
    double sl = 0, sc = 0, sh = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      sl += per_row[b * T + t];
      sc += c_row[b * T + t];
      sh += h_row[b * T + t];
    }
    EXPECT_EQ(l[b], static_cast<float>(sl / T)) << "sample " << b;
    EXPECT_EQ(c[b], static_cast<float>(sc / T)) << "sample " << b;
    EXPECT_EQ(h[b], static_cast<float>(sh / T)) << "sample " << b;
  }
  EXPECT_EQ(to_host(d0.data, B * T * V), to_host(drows.data, B * T * V));
  EXPECT_EQ(to_host(l1, B), l);
  EXPECT_EQ(to_host(c1, B), c);
  EXPECT_EQ(to_host(d1.data, B * T * V), to_host(d0.data, B * T * V));
  // Through the caller's scratch (the trainer's: none is allocated then): the same
  // floats, and the rows' own values in it on their way to the means.
  View1 scratch("test::scratch", 2 * B * T), l2("test::l2", B), c2("test::c2", B), h2("test::h2", B);
  Tensor d2;
  loss_forward_backward(LossKind::CrossEntropy, out, labels, View1(), scale, l2, c2, d2, 0.0f, T, scratch);
  EXPECT_EQ(to_host(l2, B), l);
  EXPECT_EQ(to_host(c2, B), c);
  EXPECT_EQ(to_host(d2.data, B * T * V), to_host(d0.data, B * T * V));
  const std::vector<float> through = to_host(scratch, 2 * B * T);
  EXPECT_EQ(std::vector<float>(through.begin(), through.begin() + B * T), per_row);
  EXPECT_EQ(std::vector<float>(through.begin() + B * T, through.end()), c_row);
  top_k_hits(out, labels, 2, h2, T, scratch);
  EXPECT_EQ(to_host(h2, B), h);
}

// The GPU's way of reading token rows (lanes: L threads a row, merged in lane order)
// against a thread a row, at lane counts from 1 to more than the row holds, with and
// without smoothing, on rows with ties: the loss and gradient within float rounding
// of the other order of sums, correct and top-k hits exactly (the first maximum wins
// a tie in any lane order), the same floats run to run, a NaN logit a NaN loss.
TEST(CrossEntropy, RowsInLanesAreRowsAThreadEach) {
  const std::int64_t B = 3, T = 5;
  for (const std::int64_t V : {7, 50, 300}) {
    std::vector<float> logits = random_values(B * T * V, 41, -6.0f, 6.0f);
    for (std::int64_t i = 0; i < B * T * V; i += 3) logits[i] = std::floor(logits[i]);  // ties
    for (std::int64_t c = 0; c < V; ++c) logits[2 * V + c] = logits[2 * V];             // one row all equal
    std::vector<std::int32_t> ids;
    for (std::int64_t i = 0; i < B * T; ++i) ids.push_back(std::int32_t((i * 5 + 3) % V));
    const LabelView labels = make_labels(ids);
    const Tensor out = make_tensor({B, T, V}, logits);
    for (const float s : {0.0f, 0.1f}) {
      View1 l0("test::l0", B), c0("test::c0", B), h0("test::h0", B), f0("test::f0", B), k0("test::k0", B);
      Tensor d0;
      loss_forward_backward(LossKind::CrossEntropy, out, labels, View1(), 0.25f, l0, c0, d0, s, T, {}, 0);
      loss_forward(LossKind::CrossEntropy, out, labels, View1(), f0, k0, s, T, {}, 0);
      top_k_hits(out, labels, 5, h0, T, {}, 0);
      const std::vector<float> loss0 = to_host(l0, B), grad0 = to_host(d0.data, B * T * V);
      for (const std::int64_t L : {1, 2, 3, 7, 32, 128, 400}) {
        SCOPED_TRACE("V " + std::to_string(V) + ", smoothing " + std::to_string(s) + ", lanes " +
                     std::to_string(L));
        View1 scratch("test::scratch", row_scratch_floats(B, T, V, L));
        View1 l1("test::l1", B), c1("test::c1", B), h1("test::h1", B), f1("test::f1", B), k1("test::k1", B);
        Tensor d1, d2;
        loss_forward_backward(LossKind::CrossEntropy, out, labels, View1(), 0.25f, l1, c1, d1, s, T, scratch,
                              L);
        loss_forward(LossKind::CrossEntropy, out, labels, View1(), f1, k1, s, T, scratch, L);
        top_k_hits(out, labels, 5, h1, T, scratch, L);
        const std::vector<float> loss1 = to_host(l1, B), grad1 = to_host(d1.data, B * T * V);
        for (std::int64_t b = 0; b < B; ++b) EXPECT_NEAR(loss1[b], loss0[b], 2e-6 * std::fabs(loss0[b]));
        EXPECT_EQ(to_host(f1, B), loss1);
        for (std::int64_t i = 0; i < B * T * V; ++i) ASSERT_NEAR(grad1[i], grad0[i], 1e-7) << "logit " << i;
        EXPECT_EQ(to_host(c1, B), to_host(c0, B));
        EXPECT_EQ(to_host(k1, B), to_host(c0, B));
        EXPECT_EQ(to_host(h1, B), to_host(h0, B));
        // Run to run: the same floats.
        loss_forward_backward(LossKind::CrossEntropy, out, labels, View1(), 0.25f, l1, c1, d2, s, T, scratch,
                              L);
        EXPECT_EQ(to_host(l1, B), loss1);
        EXPECT_EQ(to_host(d2.data, B * T * V), grad1);
      }
    }
    // -inf logits (a masked vocabulary), two or more to a lane, its first ones among
    // them: finite losses and gradients, as a thread a row's.
    std::vector<float> masked = logits;
    for (const std::int64_t c : {0, 1, 2, 3, 6, 7, 14, 21, 32, 64})
      if (c < V && c != ids[T]) masked[T * V + c] = -INFINITY;  // sample 1, row 0
    const Tensor out_masked = make_tensor({B, T, V}, masked);
    View1 lm0("test::lm0", B), cm0("test::cm0", B);
    Tensor dm0;
    loss_forward_backward(LossKind::CrossEntropy, out_masked, labels, View1(), 1.0f, lm0, cm0, dm0, 0.0f, T,
                          {}, 0);
    const std::vector<float> masked_loss = to_host(lm0, B), masked_grad = to_host(dm0.data, B * T * V);
    ASSERT_TRUE(std::isfinite(masked_loss[1]));
    for (const std::int64_t L : {1, 2, 3, 7, 32}) {
      View1 l("test::l", B), c("test::c", B);
      Tensor dm;
      loss_forward_backward(LossKind::CrossEntropy, out_masked, labels, View1(), 1.0f, l, c, dm, 0.0f, T, {},
                            L);
      const std::vector<float> lh = to_host(l, B), gh = to_host(dm.data, B * T * V);
      for (std::int64_t b = 0; b < B; ++b)
        EXPECT_NEAR(lh[b], masked_loss[b], 2e-6 * std::fabs(masked_loss[b])) << "-inf logits, lanes " << L;
      for (std::int64_t i = 0; i < B * T * V; ++i)
        ASSERT_NEAR(gh[i], masked_grad[i], 1e-7) << "-inf logits, lanes " << L << ", logit " << i;
    }
    // A NaN anywhere in a row (first in a lane, or later) makes its sample's loss NaN.
    for (const std::int64_t at : {std::int64_t(0), V / 2, V - 1}) {
      std::vector<float> bad = logits;
      bad[T * V + at] = NAN;  // sample 1, row 0
      const Tensor out_bad = make_tensor({B, T, V}, bad);
      View1 l("test::l", B), c("test::c", B);
      loss_forward(LossKind::CrossEntropy, out_bad, labels, View1(), l, c, 0.0f, T, {}, 7);
      const std::vector<float> lh = to_host(l, B);
      EXPECT_FALSE(std::isnan(lh[0]));
      EXPECT_TRUE(std::isnan(lh[1])) << "NaN at logit " << at << " of " << V;
      EXPECT_FALSE(std::isnan(lh[2]));
    }
  }
  // The build's choice: a thread a row on the host; on the GPU whole warps, 0 for short rows.
  EXPECT_EQ(row_lanes(50304) == 0,
            bool(Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible));
  EXPECT_EQ(row_lanes(100), 0);
  EXPECT_EQ(row_scratch_floats(4, 1, 50304), 0u);
}

// Top-k hits by hand: places 0..6 of one row for k = 1, 2, 5; a tie goes to the lower
// index; a label outside [0, C) and a NaN logit on the label are no hit.
TEST(TopK, HandComputedHits) {
  const std::vector<float> row = {0.5f, 3, 2, 5, 1, 4, -1};  // classes by place: 3 5 1 2 4 0 6
  std::vector<float> rows;
  for (int i = 0; i < 7; ++i) rows.insert(rows.end(), row.begin(), row.end());
  rows.insert(rows.end(), {1, 2, 2, 0, 0, 0, 0});    // tie: 1 before 2
  rows.insert(rows.end(), row.begin(), row.end());   // label 7: outside
  rows.insert(rows.end(), {1, NAN, 0, 0, 0, 0, 0});  // NaN on the label
  Tensor out = make_tensor({10, 7}, rows);
  LabelView labels = make_labels({3, 5, 1, 2, 4, 0, 6, 2, 7, 1});
  View1 hits("test::hits", 10);
  top_k_hits(out, labels, 1, hits);
  EXPECT_EQ(to_host(hits, 10), (std::vector<float>{1, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  top_k_hits(out, labels, 2, hits);
  EXPECT_EQ(to_host(hits, 10), (std::vector<float>{1, 1, 0, 0, 0, 0, 0, 1, 0, 0}));
  top_k_hits(out, labels, 5, hits);
  EXPECT_EQ(to_host(hits, 10), (std::vector<float>{1, 1, 1, 1, 1, 0, 0, 1, 0, 0}));
}

// Against a stable sort of each row (value descending, index ascending) on logits
// with many ties, for k = 1..C; k = 1 is loss_forward's correct.
TEST(TopK, SortedRowsAndCorrect) {
  const std::int64_t B = 64, C = 10;
  std::vector<float> values = random_values(B * C, 26, 0.0f, 4.0f);
  for (float& v : values) v = std::floor(v);  // 4 values: ties everywhere
  Tensor out = make_tensor({B, C}, values);
  std::vector<std::int32_t> label_values;
  for (std::int64_t b = 0; b < B; ++b) label_values.push_back(std::int32_t((b * 7) % C));
  LabelView labels = make_labels(label_values);
  View1 hits("test::hits", B), loss("test::loss", B), correct("test::correct", B);
  for (std::int64_t k = 1; k <= C; ++k) {
    top_k_hits(out, labels, k, hits);
    const std::vector<float> h = to_host(hits, B);
    for (std::int64_t b = 0; b < B; ++b) {
      std::vector<std::int64_t> order(C);
      for (std::int64_t c = 0; c < C; ++c) order[c] = c;
      std::stable_sort(order.begin(), order.end(),
                       [&](std::int64_t i, std::int64_t j) { return values[b * C + i] > values[b * C + j]; });
      const bool expected =
          std::find(order.begin(), order.begin() + k, std::int64_t(label_values[b])) != order.begin() + k;
      EXPECT_EQ(h[b], expected ? 1.0f : 0.0f) << "sample " << b << ", k " << k;
    }
  }
  top_k_hits(out, labels, 1, hits);
  loss_forward(LossKind::CrossEntropy, out, labels, View1(), loss, correct);
  EXPECT_EQ(to_host(hits, B), to_host(correct, B));
}

}  // namespace
}  // namespace ddp
