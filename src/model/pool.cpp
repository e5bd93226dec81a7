#include "model/pool.hpp"

#include "comm/check.hpp"
#include "model/elements.hpp"
#include "model/planes.hpp"
#include "model/select.hpp"

namespace ddp {

Shape Pool2d::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 3)
    throw InputError(kind() + " needs an image input (channels, height, width) but gets " +
                     shape_str(in_sample));
  c_ = in_sample[0];
  h_ = in_sample[1];
  w_ = in_sample[2];
  if (h_ + 2 * pad_ < k_ || w_ + 2 * pad_ < k_)
    throw InputError("kernel " + std::to_string(k_) + " is larger than the input " + shape_str(in_sample) +
                     (pad_ ? " padded by " + std::to_string(pad_) : std::string()));
  ho_ = (h_ + 2 * pad_ - k_) / stride_ + 1;
  wo_ = (w_ + 2 * pad_ - k_) / stride_ + 1;
  in_sample_ = in_sample;
  out_sample_ = {c_, ho_, wo_};
  return out_sample_;
}

namespace {
// The rows (or columns) [begin, end) of the input that output row i's window covers:
// it starts at i * s - pad in the padded input, and the padding is cut off.
struct Window {
  std::int64_t begin, end;
};
KOKKOS_INLINE_FUNCTION Window window(std::int64_t i, std::int64_t s, std::int64_t pad, std::int64_t k,
                                     std::int64_t n) {
  const std::int64_t b = i * s - pad, e = b + k;
  return {b < 0 ? 0 : b, e > n ? n : e};
}

// The NHWC max-pool's threads load every value they compare or add before the first
// comparison (on a GPU, one load at a time, each waited for, left the memory idle)
// where the window is at most kSmallWindow wide (ResNet's 3x3), and in backward
// where at most kSmallWindowsOver windows overlap in each direction (3x3 at stride 2:
// 2); other windows take the loop.
constexpr int kSmallWindow = 3;
constexpr int kSmallWindowsOver = 2;

// (plane, row, column) iterations without integer division per element.
using Range2 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, LaunchHint>;
using Range3 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>, LaunchHint>;

// One step of a window's running max: first max wins; NaN wins, as in PyTorch.
// Selects, not branches (hence | not ||): which element wins is data, and a branch
// on it mispredicts.
template <class Index>
KOKKOS_INLINE_FUNCTION void take_max(float v, Index at, float& m, Index& best) {
  const bool take = (v > m) | (v != v);
  best = take ? at : best;
  m = take ? v : m;
}

// The first of a 2x2 window (a b / c d) that holds its maximum m, found with no
// branch: 0, 1, 2 or 3 in window order. NaN-free windows only.
KOKKOS_INLINE_FUNCTION std::int64_t first_max_of4(float a, float b, float c, float m) {
  const std::int64_t na = a != m, nb = b != m, nc = c != m;
  return na * (1 + nb * (1 + nc));
}

void reserve_argmax(Kokkos::View<std::int32_t*>& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.extent(0)) < n)
    v = Kokkos::View<std::int32_t*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "MaxPool::argmax"), n);
}

// Channel block p of a blocked (B, C, H, W) tensor of BS-channel blocks in NCHW: the
// plane of its first channel, and how many of its BS channels exist (the rest are
// padding).
struct NchwBlock {
  std::int64_t plane, lanes;
};
template <int BS>
KOKKOS_INLINE_FUNCTION NchwBlock nchw_block(std::int64_t p, std::int64_t C) {
  const std::int64_t Cb = (C + BS - 1) / BS, c0 = p % Cb * BS;
  return {p / Cb * C + c0, C - c0 < BS ? C - c0 : BS};
}
}  // namespace

// A max-pool's argmax, an int32 an output, blocked as x (padding channels included)
// where x is blocked, and there an NCHW dy's blocked copy.
std::int64_t Pool2d::kept_floats(std::int64_t batch) const {
  if (op_ != Max) return 0;
  const bool blocked = channel_block(in_layout_) > 1;
  const std::int64_t argmax =
      planned_floats(batch, out_sample_, blocked ? in_layout_ : Layout::nchw, Precision::fp32);
  return argmax + (blocked && out_layout_ == Layout::nchw ? argmax : 0);
}

// x: (B, C, H, W) -> y: (B, C, Ho, Wo); one thread per output element.
void Pool2d::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  if (x.layout == Layout::nhwc)
    return x.type == Precision::fp32 ? forward_nhwc<false>(x, y) : forward_nhwc<true>(x, y);
  DDP_REQUIRE(x.type == Precision::fp32, kind() << " takes a narrow x in nhwc only");
  if (x.layout == Layout::nChw8c) return forward_blocked<8>(x, y);
  if (x.layout == Layout::nChw16c) return forward_blocked<16>(x, y);
  const std::int64_t B = x.batch(), H = h_, W = w_, Ho = ho_, Wo = wo_, k = k_, s = stride_, pad = pad_;
  resize(y, B, out_sample_, op_ == Max ? "MaxPool::y" : "AvgPool::y");
  ConstView1 xv = x.data;
  View1 yv = y.data;
  const std::int64_t planes = B * c_, n = planes * Ho * Wo;
  if (n == 0) return;
  // One thread per output row: the inner loop walks the row with no index arithmetic.
  const Range2 rows({0, 0}, {planes, Ho});
  if (op_ == Max) {
    reserve_argmax(argmax_, n);
    auto am = argmax_;
    if (k == 2 && s == 2 && pad == 0) {  // the common case, unrolled: a quarter of the loop overhead
      Kokkos::parallel_for(
          "MaxPool::forward", rows, KOKKOS_LAMBDA(std::int64_t p, std::int64_t i) {
            const float* xp = xv.data() + p * H * W;
            float* yp = yv.data() + (p * Ho + i) * Wo;
            std::int32_t* ap = am.data() + (p * Ho + i) * Wo;
            for (std::int64_t j = 0; j < Wo; ++j) {
              const std::int64_t at = 2 * i * W + 2 * j;
              const float a = xp[at], b = xp[at + 1], c = xp[at + W], d = xp[at + W + 1];
              std::int64_t best = at;
              float m = a;
              if ((a != a) | (b != b) | (c != c) | (d != d)) {  // rare: the general rule
                take_max(b, at + 1, m, best);
                take_max(c, at + W, m, best);
                take_max(d, at + W + 1, m, best);
              } else {
                const float ab = a > b ? a : b, cd = c > d ? c : d;
                m = ab > cd ? ab : cd;
                const std::int64_t q = first_max_of4(a, b, c, m);
                best = at + (q & 1) + (q >> 1) * W;
              }
              yp[j] = m;
              ap[j] = static_cast<std::int32_t>(best);
            }
          });
      return;
    }
    Kokkos::parallel_for(
        "MaxPool::forward", rows, KOKKOS_LAMBDA(std::int64_t p, std::int64_t i) {
          const float* xp = xv.data() + p * H * W;
          float* yp = yv.data() + (p * Ho + i) * Wo;
          std::int32_t* ap = am.data() + (p * Ho + i) * Wo;
          const Window wr = window(i, s, pad, k, H);
          for (std::int64_t j = 0; j < Wo; ++j) {
            const Window wc = window(j, s, pad, k, W);
            std::int64_t best = wr.begin * W + wc.begin;  // padding never wins: start inside
            float m = xp[best];
            for (std::int64_t r = wr.begin; r < wr.end; ++r)
              for (std::int64_t c = wc.begin; c < wc.end; ++c) take_max(xp[r * W + c], r * W + c, m, best);
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
          const Window wr = window(i, s, pad, k, H);
          for (std::int64_t j = 0; j < Wo; ++j) {
            const Window wc = window(j, s, pad, k, W);
            float sum = 0.0f;
            for (std::int64_t r = wr.begin; r < wr.end; ++r)
              for (std::int64_t c = wc.begin; c < wc.end; ++c) sum += xp[r * W + c];
            yp[j] = sum * inv;
          }
        });
  }
}

// dy: (B, C, Ho, Wo) -> dx: (B, C, H, W). Windows that do not overlap (stride >= k,
// the usual case): max zeroes each window row's band of dx, still in cache when it
// stores dy at the argmaxes. Otherwise one thread per input element gathers from the
// windows that contain it, so overlapping windows need no atomics. With the relu
// mask, dy passes only where the output y > 0.
void Pool2d::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (!needs_input_grad()) return;
  if (x.layout == Layout::nhwc) {
    DDP_REQUIRE(dy.type == x.type, kind() << ": a " << precision_name(dy.type) << " dy for a "
                                          << precision_name(x.type) << " x");
    return x.type == Precision::fp32 ? backward_nhwc<false>(dy, dx, x.type)
                                     : backward_nhwc<true>(dy, dx, x.type);
  }
  if (x.layout == Layout::nChw8c) return backward_blocked<8>(dy, dx, x.layout);
  if (x.layout == Layout::nChw16c) return backward_blocked<16>(dy, dx, x.layout);
  const std::int64_t B = x.batch(), H = h_, W = w_, Ho = ho_, Wo = wo_, k = k_, s = stride_, pad = pad_;
  resize(dx, B, in_sample_, op_ == Max ? "MaxPool::dx" : "AvgPool::dx");
  const std::int64_t planes = B * c_;
  if (planes == 0) return;
  ConstView1 yv = y.data, dyv = dy.data;
  View1 dxv = dx.data;
  const bool is_max = op_ == Max, mask = relu_mask_;
  const float inv = 1.0f / static_cast<float>(k * k);
  auto am = argmax_;
  if (is_max && s >= k) {
    Kokkos::parallel_for(
        "MaxPool::backward", Range2({0, 0}, {planes, Ho}), KOKKOS_LAMBDA(std::int64_t p, std::int64_t i) {
          float* dxp = dxv.data() + p * H * W;
          // Zero the rows from this window row to the next (from 0 before the first,
          // to H after the last), then store each gradient at its argmax: no branch
          // on the data. (s >= k >= 2 pad: every row but the first has i s - pad >= 0.)
          const std::int64_t rows_begin = i == 0 ? 0 : i * s - pad,
                             rows_end = i == Ho - 1 ? H : (i + 1) * s - pad;
          for (std::int64_t e = rows_begin * W; e < rows_end * W; ++e) dxp[e] = 0.0f;
          const std::int64_t o0 = (p * Ho + i) * Wo;
          for (std::int64_t j = 0; j < Wo; ++j)
            dxp[am(o0 + j)] = mask ? select_or_zero(relu_passes(yv(o0 + j)), dyv(o0 + j)) : dyv(o0 + j);
        });
    return;
  }
  Kokkos::parallel_for(
      is_max ? "MaxPool::backward" : "AvgPool::backward", Range3({0, 0, 0}, {planes, H, W}),
      KOKKOS_LAMBDA(std::int64_t p, std::int64_t r, std::int64_t c) {
        const std::int64_t at = r * W + c, rp = r + pad, cp = c + pad;  // rp, cp: in the padded input
        // windows i with i*s <= rp <= i*s + k - 1, likewise j
        const std::int64_t i0 = rp >= k ? (rp - k) / s + 1 : 0, i1 = rp / s < Ho - 1 ? rp / s : Ho - 1;
        const std::int64_t j0 = cp >= k ? (cp - k) / s + 1 : 0, j1 = cp / s < Wo - 1 ? cp / s : Wo - 1;
        float g = 0.0f;
        for (std::int64_t i = i0; i <= i1; ++i)
          for (std::int64_t j = j0; j <= j1; ++j) {
            const std::int64_t o = (p * Ho + i) * Wo + j;
            if (is_max)
              g += am(o) == at && (!mask || relu_passes(yv(o))) ? dyv(o) : 0.0f;
            else
              g += dyv(o) * inv;
          }
        dxv(p * H * W + at) = g;
      });
}

// x: (B, C/BS, H, W, BS) -> y: (B, C, Ho, Wo) in out_layout_ (x's layout or NCHW);
// 2x2 windows, stride 2. One thread per output row of a channel block. A pixel's BS
// channels are adjacent, so each step of the window's running max is one vector
// select, with the NCHW kernel's rules for ties and NaN. The argmax is blocked as x
// whatever y's layout, and -1 where the relu mask stops the gradient (y <= 0):
// backward reads only it and dy.
template <int BS>
void Pool2d::forward_blocked(const Tensor& x, Tensor& y) {
  DDP_REQUIRE(takes(x.layout), kind() << " on a blocked input needs kernel 2, stride 2");
  DDP_REQUIRE(out_layout_ == Layout::nchw || out_layout_ == x.layout,
              kind() << ": output layout " << layout_name(out_layout_) << " for a " << layout_name(x.layout)
                     << " input");
  const std::int64_t B = x.batch(), C = c_, H = h_, W = w_, Ho = ho_, Wo = wo_, Cb = (C + BS - 1) / BS;
  resize(y, B, out_sample_, "MaxPool::y", out_layout_);
  reserve_argmax(argmax_, B * Cb * Ho * Wo * BS);
  if (B == 0) return;
  ConstView1 xv = x.data;
  View1 yv = y.data;
  auto am = argmax_;
  const bool blocked_out = out_layout_ != Layout::nchw, mask = relu_mask_;
  Kokkos::parallel_for(
      "MaxPool::forward_blocked", Range2({0, 0}, {B * Cb, Ho}),
      KOKKOS_LAMBDA(std::int64_t p, std::int64_t i) {
        const float* xr = xv.data() + (p * H + 2 * i) * W * BS;
        const std::int64_t row = (p * Ho + i) * Wo * BS;  // of blocked y and argmax
        const NchwBlock nchw = nchw_block<BS>(p, C);
        for (std::int64_t j = 0; j < Wo; ++j) {
          const float* xa = xr + 2 * j * BS;  // the window's pixels: xa, xa + BS / below them, W * BS on
          const auto at = static_cast<std::int32_t>(2 * i * W + 2 * j), w = static_cast<std::int32_t>(W);
          std::int32_t* ao = am.data() + row + j * BS;
          float m[BS];
          for (int l = 0; l < BS; ++l) {
            std::int32_t best = at;
            m[l] = xa[l];
            take_max(xa[BS + l], at + 1, m[l], best);
            take_max(xa[BS * W + l], at + w, m[l], best);
            take_max(xa[BS * W + BS + l], at + w + 1, m[l], best);
            ao[l] = !mask | relu_passes(m[l]) ? best : -1;
          }
          if (blocked_out) {
            for (int l = 0; l < BS; ++l) yv(row + j * BS + l) = m[l];
          } else {
            for (std::int64_t l = 0; l < nchw.lanes; ++l) yv(((nchw.plane + l) * Ho + i) * Wo + j) = m[l];
          }
        }
      });
}

// dy: (B, C, Ho, Wo) in y's layout -> dx: (B, C/BS, H, W, BS) in x's layout. Each
// window's four gradients are written at once, lanes as vectors: dy where the argmax
// is, else 0. An NCHW dy (a quarter of dx's size) is first transposed to the blocked
// layout. What no window covers (a last odd row or column) is zeroed, and so are the
// padding channels, as oneDNN expects.
template <int BS>
void Pool2d::backward_blocked(const Tensor& dy, Tensor& dx, Layout x_layout) {
  const std::int64_t B = dy.batch(), C = c_, H = h_, W = w_, Ho = ho_, Wo = wo_, Cb = (C + BS - 1) / BS;
  resize(dx, B, in_sample_, "MaxPool::dx", x_layout);
  if (B == 0) return;
  ConstView1 dyv = dy.data;
  if (out_layout_ == Layout::nchw) {
    resize(dy_blocked_, B, out_sample_, "MaxPool::dy_blocked", x_layout);
    View1 dyb = dy_blocked_.data;
    Kokkos::parallel_for(
        "MaxPool::dy_to_blocked", Range2({0, 0}, {B * Cb, Ho}),
        KOKKOS_LAMBDA(std::int64_t p, std::int64_t i) {
          const NchwBlock nchw = nchw_block<BS>(p, C);
          float* row = dyb.data() + (p * Ho + i) * Wo * BS;
          for (std::int64_t j = 0; j < Wo; ++j)
            for (std::int64_t l = 0; l < BS; ++l)
              row[j * BS + l] = l < nchw.lanes ? dyv(((nchw.plane + l) * Ho + i) * Wo + j) : 0.0f;
        });
    dyv = dyb;
  }
  View1 dxv = dx.data;
  auto am = argmax_;
  Kokkos::parallel_for(
      "MaxPool::backward_blocked", Range2({0, 0}, {B * Cb, Ho}),
      KOKKOS_LAMBDA(std::int64_t p, std::int64_t i) {
        float* dxr = dxv.data() + (p * H + 2 * i) * W * BS;
        const std::int64_t row = (p * Ho + i) * Wo * BS;
        for (std::int64_t j = 0; j < Wo; ++j) {
          const float* g = dyv.data() + row + j * BS;
          const std::int32_t* a = am.data() + row + j * BS;
          float* dxa = dxr + 2 * j * BS;
          const auto at = static_cast<std::int32_t>(2 * i * W + 2 * j), w = static_cast<std::int32_t>(W);
          for (int l = 0; l < BS; ++l) {
            dxa[l] = select_or_zero(a[l] == at, g[l]);
            dxa[BS + l] = select_or_zero(a[l] == at + 1, g[l]);
            dxa[BS * W + l] = select_or_zero(a[l] == at + w, g[l]);
            dxa[BS * W + BS + l] = select_or_zero(a[l] == at + w + 1, g[l]);
          }
        }
        for (std::int64_t e = 2 * Wo * BS; e < W * BS; ++e) dxr[e] = dxr[W * BS + e] = 0.0f;
        if (i == Ho - 1)
          for (std::int64_t e = 2 * W * BS; e < (H - 2 * i) * W * BS; ++e) dxr[e] = 0.0f;
      });
}

// x: (B, H, W, C) -> y: (B, C, Ho, Wo) in out_layout_ (nhwc or nchw), any window. A
// thread per output pixel and V channels (for_each_pixel_group); ties and NaN as in
// the NCHW kernel. The argmax (B, Ho, Wo, C) is the input pixel
// r * W + q, and -1 where the relu mask stops the gradient (y <= 0): backward reads
// only it and dy. y in x's type (a narrow max is one of the narrow elements: no
// rounding). V = 8 (element_vectors(), C a multiple of 8): a pixel's 8 channels in
// one load (model/planes.hpp's map_vectors), every channel's comparisons in the same
// order as with V = 1, the same results.
template <bool Narrow>
void Pool2d::forward_nhwc(const Tensor& x, Tensor& y) {
  DDP_REQUIRE(takes(x.layout), kind() << " takes no nhwc input");
  DDP_REQUIRE(out_layout_ == Layout::nchw || out_layout_ == Layout::nhwc,
              kind() << ": output layout " << layout_name(out_layout_) << " for an nhwc input");
  resize(y, x.batch(), out_sample_, "MaxPool::y", out_layout_, x.type);
  reserve_argmax(argmax_, x.batch() * c_ * ho_ * wo_);
  if (x.batch() == 0) return;
  if (nhwc_vectors(x, y)) return forward_nhwc_lanes<Narrow, 8>(x, y);
  forward_nhwc_lanes<Narrow, 1>(x, y);
}

namespace {
// Elements e..e+V-1 of x as floats: one load8 where V = 8.
template <int V, class E>
KOKKOS_INLINE_FUNCTION void load_lanes(const E& x, std::int64_t e, float* out) {
  if constexpr (V == 1) {
    out[0] = x(e);
  } else {
    const auto p = x.load8(e);
    DDP_UNROLL for (int l = 0; l < V; ++l) { out[l] = x.lane(p, l); }
  }
}
// v[0..V-1] into elements e..e+V-1 of out: one set8 where V = 8.
template <int V, class E>
KOKKOS_INLINE_FUNCTION void store_lanes(const E& out, std::int64_t e, const float* v) {
  if constexpr (V == 1)
    out.set(e, v[0]);
  else
    out.set8(e, v);
}
// Argmax entries e..e+V-1: two 16-byte loads or stores where V = 8.
struct alignas(16) Int8 {
  std::int32_t v[8];
};
template <int V>
KOKKOS_INLINE_FUNCTION void load_argmax(const Kokkos::View<std::int32_t*>& am, std::int64_t e,
                                        std::int32_t* out) {
  if constexpr (V == 1) {
    out[0] = am(e);
  } else {
    const Int8 p = *reinterpret_cast<const Int8*>(am.data() + e);
    DDP_UNROLL for (int l = 0; l < V; ++l) { out[l] = p.v[l]; }
  }
}
template <int V>
KOKKOS_INLINE_FUNCTION void store_argmax(const Kokkos::View<std::int32_t*>& am, std::int64_t e,
                                         const std::int32_t* in) {
  if constexpr (V == 1) {
    am(e) = in[0];
  } else {
    Int8 p;
    DDP_UNROLL for (int l = 0; l < V; ++l) { p.v[l] = in[l]; }
    *reinterpret_cast<Int8*>(am.data() + e) = p;
  }
}
}  // namespace

bool Pool2d::nhwc_vectors(const Tensor& a, const Tensor& b) const {
  return element_vectors() && c_ % 8 == 0 && aligned16(a.data.data()) && aligned16(b.data.data()) &&
         aligned16(argmax_.data());
}

template <bool Narrow, int V>
void Pool2d::forward_nhwc_lanes(const Tensor& x, Tensor& y) {
  const std::int64_t B = x.batch(), C = c_, H = h_, W = w_, Ho = ho_, Wo = wo_, k = k_, s = stride_,
                     pad = pad_;
  const auto xv = elements<Narrow>(x);
  const auto yv = elements<Narrow>(y);
  auto am = argmax_;
  const bool nhwc_out = out_layout_ == Layout::nhwc, mask = relu_mask_, small = k <= kSmallWindow;
  for_each_pixel_group<V>(
      "MaxPool::forward_nhwc", B * Ho * Wo, C, KOKKOS_LAMBDA(std::int64_t q, std::int64_t c0) {
        const std::int64_t b = q / (Ho * Wo), o = q - b * Ho * Wo, i = o / Wo, j = o - i * Wo;
        const Window wr = window(i, s, pad, k, H), wc = window(j, s, pad, k, W);
        const std::int64_t e = q * C + c0;
        const std::int64_t x0 = b * H * W * C + c0;          // channel c0 of image b: pixel p at x0 + p * C
        const std::int64_t first = wr.begin * W + wc.begin;  // padding never wins: start inside
        float m[V];
        std::int64_t best[V];
        load_lanes<V>(xv, x0 + first * C, m);
        DDP_UNROLL for (int l = 0; l < V; ++l) { best[l] = first; }
        if (small) {  // the window's values all loaded first (no branch), then taken in the same order
          float v[kSmallWindow][kSmallWindow][V];
          DDP_UNROLL for (int dr = 0; dr < kSmallWindow; ++dr) {
            DDP_UNROLL for (int dq = 0; dq < kSmallWindow; ++dq) {  // past the window: its last row or column
              const std::int64_t r = wr.begin + dr < wr.end ? wr.begin + dr : wr.end - 1,
                                 c = wc.begin + dq < wc.end ? wc.begin + dq : wc.end - 1;
              load_lanes<V>(xv, x0 + (r * W + c) * C, v[dr][dq]);
            }
          }
          DDP_UNROLL for (int dr = 0; dr < kSmallWindow; ++dr) {
            DDP_UNROLL for (int dq = 0; dq < kSmallWindow; ++dq) {
              const std::int64_t r = wr.begin + dr, c = wc.begin + dq;
              if (r < wr.end && c < wc.end) {
                DDP_UNROLL for (int l = 0; l < V; ++l) { take_max(v[dr][dq][l], r * W + c, m[l], best[l]); }
              }
            }
          }
        } else {
          for (std::int64_t r = wr.begin; r < wr.end; ++r)
            for (std::int64_t c = wc.begin; c < wc.end; ++c) {
              float v[V];
              load_lanes<V>(xv, x0 + (r * W + c) * C, v);
              DDP_UNROLL for (int l = 0; l < V; ++l) { take_max(v[l], r * W + c, m[l], best[l]); }
            }
        }
        std::int32_t a[V];
        DDP_UNROLL for (int l = 0; l < V; ++l) {
          a[l] = !mask | relu_passes(m[l]) ? static_cast<std::int32_t>(best[l]) : -1;
        }
        store_argmax<V>(am, e, a);
        if (nhwc_out)
          store_lanes<V>(yv, e, m);
        else
          DDP_UNROLL for (int l = 0; l < V; ++l) { yv.set((b * C + c0 + l) * Ho * Wo + o, m[l]); }
      });
}

// dy: (B, C, Ho, Wo) in y's layout -> dx: (B, H, W, C). A thread per input pixel and
// V channels gathers dy from the windows whose argmax it is (overlapping windows or
// not: no atomics, and what no window takes is zero). Narrow: dy and dx (of `type`)
// narrow, the sum in fp32 rounded once. V = 8 as in forward.
template <bool Narrow>
void Pool2d::backward_nhwc(const Tensor& dy, Tensor& dx, Precision type) {
  resize(dx, dy.batch(), in_sample_, "MaxPool::dx", Layout::nhwc, type);
  if (dy.batch() == 0) return;
  if (nhwc_vectors(dy, dx)) return backward_nhwc_lanes<Narrow, 8>(dy, dx);
  backward_nhwc_lanes<Narrow, 1>(dy, dx);
}

template <bool Narrow, int V>
void Pool2d::backward_nhwc_lanes(const Tensor& dy, Tensor& dx) {
  const std::int64_t B = dy.batch(), C = c_, H = h_, W = w_, Ho = ho_, Wo = wo_, k = k_, s = stride_,
                     pad = pad_;
  const auto dyv = elements<Narrow>(dy);
  const auto dxv = elements<Narrow>(dx);
  auto am = argmax_;
  const bool nhwc_out = out_layout_ == Layout::nhwc, small = (k + s - 1) / s <= kSmallWindowsOver;
  for_each_pixel_group<V>(
      "MaxPool::backward_nhwc", B * H * W, C, KOKKOS_LAMBDA(std::int64_t q, std::int64_t c0) {
        const std::int64_t b = q / (H * W), at = q - b * H * W;
        const std::int64_t r = at / W, rp = r + pad, cp = at - r * W + pad;  // rp, cp: in the padded input
        const std::int64_t i0 = rp >= k ? (rp - k) / s + 1 : 0, i1 = rp / s < Ho - 1 ? rp / s : Ho - 1;
        const std::int64_t j0 = cp >= k ? (cp - k) / s + 1 : 0, j1 = cp / s < Wo - 1 ? cp / s : Wo - 1;
        const std::int64_t e = q * C + c0;
        // dy of window o (its nhwc element oe) for the V channels
        auto dy_at = [&](std::int64_t o, std::int64_t oe, float* d) {
          if (nhwc_out) return load_lanes<V>(dyv, oe, d);
          DDP_UNROLL for (int l = 0; l < V; ++l) { d[l] = dyv((b * C + c0 + l) * Ho * Wo + o); }
        };
        float g[V];
        DDP_UNROLL for (int l = 0; l < V; ++l) { g[l] = 0.0f; }
        if (small) {  // the windows' argmax and dy all loaded first (no branch), then added in order
          constexpr int N = kSmallWindowsOver;
          std::int32_t a[N][N][V];
          float d[N][N][V];
          DDP_UNROLL for (int di = 0; di < N; ++di) {
            DDP_UNROLL for (int dj = 0; dj < N; ++dj) {  // past the last window: the last one again
              const std::int64_t i = i0 + di < i1 ? i0 + di : i1, j = j0 + dj < j1 ? j0 + dj : j1;
              const std::int64_t o = i * Wo + j, oe = (b * Ho * Wo + o) * C + c0;
              load_argmax<V>(am, oe, a[di][dj]);
              dy_at(o, oe, d[di][dj]);
            }
          }
          DDP_UNROLL for (int di = 0; di < N; ++di) {
            DDP_UNROLL for (int dj = 0; dj < N; ++dj) {
              if (i0 + di <= i1 && j0 + dj <= j1) {
                DDP_UNROLL for (int l = 0; l < V; ++l) { g[l] += a[di][dj][l] == at ? d[di][dj][l] : 0.0f; }
              }
            }
          }
        } else {
          for (std::int64_t i = i0; i <= i1; ++i)
            for (std::int64_t j = j0; j <= j1; ++j) {
              const std::int64_t o = i * Wo + j, oe = (b * Ho * Wo + o) * C + c0;
              std::int32_t a[V];
              float d[V];
              load_argmax<V>(am, oe, a);
              dy_at(o, oe, d);
              DDP_UNROLL for (int l = 0; l < V; ++l) { g[l] += a[l] == at ? d[l] : 0.0f; }
            }
        }
        store_lanes<V>(dxv, e, g);
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

// x: (B, C, H, W) -> y: (B, C, 1, 1), the mean of each plane. x in NCHW, nhwc or a
// convolution's blocked layout (a thread per channel block, its channels' sums
// side by side: the same order of additions as NCHW's thread per plane).
void GlobalAvgPool::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  const std::int64_t B = x.batch(), C = c_, hw = hw_;
  resize(y, B, out_sample_, "GlobalAvgPool::y");
  ConstView1 xv = x.data;
  View1 yv = y.data;
  const float inv = 1.0f / static_cast<float>(hw);
  if (x.layout == Layout::nhwc)
    return x.type == Precision::fp32 ? forward_nhwc<false>(x, yv) : forward_nhwc<true>(x, yv);
  DDP_REQUIRE(x.type == Precision::fp32, "globalavgpool takes a narrow x in nhwc only");
  switch (x.layout) {
    case Layout::nChw8c:
      return forward_blocked<8>(B, xv, yv);
    case Layout::nChw16c:
      return forward_blocked<16>(B, xv, yv);
    case Layout::nhwc:
    case Layout::nchw:
      break;
  }
  Kokkos::parallel_for(
      "GlobalAvgPool::forward", Range(0, B * C), KOKKOS_LAMBDA(std::int64_t p) {
        float sum = 0.0f;
        for (std::int64_t i = 0; i < hw; ++i) sum += xv(p * hw + i);
        yv(p) = sum * inv;
      });
}

template <int BS>
void GlobalAvgPool::forward_blocked(std::int64_t B, ConstView1 xv, View1 yv) {
  const std::int64_t C = c_, hw = hw_, CB = (C + BS - 1) / BS;
  const float inv = 1.0f / static_cast<float>(hw);
  Kokkos::parallel_for(
      "GlobalAvgPool::forward", Range(0, B * CB), KOKKOS_LAMBDA(std::int64_t p) {
        float sum[BS] = {};
        for (std::int64_t i = 0; i < hw; ++i)
          for (int l = 0; l < BS; ++l) sum[l] += xv((p * hw + i) * BS + l);
        const std::int64_t b = p / CB, c0 = (p - b * CB) * BS;
        for (int l = 0; l < BS && c0 + l < C; ++l) yv(b * C + c0 + l) = sum[l] * inv;
      });
}

// x: (B, H, W, C) of either type: a thread per (b, c), adjacent threads on adjacent
// channels; the NCHW kernel's order of additions.
template <bool Narrow>
void GlobalAvgPool::forward_nhwc(const Tensor& x, View1 yv) {
  const std::int64_t B = x.batch(), C = c_, hw = hw_;
  const auto xv = elements<Narrow>(x);
  const float inv = 1.0f / static_cast<float>(hw);
  Kokkos::parallel_for(
      "GlobalAvgPool::forward_nhwc", Range(0, B * C), KOKKOS_LAMBDA(std::int64_t p) {
        const std::int64_t b = p / C, c = p - b * C;
        float sum = 0.0f;
        for (std::int64_t i = 0; i < hw; ++i) sum += xv((b * hw + i) * C + c);
        yv(p) = sum * inv;
      });
}

// dy: (B, C, 1, 1) -> dx: (B, C, H, W) = dy / (H W) everywhere in the plane, in x's
// layout and type
void GlobalAvgPool::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  if (!needs_input_grad()) return;
  resize(dx, x.batch(), in_sample_, "GlobalAvgPool::dx", x.layout, x.type);
  return x.type == Precision::fp32 ? spread<false>(dy, dx) : spread<true>(dy, dx);
}

template <bool Narrow>
void GlobalAvgPool::spread(const Tensor& dy, Tensor& dx) {
  const std::int64_t C = c_;
  ConstView1 dyv = dy.data;
  const auto dxv = elements<Narrow>(dx);
  const float inv = 1.0f / static_cast<float>(hw_);
  for_each_element(
      "GlobalAvgPool::backward", dx.layout, dx.batch(), C, hw_,
      KOKKOS_LAMBDA(std::int64_t b, std::int64_t c, std::int64_t, std::int64_t e) {
        dxv.set(e, c < C ? dyv(b * C + c) * inv : 0.0f);
      });
}

}  // namespace ddp
