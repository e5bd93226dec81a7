#include "model/pool.hpp"

#include "comm/check.hpp"

namespace ddp {

Shape Pool2d::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 3)
    throw InputError(kind() + " needs an image input (channels, height, width) but gets " +
                     shape_str(in_sample));
  c_ = in_sample[0];
  h_ = in_sample[1];
  w_ = in_sample[2];
  if (h_ < k_ || w_ < k_)
    throw InputError("kernel " + std::to_string(k_) + " is larger than the input " + shape_str(in_sample));
  ho_ = (h_ - k_) / stride_ + 1;
  wo_ = (w_ - k_) / stride_ + 1;
  in_sample_ = in_sample;
  out_sample_ = {c_, ho_, wo_};
  return out_sample_;
}

namespace {
// (plane, row, column) iterations without integer division per element.
using Range2 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>;
using Range3 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>;
}  // namespace

// x: (B, C, H, W) -> y: (B, C, Ho, Wo); one thread per output element.
void Pool2d::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  const std::int64_t B = x.batch(), H = h_, W = w_, Ho = ho_, Wo = wo_, k = k_, s = stride_;
  resize(y, B, out_sample_, op_ == Max ? "MaxPool::y" : "AvgPool::y");
  ConstView1 xv = x.data;
  View1 yv = y.data;
  const std::int64_t planes = B * c_, n = planes * Ho * Wo;
  if (n == 0) return;
  // One thread per output row: the inner loop walks the row with no index arithmetic.
  const Range2 rows({0, 0}, {planes, Ho});
  if (op_ == Max) {
    if (static_cast<std::int64_t>(argmax_.extent(0)) < n)
      argmax_ =
          Kokkos::View<std::int32_t*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "MaxPool::argmax"), n);
    auto am = argmax_;
    Kokkos::parallel_for(
        "MaxPool::forward", rows, KOKKOS_LAMBDA(std::int64_t p, std::int64_t i) {
          const float* xp = xv.data() + p * H * W;
          float* yp = yv.data() + (p * Ho + i) * Wo;
          std::int32_t* ap = am.data() + (p * Ho + i) * Wo;
          for (std::int64_t j = 0; j < Wo; ++j) {
            std::int64_t best = i * s * W + j * s;
            float m = xp[best];
            for (std::int64_t di = 0; di < k; ++di)
              for (std::int64_t dj = 0; dj < k; ++dj) {
                const std::int64_t at = (i * s + di) * W + j * s + dj;
                const float v = xp[at];
                // First max wins; NaN wins, as in PyTorch. Selects, not branches:
                // which element wins is data, and a branch on it mispredicts.
                const bool take = v > m || v != v;
                best = take ? at : best;
                m = take ? v : m;
              }
            yp[j] = m;
            ap[j] = static_cast<std::int32_t>(best);
          }
        });
  } else {
    const float inv = 1.0f / static_cast<float>(k * k);
    Kokkos::parallel_for(
        "AvgPool::forward", rows, KOKKOS_LAMBDA(std::int64_t p, std::int64_t i) {
          const float* xp = xv.data() + p * H * W;
          float* yp = yv.data() + (p * Ho + i) * Wo;
          for (std::int64_t j = 0; j < Wo; ++j) {
            float sum = 0.0f;
            for (std::int64_t di = 0; di < k; ++di)
              for (std::int64_t dj = 0; dj < k; ++dj) sum += xp[(i * s + di) * W + j * s + dj];
            yp[j] = sum * inv;
          }
        });
  }
}

// dy: (B, C, Ho, Wo) -> dx: (B, C, H, W). Windows that do not overlap (stride >= k,
// the usual case): max scatters each output's gradient to its argmax. Otherwise one
// thread per input element gathers from the windows that contain it, so
// overlapping windows need no atomics.
void Pool2d::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  if (!needs_input_grad()) return;
  const std::int64_t B = x.batch(), H = h_, W = w_, Ho = ho_, Wo = wo_, k = k_, s = stride_;
  resize(dx, B, in_sample_, op_ == Max ? "MaxPool::dx" : "AvgPool::dx");
  const std::int64_t planes = B * c_;
  if (planes == 0) return;
  ConstView1 dyv = dy.data;
  View1 dxv = dx.data;
  const bool is_max = op_ == Max;
  const float inv = 1.0f / static_cast<float>(k * k);
  auto am = argmax_;
  if (is_max && s >= k) {
    Kokkos::deep_copy(Kokkos::subview(dxv, Kokkos::make_pair(std::int64_t(0), planes * H * W)), 0.0f);
    Kokkos::parallel_for(
        "MaxPool::backward", Range3({0, 0, 0}, {planes, Ho, Wo}),
        KOKKOS_LAMBDA(std::int64_t p, std::int64_t i, std::int64_t j) {
          const std::int64_t o = (p * Ho + i) * Wo + j;
          dxv(p * H * W + am(o)) = dyv(o);
        });
    return;
  }
  Kokkos::parallel_for(
      is_max ? "MaxPool::backward" : "AvgPool::backward", Range3({0, 0, 0}, {planes, H, W}),
      KOKKOS_LAMBDA(std::int64_t p, std::int64_t r, std::int64_t c) {
        const std::int64_t at = r * W + c;
        // windows i with i*s <= r <= i*s + k - 1, likewise j
        const std::int64_t i0 = r >= k ? (r - k) / s + 1 : 0, i1 = r / s < Ho - 1 ? r / s : Ho - 1;
        const std::int64_t j0 = c >= k ? (c - k) / s + 1 : 0, j1 = c / s < Wo - 1 ? c / s : Wo - 1;
        float g = 0.0f;
        for (std::int64_t i = i0; i <= i1; ++i)
          for (std::int64_t j = j0; j <= j1; ++j) {
            const std::int64_t o = (p * Ho + i) * Wo + j;
            if (is_max)
              g += am(o) == at ? dyv(o) : 0.0f;
            else
              g += dyv(o) * inv;
          }
        dxv(p * H * W + at) = g;
      });
}

Shape GlobalAvgPool::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 3)
    throw InputError("globalavgpool needs an image input (channels, height, width) but gets " +
                     shape_str(in_sample));
  c_ = in_sample[0];
  hw_ = in_sample[1] * in_sample[2];
  in_sample_ = in_sample;
  out_sample_ = {c_, 1, 1};
  return out_sample_;
}

// x: (B, C, H, W) -> y: (B, C, 1, 1), the mean of each plane
void GlobalAvgPool::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  const std::int64_t B = x.batch(), hw = hw_;
  resize(y, B, out_sample_, "GlobalAvgPool::y");
  ConstView1 xv = x.data;
  View1 yv = y.data;
  const float inv = 1.0f / static_cast<float>(hw);
  Kokkos::parallel_for(
      "GlobalAvgPool::forward", Range(0, B * c_), KOKKOS_LAMBDA(std::int64_t p) {
        float sum = 0.0f;
        for (std::int64_t i = 0; i < hw; ++i) sum += xv(p * hw + i);
        yv(p) = sum * inv;
      });
}

// dy: (B, C, 1, 1) -> dx: (B, C, H, W) = dy / (H W) everywhere in the plane
void GlobalAvgPool::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  if (!needs_input_grad()) return;
  const std::int64_t hw = hw_;
  resize(dx, x.batch(), in_sample_, "GlobalAvgPool::dx");
  ConstView1 dyv = dy.data;
  View1 dxv = dx.data;
  const float inv = 1.0f / static_cast<float>(hw);
  Kokkos::parallel_for(
      "GlobalAvgPool::backward", Range(0, x.batch() * c_ * hw),
      KOKKOS_LAMBDA(std::int64_t e) { dxv(e) = dyv(e / hw) * inv; });
}

}  // namespace ddp
