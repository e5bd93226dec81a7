#include "model/attention.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "comm/check.hpp"
#include "model/backend.hpp"
#include "model/column_sums.hpp"
#include "model/elements.hpp"
#include "model/exp_fast.hpp"
#include "model/gemm.hpp"
#include "model/planes.hpp"  // for_each_team_thread

namespace ddp {

namespace {
// v holds at least n floats: a new (uninitialised) buffer where it is smaller.
void reserve(View1& v, std::int64_t n, const char* label) {
  if (static_cast<std::int64_t>(v.extent(0)) < n) v = make_buffer(label, n, /*uninitialised=*/true);
}

// db (n) += (or =, without `add`) the column sums of g (N, n), in double by
// column_sums: the same bits on any device and thread count. (Not the GEMV ones^T g:
// oneDNN's splits its sum between its threads, and gave other bits on 2 threads than
// on 1.) partial: grown to the (K, n) partial sums. g's elements through an accessor.
template <class G>
void bias_grads_of(const G& g, std::int64_t N, std::int64_t n, Kokkos::View<double*>& partial, float* db,
                   bool add) {
  float* const out[1] = {db};
  column_sums<1>(
      "Attention::bias_grad_stretches", "Attention::bias_grads", N, n, partial,
      KOKKOS_LAMBDA(std::int64_t r, std::int64_t j) {
        return Kokkos::Array<double, 1>{double(g(r * n + j))};
      },
      out, add);
}
void bias_grads(const float* g, std::int64_t N, std::int64_t n, Kokkos::View<double*>& partial, float* db,
                bool add) {
  bias_grads_of(Fp32Elements<const float>{g}, N, n, partial, db, add);
}
void bias_grads(const Tensor& g, std::int64_t N, std::int64_t n, Kokkos::View<double*>& partial, float* db,
                bool add) {
  if (g.type == Precision::fp32)
    bias_grads_of(elements<false>(g), N, n, partial, db, add);
  else
    bias_grads_of(elements<true>(g), N, n, partial, db, add);
}

// The two passes that make a row's probabilities, softmax_rows's and
// recompute_probs's alike (the same operations, so the same bits): row[j] becomes
// exp(row[j] - mx) for the k keys seen, computed up to a multiple of 16 keys (whole
// vectors on the host; scale_row sets a masked key's value to 0, whatever its
// exponential) ...
KOKKOS_INLINE_FUNCTION void exponentials(const ElementTeam::member_type& team, float* row, std::int64_t n,
                                         std::int64_t k, float mx) {
  const std::int64_t k16 = (k + 15) / 16 * 16 < n ? (k + 15) / 16 * 16 : n;
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, k16),
                       [&](std::int64_t j) { row[j] = exp_fast(row[j] - mx); });
}

// ... then row[j] * inv for them, 0 for the rest of the row's n.
KOKKOS_INLINE_FUNCTION void scale_row(const ElementTeam::member_type& team, float* row, std::int64_t n,
                                      std::int64_t k, float inv) {
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                       [&](std::int64_t j) { row[j] = j < k ? row[j] * inv : 0.0f; });
}

// s (nh, m, n): the scores of queries i0..i0+m-1 of each head over keys 0..n-1 (row r:
// head r / m, query i = i0 + r % m; the keep path passes its whole (B nh, T, T) with
// m = n = T). Each row becomes its softmax, in place; with `causal` query i sees keys
// 0..i, and the rest of the row is 0 (PyTorch's -inf mask). fp32 with the row's max
// subtracted, the sum of the exponentials in double. A team thread per row, its vector
// lanes along it. The exponentials in a pass of their own, before the sum (lane_sum): on
// the host each pass vectorises. stats (nh, T, 2), or null: each row's max and the
// reciprocal of its sum, at 2 (h T + i), from which recompute_probs makes the same bits.
void softmax_rows(float* s, std::int64_t rows, std::int64_t m, std::int64_t n, std::int64_t i0,
                  std::int64_t T, bool causal, float* stats) {
  for_each_team_thread(
      "Attention::softmax", rows, KOKKOS_LAMBDA(const ElementTeam::member_type& team, std::int64_t r) {
        float* row = s + r * n;
        const std::int64_t h = r / m, i = i0 + r - h * m, k = causal ? i + 1 : n;
        const float mx = lane_max(team, k, [&](std::int64_t j) { return row[j]; });
        exponentials(team, row, n, k, mx);
        const float inv =
            static_cast<float>(1.0 / lane_sum(team, k, [&](std::int64_t j) { return double(row[j]); }));
        scale_row(team, row, n, k, inv);
        if (stats != nullptr)
          Kokkos::single(Kokkos::PerThread(team), [&]() {
            stats[2 * (h * T + i)] = mx;
            stats[2 * (h * T + i) + 1] = inv;
          });
      });
}

// s (nh, m, n): the scores softmax_rows had, again (the same GEMM on the same
// operands); each row becomes the same probabilities, bit for bit, from the max and
// 1 / sum softmax_rows kept: the same two passes.
void recompute_probs(float* s, std::int64_t rows, std::int64_t m, std::int64_t n, std::int64_t i0,
                     std::int64_t T, bool causal, const float* stats) {
  for_each_team_thread(
      "Attention::recompute_probs", rows,
      KOKKOS_LAMBDA(const ElementTeam::member_type& team, std::int64_t r) {
        float* row = s + r * n;
        const std::int64_t h = r / m, i = i0 + r - h * m, k = causal ? i + 1 : n;
        const float mx = stats[2 * (h * T + i)], inv = stats[2 * (h * T + i) + 1];
        exponentials(team, row, n, k, mx);
        scale_row(team, row, n, k, inv);
      });
}

// ds (nh, m, n), rows as softmax_rows's, holds dP, the gradient of P; it becomes dS,
// that of the scores: dS = P (dP - sum_j P dP) per row, the dot in double (0 where P is
// masked).
void softmax_backward_rows(const float* p, float* ds, std::int64_t rows, std::int64_t m, std::int64_t n,
                           std::int64_t i0, bool causal) {
  for_each_team_thread(
      "Attention::softmax_backward", rows,
      KOKKOS_LAMBDA(const ElementTeam::member_type& team, std::int64_t r) {
        const float* pr = p + r * n;
        float* gr = ds + r * n;
        const std::int64_t h = r / m, i = i0 + r - h * m, k = causal ? i + 1 : n;
        const float c =
            static_cast<float>(lane_sum(team, k, [&](std::int64_t j) { return double(pr[j]) * gr[j]; }));
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                             [&](std::int64_t j) { gr[j] = j < k ? pr[j] * (gr[j] - c) : 0.0f; });
      });
}

// The default rows a block (attention.hpp). On the host 128: measured on 2 cores, a
// causal GPT of d 64 went 1.2x faster at T = 256 and 1.9x at T = 1024 than with P kept,
// the masked corner skipped and a block's scores in cache; at T = 64 no faster. On a GPU
// the largest power of two up to 512 (at least 16) whose (nh, rows, T) scores take at
// most 64 MiB: fewer, larger GEMMs for the launches' sake.
#if defined(KOKKOS_ENABLE_CUDA)
constexpr bool kOnDevice = true;
#else
constexpr bool kOnDevice = false;
#endif
constexpr std::int64_t kHostRows = 128, kDeviceRows = 512, kBlockBytes = std::int64_t(64) << 20;

std::int64_t default_rows(std::int64_t nh, std::int64_t T) {
  if (!kOnDevice) return kHostRows;
  std::int64_t rows = 16;
  while (rows < kDeviceRows && nh * 2 * rows * T * std::int64_t(sizeof(float)) <= kBlockBytes) rows *= 2;
  return rows;
}

// Query rows a block: 0 for the keep path; the option's rows (at most T); by default
// the keep path up to default_rows tokens, blocks of default_rows above.
std::int64_t resolve_rows(std::int64_t option, std::int64_t nh, std::int64_t T) {
  if (option == 0) return 0;
  if (option > 0) return option < T ? option : T;
  const std::int64_t rows = default_rows(nh, T);
  return T <= rows ? 0 : rows;
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
  rows_ = resolve_rows(block_, heads_, T_);
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

// The scores of queries i0..i0+m-1 of sample b over keys 0..n-1, (nh, m, n) into s:
// S_h = Q_h K_h^T / sqrt(hs), per head. Head h of sample b is the hs columns at h hs
// (Q), d + h hs (K) and 2d + h hs (V) of the sample's T rows of 3d in qkv: the nh heads
// are one batched GEMM whose operands are hs columns apart, and samples b, b+1, ...
// (the keep path: all B) groups of them T rows apart, their scores nh m n apart.
void Attention::scores(const float* qkv, std::int64_t b, std::int64_t i0, std::int64_t m, std::int64_t n,
                       float* s, std::int64_t samples) const {
  const std::int64_t T = T_, d = d_, hs = hs_, d3 = 3 * d;
  const float* q = qkv + b * T * d3;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  gemm_batched_groups(false, true, m, n, hs, scale, q + i0 * d3, d3, q + d, d3, 0.0f, s, n, heads_,
                      {hs, hs, m * n}, samples, {T * d3, T * d3, heads_ * m * n}, precision());
}

// What forward and backward below hold at batch B: qkv, O and P (the keep path) or
// the rows' statistics, kept; dO, dQKV, dS, the block's scores and the narrow copies
// in shared slots.
std::int64_t Attention::kept_floats(std::int64_t B) const {
  const std::int64_t N = B * T_, nh = heads_;
  const bool keep = !runs_fused() && rows_ == 0;
  return 3 * N * d_ + N * d_ + (keep ? B * nh * T_ * T_ : B * nh * T_ * 2);
}

void Attention::scratch_floats(std::int64_t B, SlotFloats& most) const {
  const std::int64_t N = B * T_, nh = heads_, d = d_;
  const bool fused = runs_fused(), keep = !fused && rows_ == 0;
  const std::int64_t ds = fused ? B * nh * T_ : keep ? B * nh * T_ * T_ : nh * rows_ * T_;
  const auto raise = [&](ScratchSlot slot, std::int64_t floats) {
    std::int64_t& m = most[std::size_t(slot)];
    m = std::max(m, floats);
  };
  const auto narrow = [&](std::int64_t n) { return compute_backend().narrow_copy_floats(n, precision()); };
  raise(ScratchSlot::attention_do, N * d);
  raise(ScratchSlot::attention_dqkv, 3 * N * d);
  raise(ScratchSlot::attention_ds, ds);
  // dy's copy (none of a narrow dy: read as it is), then dqkv's
  raise(ScratchSlot::narrow_dy, std::max(out_type_ == Precision::fp32 ? narrow(N * d) : 0,
                                         needs_input_grad() ? narrow(3 * N * d) : 0));
  if (fused) return;
  if (!keep) raise(ScratchSlot::attention_block_scores, nh * rows_ * T_);
  raise(ScratchSlot::narrow_qkv, narrow(3 * N * d));
  raise(ScratchSlot::narrow_do, narrow(N * d));
  raise(ScratchSlot::narrow_ds, narrow(ds));
}

bool Attention::runs_fused() const {
  return fused_ && compute_backend().has_fused_attention(hs_, precision());
}

// x: (B, T, d) -> y: (B, T, d). The GEMMs of the projections over the N = B T rows;
// those of the heads per sample (and block), on the heads' columns in place.
void Attention::forward(const Tensor& x, Tensor& y, bool training) {
  forward_adding(x, nullptr, y, training);
}

void Attention::forward_adding(const Tensor& x, const Tensor* add, Tensor& y, bool /*training*/) {
  require_nchw(x, in_type_, "attention", "the input");
  const std::int64_t B = x.batch(), T = T_, d = d_, nh = heads_, hs = hs_, N = B * T, d3 = 3 * d;
  const bool fused = runs_fused(), keep = !fused && rows_ == 0;
  ran_fused_ = fused;
  reserve(qkv_, N * d3, "Attention::qkv");
  SharedScratch scratch;  // the block path's scores: the process's shared slot (tensor.hpp)
  if (keep)
    reserve(p_, B * nh * T * T, "Attention::p");
  else if (!fused)
    scratch.hold(p_, ScratchSlot::attention_block_scores, nh * rows_ * T, "Attention::block_scores");
  if (!keep) reserve(stats_, B * nh * T * 2, "Attention::stats");
  reserve(o_, N * d, "Attention::o");
  resize(y, B, sample_, "Attention::y", Layout::nchw, out_type_);
  const Precision prec = precision();
  float *qkv = qkv_.data(), *p = p_.data(), *o = o_.data();

  // qkv (N, 3d) = x (N, d) W_in^T (d, 3d) + b_in
  GemmEpilogue in_bias;
  in_bias.bias = in_bias_;
  gemm_epilogue(false, true, N, d3, d, x.data.data(), d, in_weight_, d, qkv, d3, prec,
                {x.type, Precision::fp32, Precision::fp32}, in_bias);
  // The heads' products read qkv three times (Q, K, V) and more on the block path:
  // narrowed once (the fused kernels read it as it is).
  std::optional<NarrowedOnce> qkv_once;
  if (!fused) qkv_once.emplace(ScratchSlot::narrow_qkv, qkv, N * d3, prec, "Attention::qkv_narrow");
  // O_h (m, hs) = P (m, n) V_h (n, hs), into the heads' columns of O's rows i0..:
  // (nh, m, hs) -> (m, nh, hs), the rows of (B, T, d); samples b, b+1, ... at once
  // (the keep path: all B, as scores).
  const auto mix = [&](std::int64_t b, std::int64_t i0, std::int64_t m, std::int64_t n, const float* pb,
                       std::int64_t samples) {
    gemm_batched_groups(false, false, m, hs, n, 1.0f, pb, n, qkv + b * T * d3 + 2 * d, d3, 0.0f,
                        o + (b * T + i0) * d, d, nh, {m * n, hs, hs}, samples, {nh * m * n, T * d3, T * d},
                        prec);
  };
  if (fused) {
    compute_backend().fused_attention_forward({B, T, nh, hs, causal_}, qkv, o, stats_.data());
  } else if (keep) {
    scores(qkv, 0, 0, T, T, p, B);
    softmax_rows(p, B * nh * T, T, T, 0, T, causal_, nullptr);  // (B, nh, T, T): S -> P
    mix(0, 0, T, T, p, B);
  } else {
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i0 = 0; i0 < T; i0 += rows_) {
        const std::int64_t m = i0 + rows_ < T ? rows_ : T - i0, n = causal_ ? i0 + m : T;
        scores(qkv, b, i0, m, n, p);
        softmax_rows(p, nh * m, m, n, i0, T, causal_, stats_.data() + b * nh * T * 2);
        mix(b, i0, m, n, p, 1);
      }
  }
  // y (N, d) = O (N, d) W_out^T (d, d) + b_out
  GemmEpilogue out_bias;
  out_bias.bias = out_bias_;
  if (add) {  // y = add + (O W_out^T + b_out): a transformer block's residual sum
    DDP_REQUIRE(add->type == Precision::fp32 && y.type == Precision::fp32 && add->numel() == N * d,
                "attention: a residual of another shape or type than its fp32 output");
    out_bias.add = add->data.data();
  }
  gemm_epilogue(false, true, N, d, d, o, d, out_weight_, d, y.data.data(), d, prec,
                {Precision::fp32, Precision::fp32, y.type}, out_bias);
}

// dy: (B, T, d) -> dx: (B, T, d), from forward's qkv_, o_ and p_ or stats_ (left as
// they are, so backward may run again). The parameter gradients += (or =, while
// overwrite_gradients() is on); the biases' as column sums in double (column_sums).
void Attention::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  require_nchw(dy, out_type_, "attention", "the output gradient");
  const std::int64_t B = x.batch(), T = T_, d = d_, nh = heads_, hs = hs_, N = B * T, d3 = 3 * d;
  const bool fused = ran_fused_, keep = !fused && rows_ == 0;  // forward's path: its buffers
  SharedScratch scratch;  // the process's shared slots (tensor.hpp), let go on return
  if (!fused && !keep)
    scratch.hold(p_, ScratchSlot::attention_block_scores, nh * rows_ * T, "Attention::block_scores");
  scratch.hold(do_, ScratchSlot::attention_do, N * d, "Attention::do");
  scratch.hold(dqkv_, ScratchSlot::attention_dqkv, N * d3, "Attention::dqkv");
  scratch.hold(ds_, ScratchSlot::attention_ds,
               fused  ? B * nh * T
               : keep ? B * nh * T * T
                      : nh * rows_ * T,
               "Attention::ds");
  const Precision prec = precision();
  const bool add = !overwrite_gradients();
  const float beta = add ? 1.0f : 0.0f;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  const float *xp = x.data.data(), *dyp = dy.data.data(), *qkv = qkv_.data(), *o = o_.data();
  float *p = p_.data(), *dO = do_.data(), *dqkv = dqkv_.data(), *ds = ds_.data();

  // db_out (d) += sum over the N rows of dy (N, d)
  bias_grads(dy, N, d, partial_, dout_bias_, add);
  {
    // Read by two products: narrowed once (a narrow dy is read as it is).
    std::optional<NarrowedOnce> dy_once;
    if (dy.type == Precision::fp32)
      dy_once.emplace(ScratchSlot::narrow_dy, dyp, N * d, prec, "Attention::dy_narrow");
    // dW_out (d, d) += dy^T (d, N) O (N, d)
    gemm_stored(true, false, d, d, N, 1.0f, dyp, d, o, d, beta, dout_weight_, d, prec,
                {dy.type, Precision::fp32, Precision::fp32});
    // dO (N, d) = dy (N, d) W_out (d, d)
    gemm_stored(false, false, N, d, d, 1.0f, dyp, d, out_weight_, d, 0.0f, dO, d, prec,
                {dy.type, Precision::fp32, Precision::fp32});
  }
  // The heads' products read qkv and dO (and dS) more than once: narrowed once each.
  std::optional<NarrowedOnce> qkv_once, do_once;
  if (!fused) {
    qkv_once.emplace(ScratchSlot::narrow_qkv, qkv, N * d3, prec, "Attention::qkv_narrow");
    do_once.emplace(ScratchSlot::narrow_do, dO, N * d, prec, "Attention::do_narrow");
  }
  // The heads batched, as in forward, for queries i0..i0+m-1 of samples b, b+1, ...
  // (the keep path: all B) over keys 0..n-1, with P (nh, m, n) a sample in pb and dP
  // then dS in dsb. dV and dK of keys 0..n-1 are sums over the query blocks: = by the
  // first block done (one over all T keys), += by the others (kv_beta).
  const auto p_and_v = [&](std::int64_t b, std::int64_t i0, std::int64_t m, std::int64_t n, const float* pb,
                           float* dsb, float kv_beta, std::int64_t samples) {
    const float* dob = dO + (b * T + i0) * d;
    const GemmSteps sample_steps{nh * m * n, T * d, T * d3};
    // dP (m, n) = dO_h (m, hs) V_h^T (hs, n), into dS's place
    gemm_batched_groups(false, true, m, n, hs, 1.0f, dob, d, qkv + b * T * d3 + 2 * d, d3, 0.0f, dsb, n, nh,
                        {hs, hs, m * n}, samples, {T * d, T * d3, nh * m * n}, prec);
    // dV_h (n, hs) (+)= P^T (n, m) dO_h (m, hs)
    gemm_batched_groups(true, false, n, hs, m, 1.0f, pb, n, dob, d, kv_beta, dqkv + b * T * d3 + 2 * d, d3,
                        nh, {m * n, hs, hs}, samples, sample_steps, prec);
  };
  const auto q_and_k = [&](std::int64_t b, std::int64_t i0, std::int64_t m, std::int64_t n, const float* dsb,
                           float kv_beta, std::int64_t samples) {
    const float* q = qkv + b * T * d3;
    float* dq = dqkv + b * T * d3;
    const GemmSteps sample_steps{nh * m * n, T * d3, T * d3};
    // dQ_h (m, hs) = dS (m, n) K_h (n, hs) / sqrt(hs)
    gemm_batched_groups(false, false, m, hs, n, scale, dsb, n, q + d, d3, 0.0f, dq + i0 * d3, d3, nh,
                        {m * n, hs, hs}, samples, sample_steps, prec);
    // dK_h (n, hs) (+)= dS^T (n, m) Q_h (m, hs) / sqrt(hs)
    gemm_batched_groups(true, false, n, hs, m, scale, dsb, n, q + i0 * d3, d3, kv_beta, dq + d, d3, nh,
                        {m * n, hs, hs}, samples, sample_steps, prec);
  };
  if (fused) {
    compute_backend().fused_attention_backward({B, T, nh, hs, causal_}, qkv, o, dO, stats_.data(), ds, dqkv);
  } else if (keep) {
    p_and_v(0, 0, T, T, p, ds, 0.0f, B);
    softmax_backward_rows(p, ds, B * nh * T, T, T, 0, causal_);  // (B, nh, T, T): dP -> dS
    const NarrowedOnce ds_once(ScratchSlot::narrow_ds, ds, B * nh * T * T, prec, "Attention::ds_narrow");
    q_and_k(0, 0, T, T, ds, 0.0f, B);
  } else {
    // The last block first: it sees all T keys (causal or not), so its = covers every
    // row of dK and dV before the others add to theirs.
    const std::int64_t last = (T - 1) / rows_ * rows_;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i0 = last; i0 >= 0; i0 -= rows_) {
        const std::int64_t m = i0 + rows_ < T ? rows_ : T - i0, n = causal_ ? i0 + m : T;
        const float kv_beta = i0 == last ? 0.0f : 1.0f;
        scores(qkv, b, i0, m, n, p);
        recompute_probs(p, nh * m, m, n, i0, T, causal_, stats_.data() + b * nh * T * 2);
        p_and_v(b, i0, m, n, p, ds, kv_beta, 1);
        softmax_backward_rows(p, ds, nh * m, m, n, i0, causal_);
        const NarrowedOnce ds_once(ScratchSlot::narrow_ds, ds, nh * m * n, prec, "Attention::ds_narrow",
                                   nh * rows_ * T);
        q_and_k(b, i0, m, n, ds, kv_beta, 1);
      }
  }
  qkv_once.reset();
  do_once.reset();
  // dqkv (B, nh, T, hs) x 3 sit in (B, T, 3d) already: the heads wrote their columns.
  // db_in (3d) += sum over the N rows of dqkv (N, 3d)
  bias_grads(dqkv, N, d3, partial_, din_bias_, add);
  // Read by two products where dx is wanted: narrowed once.
  std::optional<NarrowedOnce> dqkv_once;
  if (needs_input_grad())
    dqkv_once.emplace(ScratchSlot::narrow_dy, dqkv, N * d3, prec, "Attention::dqkv_narrow");
  // dW_in (3d, d) += dqkv^T (3d, N) x (N, d)
  gemm_stored(true, false, d3, d, N, 1.0f, dqkv, d3, xp, d, beta, din_weight_, d, prec,
              {Precision::fp32, x.type, Precision::fp32});
  if (!needs_input_grad()) return;
  resize(dx, B, sample_, "Attention::dx", Layout::nchw, in_type_);
  // dx (N, d) = dqkv (N, 3d) W_in (3d, d)
  gemm_stored(false, false, N, d, d3, 1.0f, dqkv, d3, in_weight_, d, 0.0f, dx.data.data(), d, prec,
              {Precision::fp32, Precision::fp32, in_type_});
}

}  // namespace ddp
