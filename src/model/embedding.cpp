#include "model/embedding.hpp"

#include <algorithm>

#include "comm/check.hpp"

namespace ddp {

namespace {
void require_plain(const Tensor& t, const char* layer, const char* what) {
  DDP_REQUIRE(t.type == Precision::fp32 && t.layout == Layout::nchw,
              layer << ": " << what << " is " << precision_name(t.type) << " in " << layout_name(t.layout)
                    << ", not fp32 in nchw");
}
}  // namespace

Shape Embedding::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 1)
    throw InputError("embedding needs a sequence of token ids (T) but gets " + shape_str(in_sample) +
                     " (token shards with data.seq_len give (T))");
  T_ = in_sample[0];
  sample_ = {T_, d_};
  return sample_;
}

std::vector<Layer::ParamSpec> Embedding::parameter_specs() const { return {{"weight", {vocab_, d_}}}; }

void Embedding::bind(float* params, float* grads) {
  weight_ = params;
  dweight_ = grads;
}

void Embedding::init(Rng& rng) { fill_normal(weight_, vocab_ * d_, 0.0f, stddev_, rng.next_u64()); }

// x: (B, T) ids as floats -> y: (B, T, d), a thread per (row, feature).
void Embedding::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  require_plain(x, "embedding", "the input");
  const std::int64_t d = d_, rows = x.numel();
  resize(y, x.batch(), sample_, "Embedding::y");
  ConstView1 ids = x.data;
  View1 yv = y.data;
  const float* w = weight_;
  Kokkos::parallel_for(
      "Embedding::forward", Range(0, rows * d), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t r = i / d, j = i - r * d;
        yv(i) = w[static_cast<std::int64_t>(ids(r)) * d + j];
      });
}

// dweight(v, :) (+)= sum over the rows r with id v of dy(r, :): a thread per feature
// j walks the rows in order, so every sum has one fixed order. On the GPU d threads
// are a few of its thousands, each walking every row (GPT-2: 768 threads, 16,384
// rows): there the table goes in blocks of ids, a thread per (block, feature) walking
// every row and adding those whose id is in its block, the same sums in the same
// order. The whole table when overwriting: the rows of ids the batch lacks are zeros.
void Embedding::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& /*dx*/) {
  require_plain(dy, "embedding", "the output gradient");
  const std::int64_t d = d_, rows = x.numel();
  float* dw = dweight_;
  if (overwrite_gradients())
    Kokkos::parallel_for(
        "Embedding::backward_zero", Range(0, vocab_ * d), KOKKOS_LAMBDA(std::int64_t i) { dw[i] = 0.0f; });
  ConstView1 ids = x.data, g = dy.data;
#if defined(KOKKOS_ENABLE_CUDA)
  const std::int64_t blocks = std::max<std::int64_t>(1, std::min<std::int64_t>(vocab_, 65536 / d));
#else
  const std::int64_t blocks = 1;
#endif
  const std::int64_t per = (vocab_ + blocks - 1) / blocks;
  Kokkos::parallel_for(
      "Embedding::backward", Range(0, blocks * d), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t k = i / d, j = i - k * d, lo = k * per, hi = lo + per;
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t v = static_cast<std::int64_t>(ids(r));
          if (v >= lo && v < hi) dw[v * d + j] += g(r * d + j);
        }
      });
}

Shape PosEmbedding::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 2)
    throw InputError("pos_embedding needs a sequence (tokens, features) but gets " + shape_str(in_sample));
  if (in_sample[0] > positions_)
    throw InputError("pos_embedding(" + std::to_string(positions_) + ") has " + std::to_string(positions_) +
                     " positions but the sequence has " + std::to_string(in_sample[0]) +
                     " tokens (data.seq_len): raise its positions or lower data.seq_len");
  T_ = in_sample[0];
  d_ = in_sample[1];
  sample_ = in_sample;
  return in_sample;
}

std::vector<Layer::ParamSpec> PosEmbedding::parameter_specs() const { return {{"weight", {positions_, d_}}}; }

void PosEmbedding::bind(float* params, float* grads) {
  weight_ = params;
  dweight_ = grads;
}

void PosEmbedding::init(Rng& rng) { fill_normal(weight_, positions_ * d_, 0.0f, stddev_, rng.next_u64()); }

// y(b, t, j) = x(b, t, j) + P(t, j)
void PosEmbedding::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  require_plain(x, "pos_embedding", "the input");
  resize(y, x.batch(), sample_, "PosEmbedding::y");
  const std::int64_t per = T_ * d_;
  const float* xp = x.data.data();
  float* yp = y.data.data();
  const float* w = weight_;
  // (sample, element of its T d): no division an element, and on the host each
  // sample's T d a contiguous, vectorised loop.
  const Rows2 all = rows_range(x.batch(), per);
  Kokkos::parallel_for(
      "PosEmbedding::forward", all,
      KOKKOS_LAMBDA(std::int64_t b, std::int64_t i) { yp[b * per + i] = xp[b * per + i] + w[i]; });
}

// dx = dy; dP(t, j) (+)= sum over b of dy(b, t, j), in batch order.
void PosEmbedding::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  require_plain(dy, "pos_embedding", "the output gradient");
  const std::int64_t per = T_ * d_, B = x.batch();
  ConstView1 g = dy.data;
  float* dw = dweight_;
  const bool add = !overwrite_gradients();
  const std::int64_t all = positions_ * d_;
  Kokkos::parallel_for(
      "PosEmbedding::backward_param_grads", Range(0, all), KOKKOS_LAMBDA(std::int64_t i) {
        float s = 0.0f;
        if (i < per)
          for (std::int64_t b = 0; b < B; ++b) s += g(b * per + i);
        dw[i] = add ? dw[i] + s : s;
      });
  if (!needs_input_grad()) return;
  resize(dx, x.batch(), sample_, "PosEmbedding::dx");
  // A kernel on the stream, not a View deep_copy (which fences the device: a host wait
  // inside backward, and no CUDA graph could hold it).
  View1 dxv = dx.data;
  Kokkos::parallel_for(
      "PosEmbedding::backward_dx", Range(0, x.numel()), KOKKOS_LAMBDA(std::int64_t i) { dxv(i) = g(i); });
}

}  // namespace ddp
