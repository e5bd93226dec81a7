#include "model/attention.hpp"

#include <cmath>

#include "comm/check.hpp"
#include "model/exp_fast.hpp"
#include "model/gemm.hpp"
#include "model/planes.hpp"  // for_each_team_thread

namespace ddp {

namespace {
void require_plain(const Tensor& t, const char* what) {
  DDP_REQUIRE(t.type == Precision::fp32 && t.layout == Layout::nchw,
              "attention: " << what << " is " << precision_name(t.type) << " in " << layout_name(t.layout)
                            << ", not fp32 in nchw");
}

// v holds at least n floats: a new (uninitialised) buffer where it is smaller.
void reserve(View1& v, std::int64_t n, const char* label) {
  if (static_cast<std::int64_t>(v.extent(0)) < n) v = make_buffer(label, n, /*uninitialised=*/true);
}

// out (N, n) += bias (n), row by row.
void add_bias(const char* label, float* out, const float* bias, std::int64_t N, std::int64_t n) {
  const Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, LaunchHint> rows({0, 0}, {N, n});
  Kokkos::parallel_for(
      label, rows, KOKKOS_LAMBDA(std::int64_t r, std::int64_t j) { out[r * n + j] += bias[j]; });
}

// Rows of a stretch of the bias gradients' column sums over `rows` rows: about
// sqrt(rows), a function of the row count alone (layernorm.cpp's rule).
std::int64_t stretch_rows(std::int64_t rows) {
  const std::int64_t r = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(rows))));
  return r < 1 ? 1 : r;
}

// db (n) += (or =, without `add`) the column sums of g (N, n): in double over stretches
// of stretch_rows(N) rows, a thread per (stretch, column), then over the stretches in
// order, a thread per column; the same bits on any device and thread count. (Not the
// GEMV ones^T g: oneDNN's splits its sum between its threads, and gave other bits on
// 2 threads than on 1.) partial: grown to the (K, n) partial sums.
void column_sums(const float* g, std::int64_t N, std::int64_t n, Kokkos::View<double*>& partial, float* db,
                 bool add) {
  const std::int64_t R = stretch_rows(N), K = (N + R - 1) / R;
  if (static_cast<std::int64_t>(partial.extent(0)) < K * n)
    partial =
        Kokkos::View<double*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Attention::partial"), K * n);
  const Kokkos::View<double*> part = partial;
  Kokkos::parallel_for(
      "Attention::bias_grad_stretches", Range(0, K * n), KOKKOS_LAMBDA(std::int64_t p) {
        const std::int64_t k = p / n, j = p - k * n, r0 = k * R, r1 = r0 + R < N ? r0 + R : N;
        double s = 0.0;
        for (std::int64_t r = r0; r < r1; ++r) s += g[r * n + j];
        part(p) = s;
      });
  Kokkos::parallel_for(
      "Attention::bias_grads", Range(0, n), KOKKOS_LAMBDA(std::int64_t j) {
        double s = 0.0;
        for (std::int64_t k = 0; k < K; ++k) s += part(k * n + j);
        db[j] = add ? db[j] + static_cast<float>(s) : static_cast<float>(s);
      });
}

// s (rows, T): each row of scores becomes its softmax, in place. Row r is query
// i = r % T of its (batch, head); with `causal` it sees keys 0..i, and the rest of the
// row is 0 (PyTorch's -inf mask). fp32 with the row's max subtracted, the sum of the
// exponentials in double. A team thread per row, its vector lanes along it. The
// exponentials in a pass of their own, before the sum (lane_sum): on the host each
// pass vectorises.
void softmax_rows(float* s, std::int64_t rows, std::int64_t T, bool causal) {
  for_each_team_thread(
      "Attention::softmax", rows, KOKKOS_LAMBDA(const ElementTeam::member_type& team, std::int64_t r) {
        float* row = s + r * T;
        const std::int64_t n = causal ? r % T + 1 : T;
        const float mx = lane_max(team, n, [&](std::int64_t j) { return row[j]; });
        // up to a multiple of 16 keys: whole vectors on the host (a masked key's value is
        // set to 0 below, whatever its exponential)
        const std::int64_t n16 = (n + 15) / 16 * 16 < T ? (n + 15) / 16 * 16 : T;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n16),
                             [&](std::int64_t j) { row[j] = exp_fast(row[j] - mx); });
        const float inv =
            static_cast<float>(1.0 / lane_sum(team, n, [&](std::int64_t j) { return double(row[j]); }));
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, T),
                             [&](std::int64_t j) { row[j] = j < n ? row[j] * inv : 0.0f; });
      });
}

// ds (rows, T) holds dP, the gradient of P (rows, T); it becomes dS, that of the
// scores: dS = P (dP - sum_j P dP) per row, the dot in double (0 where P is masked).
void softmax_backward_rows(const float* p, float* ds, std::int64_t rows, std::int64_t T, bool causal) {
  for_each_team_thread(
      "Attention::softmax_backward", rows,
      KOKKOS_LAMBDA(const ElementTeam::member_type& team, std::int64_t r) {
        const float* pr = p + r * T;
        float* gr = ds + r * T;
        const std::int64_t n = causal ? r % T + 1 : T;
        const float c =
            static_cast<float>(lane_sum(team, n, [&](std::int64_t j) { return double(pr[j]) * gr[j]; }));
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, T),
                             [&](std::int64_t j) { gr[j] = j < n ? pr[j] * (gr[j] - c) : 0.0f; });
      });
}
}  // namespace

// (T, d) -> (T, d), d a multiple of the heads.
Shape Attention::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 2)
    throw InputError("attention needs a sequence input (tokens, features) but gets " + shape_str(in_sample));
  if (in_sample[1] % heads_ != 0)
    throw InputError("attention: the features (" + std::to_string(in_sample[1]) +
                     ") are not a multiple of the heads (" + std::to_string(heads_) + ")");
  T_ = in_sample[0];
  d_ = in_sample[1];
  hs_ = d_ / heads_;
  sample_ = in_sample;
  return in_sample;
}

std::vector<Layer::ParamSpec> Attention::parameter_specs() const {
  return {{"in_proj_weight", {3 * d_, d_}},
          {"in_proj_bias", {3 * d_}},
          {"out_proj.weight", {d_, d_}},
          {"out_proj.bias", {d_}}};
}

void Attention::bind(float* params, float* grads) {
  const std::int64_t d = d_;
  in_weight_ = params;
  in_bias_ = in_weight_ + 3 * d * d;
  out_weight_ = in_bias_ + 3 * d;
  out_bias_ = out_weight_ + d * d;
  din_weight_ = grads;
  din_bias_ = din_weight_ + 3 * d * d;
  dout_weight_ = din_bias_ + 3 * d;
  dout_bias_ = dout_weight_ + d * d;
}

// nn.MultiheadAttention's _reset_parameters: xavier_uniform_ on in_proj_weight (3d, d):
// U(-a, a), a = sqrt(6 / (fan_in + fan_out)) = sqrt(6 / 4d); out_proj is an nn.Linear,
// whose kaiming_uniform_(a=sqrt(5)) weight is U(-1/sqrt(d), 1/sqrt(d)); both biases 0
// (PyTorch zeroes out_proj.bias after nn.Linear's init drew it).
void Attention::init(Rng& rng) {
  const std::int64_t d = d_;
  const float in_bound = std::sqrt(6.0f / static_cast<float>(4 * d)),
              out_bound = 1.0f / std::sqrt(static_cast<float>(d));
  fill_uniform(in_weight_, 3 * d * d, -in_bound, in_bound, rng.next_u64());
  fill_uniform(out_weight_, d * d, -out_bound, out_bound, rng.next_u64());
  float *in_b = in_bias_, *out_b = out_bias_;
  Kokkos::parallel_for(
      "Attention::init_biases", Range(0, 4 * d), KOKKOS_LAMBDA(std::int64_t j) {
        if (j < 3 * d)
          in_b[j] = 0.0f;
        else
          out_b[j - 3 * d] = 0.0f;
      });
}

// x: (B, T, d) -> y: (B, T, d). The GEMMs of the projections over the N = B T rows;
// those of the heads per (batch, head), on the head's columns in place.
void Attention::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  require_plain(x, "the input");
  const std::int64_t B = x.batch(), T = T_, d = d_, nh = heads_, hs = hs_, N = B * T, d3 = 3 * d;
  reserve(qkv_, N * d3, "Attention::qkv");
  reserve(p_, B * nh * T * T, "Attention::p");
  reserve(o_, N * d, "Attention::o");
  resize(y, B, sample_, "Attention::y");
  const Precision prec = precision();
  float *qkv = qkv_.data(), *p = p_.data(), *o = o_.data();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));

  // qkv (N, 3d) = x (N, d) W_in^T (d, 3d) + b_in
  gemm(false, true, N, d3, d, 1.0f, x.data.data(), d, in_weight_, d, 0.0f, qkv, d3, prec);
  add_bias("Attention::forward_in_bias", qkv, in_bias_, N, d3);
  // (B, T, 3d) -> Q, K, V, each (B, nh, T, hs): head h of batch b is the hs columns at
  // h hs (Q), d + h hs (K) and 2d + h hs (V) of the batch's T rows of 3d.
  // Per batch, the nh heads as one batched GEMM: head h + 1's columns are hs past
  // head h's, its (T, T) block of P T^2 past.
  for (std::int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * d3;
    // S (T, T) = Q_h (T, hs) K_h^T (hs, T) / sqrt(hs), into P's place
    gemm_batched(false, true, T, T, hs, scale, q, d3, hs, q + d, d3, hs, 0.0f, p + b * nh * T * T, T, T * T,
                 nh, prec);
  }
  softmax_rows(p, B * nh * T, T, causal_);  // (B, nh, T, T): S -> P
  for (std::int64_t b = 0; b < B; ++b) {
    const float* v = qkv + b * T * d3 + 2 * d;
    // O_h (T, hs) = P (T, T) V_h (T, hs), into the head's columns of O:
    // (B, nh, T, hs) -> (B, T, nh, hs) = (B, T, d)
    gemm_batched(false, false, T, hs, T, 1.0f, p + b * nh * T * T, T, T * T, v, d3, hs, 0.0f, o + b * T * d,
                 d, hs, nh, prec);
  }
  // y (N, d) = O (N, d) W_out^T (d, d) + b_out
  gemm(false, true, N, d, d, 1.0f, o, d, out_weight_, d, 0.0f, y.data.data(), d, prec);
  add_bias("Attention::forward_out_bias", y.data.data(), out_bias_, N, d);
}

// dy: (B, T, d) -> dx: (B, T, d), from forward's qkv_, p_ and o_ (left as they are, so
// backward may run again). The parameter gradients += (or =, while
// overwrite_gradients() is on); the biases' as column sums in double (column_sums).
void Attention::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  require_plain(dy, "the output gradient");
  const std::int64_t B = x.batch(), T = T_, d = d_, nh = heads_, hs = hs_, N = B * T, d3 = 3 * d;
  reserve(do_, N * d, "Attention::do");
  reserve(dqkv_, N * d3, "Attention::dqkv");
  reserve(ds_, B * nh * T * T, "Attention::ds");
  const Precision prec = precision();
  const bool add = !overwrite_gradients();
  const float beta = add ? 1.0f : 0.0f;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  const float *xp = x.data.data(), *dyp = dy.data.data(), *qkv = qkv_.data(), *p = p_.data(), *o = o_.data();
  float *dO = do_.data(), *dqkv = dqkv_.data(), *ds = ds_.data();

  // dW_out (d, d) += dy^T (d, N) O (N, d)
  gemm(true, false, d, d, N, 1.0f, dyp, d, o, d, beta, dout_weight_, d, prec);
  // db_out (d) += sum over the N rows of dy (N, d)
  column_sums(dyp, N, d, partial_, dout_bias_, add);
  // dO (N, d) = dy (N, d) W_out (d, d)
  gemm(false, false, N, d, d, 1.0f, dyp, d, out_weight_, d, 0.0f, dO, d, prec);
  for (std::int64_t b = 0; b < B; ++b) {  // the heads batched, as in forward
    const float *v = qkv + b * T * d3 + 2 * d, *pb = p + b * nh * T * T, *dob = dO + b * T * d;
    // dP (T, T) = dO_h (T, hs) V_h^T (hs, T), into dS's place
    gemm_batched(false, true, T, T, hs, 1.0f, dob, d, hs, v, d3, hs, 0.0f, ds + b * nh * T * T, T, T * T, nh,
                 prec);
    // dV_h (T, hs) = P^T (T, T) dO_h (T, hs)
    gemm_batched(true, false, T, hs, T, 1.0f, pb, T, T * T, dob, d, hs, 0.0f, dqkv + b * T * d3 + 2 * d, d3,
                 hs, nh, prec);
  }
  softmax_backward_rows(p, ds, B * nh * T, T, causal_);  // (B, nh, T, T): dP -> dS
  for (std::int64_t b = 0; b < B; ++b) {
    const float *q = qkv + b * T * d3, *dsb = ds + b * nh * T * T;
    float* dq = dqkv + b * T * d3;
    // dQ_h (T, hs) = dS (T, T) K_h (T, hs) / sqrt(hs)
    gemm_batched(false, false, T, hs, T, scale, dsb, T, T * T, q + d, d3, hs, 0.0f, dq, d3, hs, nh, prec);
    // dK_h (T, hs) = dS^T (T, T) Q_h (T, hs) / sqrt(hs)
    gemm_batched(true, false, T, hs, T, scale, dsb, T, T * T, q, d3, hs, 0.0f, dq + d, d3, hs, nh, prec);
  }
  // dqkv (B, nh, T, hs) x 3 sit in (B, T, 3d) already: the heads wrote their columns.
  // dW_in (3d, d) += dqkv^T (3d, N) x (N, d)
  gemm(true, false, d3, d, N, 1.0f, dqkv, d3, xp, d, beta, din_weight_, d, prec);
  // db_in (3d) += sum over the N rows of dqkv (N, 3d)
  column_sums(dqkv, N, d3, partial_, din_bias_, add);
  if (!needs_input_grad()) return;
  resize(dx, B, sample_, "Attention::dx");
  // dx (N, d) = dqkv (N, 3d) W_in (3d, d)
  gemm(false, false, N, d, d3, 1.0f, dqkv, d3, in_weight_, d, 0.0f, dx.data.data(), d, prec);
}

}  // namespace ddp
