#include "model/batchnorm.hpp"

#include <cmath>

#include "comm/check.hpp"
#include "comm/communicator.hpp"

namespace ddp {

namespace {
#if KOKKOS_VERSION >= 30700
using Kokkos::sqrt;
#else
using Kokkos::Experimental::sqrt;
#endif
}  // namespace

// sums(c) = sum of f(c, e), sums(C + c) = sum of g(c, e) over the elements e of channel c
// in a (B, C, HW) tensor: one team per channel, its threads over the batch, their
// vector lanes over the plane. (A thread per channel summing B * HW values in turn,
// as this was, left a GPU all but idle.) In double, so E[x^2] - E[x]^2 stays exact
// enough for any batch; a fixed order per launch shape, so runs repeat bit for bit.
namespace {
template <class F, class G>
void channel_sums(const char* label, std::int64_t B, std::int64_t C, std::int64_t hw,
                  Kokkos::View<double*> sums, F f, G g) {
  using Team = Kokkos::TeamPolicy<ExecSpace>;
  const int lanes = Team::vector_length_max() < 32 ? Team::vector_length_max() : 32;
  Kokkos::parallel_for(
      label, Team(C, Kokkos::AUTO, lanes), KOKKOS_LAMBDA(const Team::member_type& team) {
        const std::int64_t c = team.league_rank();
        double sf = 0.0, sg = 0.0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, B),
            [&](std::int64_t b, double& acc) {
              const std::int64_t base = (b * C + c) * hw;
              double part = 0.0;
              Kokkos::parallel_reduce(
                  Kokkos::ThreadVectorRange(team, hw),
                  [&](std::int64_t i, double& v) { v += f(c, base + i); }, part);
              acc += part;
            },
            sf);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, B),
            [&](std::int64_t b, double& acc) {
              const std::int64_t base = (b * C + c) * hw;
              double part = 0.0;
              Kokkos::parallel_reduce(
                  Kokkos::ThreadVectorRange(team, hw),
                  [&](std::int64_t i, double& v) { v += g(c, base + i); }, part);
              acc += part;
            },
            sg);
        Kokkos::single(Kokkos::PerTeam(team), [&] {
          sums(c) = sf;
          sums(C + c) = sg;
        });
      });
}
}  // namespace

Shape BatchNorm2d::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 3)
    throw InputError("batchnorm2d needs an image input (channels, height, width) but gets " +
                     shape_str(in_sample));
  c_ = in_sample[0];
  hw_ = in_sample[1] * in_sample[2];
  sample_ = in_sample;
  sums_ = Kokkos::View<double*>("BatchNorm2d::sums", 2 * c_ + 1);
  sums_host_ = Kokkos::create_mirror_view(sums_);
  mean_ = Kokkos::View<float*>("BatchNorm2d::mean", c_);
  invstd_ = Kokkos::View<float*>("BatchNorm2d::invstd", c_);
  return in_sample;
}

std::vector<Layer::ParamSpec> BatchNorm2d::parameter_specs() const {
  return {{"weight", {c_}}, {"bias", {c_}}};
}

void BatchNorm2d::bind(float* params, float* grads) {
  weight_ = params;
  bias_ = params + c_;
  dweight_ = grads;
  dbias_ = grads + c_;
}

std::vector<Layer::ParamSpec> BatchNorm2d::buffer_specs() const {
  return {{"running_mean", {c_}}, {"running_var", {c_}}, {"num_batches_tracked", {}}};
}

void BatchNorm2d::bind_buffers(float* buffers) {
  running_mean_ = buffers;
  running_var_ = buffers + c_;
  batches_tracked_ = buffers + 2 * c_;
}

// PyTorch's reset: gamma 1, beta 0, running mean 0, running var 1, no batches yet.
void BatchNorm2d::init(Rng& /*rng*/) {
  const std::int64_t C = c_;
  float *w = weight_, *b = bias_, *rm = running_mean_, *rv = running_var_, *nb = batches_tracked_;
  Kokkos::parallel_for(
      "BatchNorm2d::init", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        w[c] = 1.0f;
        b[c] = 0.0f;
        rm[c] = 0.0f;
        rv[c] = 1.0f;
        if (c == 0) *nb = 0.0f;
      });
}

// On the sums where they are (device memory on a GPU): no copy to the host and back.
void BatchNorm2d::allreduce(Kokkos::View<double*> sums, std::size_t n) {
  if (comm_) comm_->allreduce_sum(sums.data(), n);
}

// x: (B, C, H, W) -> y: (B, C, H, W) = (x - mean) * invstd * gamma + beta
void BatchNorm2d::forward(const Tensor& x, Tensor& y, bool training) {
  const std::int64_t B = x.batch(), C = c_, hw = hw_;
  resize(y, B, sample_, "BatchNorm2d::y");
  ConstView1 xv = x.data;
  View1 yv = y.data;
  auto mean = mean_, invstd = invstd_;
  const float eps = eps_;
  normalised_by_batch_ = training;
  if (training) {
    // Per-channel sums in double: E[x^2] - E[x]^2 stays accurate for any batch.
    auto sums = sums_;
    channel_sums(
        "BatchNorm2d::forward_sums", B, C, hw, sums,
        KOKKOS_LAMBDA(std::int64_t, std::int64_t e) { return double(xv(e)); },
        KOKKOS_LAMBDA(std::int64_t, std::int64_t e) { return double(xv(e)) * xv(e); });
    Kokkos::parallel_for(
        "BatchNorm2d::count", Range(0, 1), KOKKOS_LAMBDA(int) { sums(2 * C) = double(B * hw); });
    allreduce(sums_, 2 * C + 1);
    // The count over ranks only SyncBatchNorm needs to ask (a host wait); per rank it is known.
    if (comm_) {
      Kokkos::deep_copy(sums_host_, sums_);
      count_ = static_cast<std::int64_t>(sums_host_(2 * C));
    } else {
      count_ = B * hw;
    }
    if (count_ < 2) throw InputError("batchnorm2d in training needs more than 1 value per channel");
    const double n = double(count_), unbias = n / (n - 1.0), m = momentum_;
    float *rm = running_mean_, *rv = running_var_, *nb = batches_tracked_;
    Kokkos::parallel_for(
        "BatchNorm2d::forward_stats", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
          const double mu = sums(c) / n, d = sums(C + c) / n - mu * mu, var = d > 0.0 ? d : 0.0;
          mean(c) = static_cast<float>(mu);
          invstd(c) = static_cast<float>(1.0 / sqrt(var + eps));
          rm[c] = static_cast<float>((1.0 - m) * rm[c] + m * mu);
          rv[c] = static_cast<float>((1.0 - m) * rv[c] + m * var * unbias);
          if (c == 0) *nb += 1.0f;
        });
  } else {
    const float *rm = running_mean_, *rv = running_var_;
    Kokkos::parallel_for(
        "BatchNorm2d::forward_running_stats", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
          mean(c) = rm[c];
          invstd(c) = 1.0f / sqrt(rv[c] + eps);
        });
  }
  const float *w = weight_, *b = bias_;
  Kokkos::parallel_for(
      "BatchNorm2d::forward", Range(0, B * C * hw), KOKKOS_LAMBDA(std::int64_t e) {
        const std::int64_t c = (e / hw) % C;
        yv(e) = (xv(e) - mean(c)) * invstd(c) * w[c] + b[c];
      });
}

// dy: (B, C, H, W) -> dgamma += sum dy xhat, dbeta += sum dy (this rank's samples);
// dx = gamma invstd (dy - sum(dy)/N - xhat sum(dy xhat)/N) with the sums over all N
// values of the channel (all ranks when synchronised); in eval dx = gamma invstd dy.
void BatchNorm2d::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  const std::int64_t B = x.batch(), C = c_, hw = hw_;
  ConstView1 xv = x.data, dyv = dy.data;
  auto mean = mean_, invstd = invstd_;
  auto sums = sums_;
  float *dw = dweight_, *db = dbias_;
  channel_sums(
      "BatchNorm2d::backward_sums", B, C, hw, sums,
      KOKKOS_LAMBDA(std::int64_t, std::int64_t e) { return double(dyv(e)); },
      KOKKOS_LAMBDA(std::int64_t c, std::int64_t e) {
        return double(dyv(e)) * ((xv(e) - mean(c)) * invstd(c));
      });
  Kokkos::parallel_for(
      "BatchNorm2d::backward_param_grads", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        db[c] += static_cast<float>(sums(c));
        dw[c] += static_cast<float>(sums(C + c));
      });
  if (!needs_input_grad()) return;
  resize(dx, B, sample_, "BatchNorm2d::dx");
  View1 dxv = dx.data;
  const float* w = weight_;
  if (!normalised_by_batch_) {
    Kokkos::parallel_for(
        "BatchNorm2d::backward_eval", Range(0, B * C * hw), KOKKOS_LAMBDA(std::int64_t e) {
          const std::int64_t c = (e / hw) % C;
          dxv(e) = dyv(e) * w[c] * invstd(c);
        });
    return;
  }
  allreduce(sums_, 2 * C);
  const float inv_n = 1.0f / static_cast<float>(count_);
  Kokkos::parallel_for(
      "BatchNorm2d::backward", Range(0, B * C * hw), KOKKOS_LAMBDA(std::int64_t e) {
        const std::int64_t c = (e / hw) % C;
        const float xhat = (xv(e) - mean(c)) * invstd(c);
        const float mdy = static_cast<float>(sums(c)) * inv_n, mdyx = static_cast<float>(sums(C + c)) * inv_n;
        dxv(e) = w[c] * invstd(c) * (dyv(e) - mdy - xhat * mdyx);
      });
}

}  // namespace ddp
