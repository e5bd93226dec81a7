#include "train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "comm/check.hpp"
#include "model/tensor.hpp"
#include "train/adamw_host.hpp"

namespace ddp {

Optimizer::~Optimizer() = default;

// The device-callable math functions moved from Kokkos::Experimental to Kokkos in 3.7.
#if KOKKOS_VERSION >= 30700
namespace kmath = Kokkos;
#else
namespace kmath = Kokkos::Experimental;
#endif

// The kernels are free functions with external linkage: CUDA's extended lambdas
// may not live in private members or in functions local to a translation unit.
// Arithmetic is in float like PyTorch's; scalars derived from lr are rounded once.

// Where weight decay applies: decays(i) != 0, or everywhere when decays is empty
// (no parameter left out: no mask read).
using DecayMask = Kokkos::View<const std::uint8_t*>;

// torch.optim.SGD, dampening 0. buf (n) is unused when momentum is 0.
// The gradient is g * scale, rounded to float before use, as if it had been scaled
// in place first.
void sgd_update(Kokkos::View<float*> p, Kokkos::View<const float*> g, float scale, Kokkos::View<float*> buf,
                float lr, float weight_decay, DecayMask decays, float momentum, bool nesterov,
                bool first_step) {
  const bool masked = decays.extent(0) > 0;
  Kokkos::parallel_for(
      "SGD::step", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>(0, p.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) {
        const float gi = g(i) * scale;
        const float wd = masked && !decays(i) ? 0.0f : weight_decay;
        float d = gi + wd * p(i);
        if (momentum != 0.0f) {
          const float b = first_step ? d : momentum * buf(i) + d;
          buf(i) = b;
          d = nesterov ? d + momentum * b : b;
        }
        p(i) -= lr * d;
      });
}

// torch.optim.AdamW (amsgrad off): decoupled decay, then the Adam step with
// step_size = lr / bias_correction1 and denom = sqrt(v) / sqrt(bias_correction2) + eps.
void adamw_update(Kokkos::View<float*> p, Kokkos::View<const float*> g, float scale, Kokkos::View<float*> m,
                  Kokkos::View<float*> v, float decay, DecayMask decays, float beta1, float beta2,
                  float one_minus_beta1, float one_minus_beta2, float step_size, float bias_correction2_sqrt,
                  float eps) {
  const bool masked = decays.extent(0) > 0;
#if defined(KOKKOS_ENABLE_CUDA)
  Kokkos::parallel_for(
      "AdamW::step", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>(0, p.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) {
        const float gi = g(i) * scale;
        p(i) *= masked && !decays(i) ? 1.0f : decay;
        m(i) = beta1 * m(i) + one_minus_beta1 * gi;
        v(i) = beta2 * v(i) + one_minus_beta2 * gi * gi;
        const float denom = kmath::sqrt(v(i)) / bias_correction2_sqrt + eps;
        p(i) -= step_size * m(i) / denom;
      });
#else
  adamw_update_host(p.data(), g.data(), scale, m.data(), v.data(), p.extent(0), decay,
                    masked ? decays.data() : nullptr, beta1, beta2, one_minus_beta1, one_minus_beta2, step_size,
                    bias_correction2_sqrt, eps);
#endif
}

namespace {

// 1 where weight decay applies, 0 in the no_decay ranges; empty when there are none
// or there is no decay.
// Of the owned range only: element i is the flat buffer's owned.offset + i.
Kokkos::View<std::uint8_t*> decay_mask(const TrainConfig& cfg, ParamRange owned,
                                       const std::vector<ParamRange>& no_decay) {
  if (no_decay.empty() || cfg.weight_decay == 0.0) return {};
  Kokkos::View<std::uint8_t*> mask("Optimizer::decays", std::size_t(owned.size));
  auto mask_host = Kokkos::create_mirror_view(mask);
  for (std::int64_t i = 0; i < owned.size; ++i) mask_host(i) = 1;
  for (const ParamRange& r : no_decay)
    for (std::int64_t i = std::max(r.offset, owned.offset); i < std::min(r.offset + r.size, owned.offset + owned.size);
         ++i)
      mask_host(i - owned.offset) = 0;
  Kokkos::deep_copy(mask, mask_host);
  return mask;
}

void check_sizes(const Kokkos::View<float*>& p, const Kokkos::View<const float*>& g, std::size_t n) {
  DDP_REQUIRE(p.extent(0) == n && g.extent(0) == n, "optimizer built for " << n << " parameters got params "
                                                                           << p.extent(0) << ", grads "
                                                                           << g.extent(0));
}

// The owned range of a whole buffer.
template <class V>
V owned_part(const V& whole, Optimizer::Range r) {
  return Kokkos::subview(whole, std::make_pair(std::size_t(r.offset), std::size_t(r.offset + r.size)));
}

class SGD : public Optimizer {
 public:
  SGD(const TrainConfig& cfg, std::size_t n, Range owned, Kokkos::View<std::uint8_t*> decays)
      : n_(n),
        momentum_(cfg.momentum),
        weight_decay_(cfg.weight_decay),
        nesterov_(cfg.nesterov),
        decays_(decays) {
    owned_ = owned;
    if (momentum_ != 0.0) buf_ = make_buffer("SGD::momentum_buffer", owned.size);
  }

  void step(Kokkos::View<float*> params, Kokkos::View<const float*> grads, double lr,
            float grad_scale) override {
    check_sizes(params, grads, n_);
    sgd_update(owned_part(params, owned_), owned_part(grads, owned_), grad_scale, buf_, static_cast<float>(lr), static_cast<float>(weight_decay_),
               decays_, static_cast<float>(momentum_), nesterov_, steps_ == 0);
    ++steps_;
  }
  std::string name() const override { return "SGD"; }
  std::vector<std::pair<std::string, Kokkos::View<float*>>> state() override {
    if (momentum_ == 0.0) return {};
    return {{"momentum_buffer", buf_}};
  }

 private:
  std::size_t n_;
  double momentum_, weight_decay_;
  bool nesterov_;
  Kokkos::View<std::uint8_t*> decays_;  // (n) or empty: where weight decay applies
  Kokkos::View<float*> buf_;            // (n) when momentum != 0
};

class AdamW : public Optimizer {
 public:
  AdamW(const TrainConfig& cfg, std::size_t n, Range owned, Kokkos::View<std::uint8_t*> decays)
      : n_(n),
        beta1_(cfg.betas.at(0)),
        beta2_(cfg.betas.at(1)),
        eps_(cfg.eps),
        weight_decay_(cfg.weight_decay),
        decays_(decays),
        exp_avg_(make_buffer("AdamW::exp_avg", owned.size)),
        exp_avg_sq_(make_buffer("AdamW::exp_avg_sq", owned.size)) {
    owned_ = owned;
  }

  void step(Kokkos::View<float*> params, Kokkos::View<const float*> grads, double lr,
            float grad_scale) override {
    check_sizes(params, grads, n_);
    const double t = static_cast<double>(steps_ + 1);  // 1-based, as torch counts
    const double bias_correction1 = 1.0 - std::pow(beta1_, t);
    const double bias_correction2 = 1.0 - std::pow(beta2_, t);
    adamw_update(owned_part(params, owned_), owned_part(grads, owned_), grad_scale, exp_avg_, exp_avg_sq_,
                 static_cast<float>(1.0 - lr * weight_decay_), decays_, static_cast<float>(beta1_),
                 static_cast<float>(beta2_), static_cast<float>(1.0 - beta1_),
                 static_cast<float>(1.0 - beta2_), static_cast<float>(lr / bias_correction1),
                 static_cast<float>(std::sqrt(bias_correction2)), static_cast<float>(eps_));
    ++steps_;
  }
  std::string name() const override { return "AdamW"; }
  std::vector<std::pair<std::string, Kokkos::View<float*>>> state() override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }

 private:
  std::size_t n_;
  double beta1_, beta2_, eps_, weight_decay_;
  Kokkos::View<std::uint8_t*> decays_;  // (n) or empty: where weight decay applies
  Kokkos::View<float*> exp_avg_;        // (n) first moment
  Kokkos::View<float*> exp_avg_sq_;     // (n) second moment
};

}  // namespace

int optimizer_state_copies(const TrainConfig& cfg) {
  if (cfg.optimizer == "adamw") return 2;
  return cfg.momentum != 0.0 ? 1 : 0;
}

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, std::size_t n_params,
                                          const std::vector<ParamRange>& no_decay, ParamRange owned) {
  if (owned.size < 0) owned = {0, std::int64_t(n_params)};
  DDP_REQUIRE(owned.offset >= 0 && owned.offset + owned.size <= std::int64_t(n_params),
              "optimizer share [" << owned.offset << ", " << owned.offset + owned.size << ") of " << n_params
                                  << " parameters");
  const Optimizer::Range range{owned.offset, owned.size};
  if (cfg.optimizer == "sgd") return std::make_unique<SGD>(cfg, n_params, range, decay_mask(cfg, owned, no_decay));
  if (cfg.optimizer == "adamw")
    return std::make_unique<AdamW>(cfg, n_params, range, decay_mask(cfg, owned, no_decay));
  throw InputError("train.optimizer = '" + cfg.optimizer + "': expected one of 'sgd', 'adamw'");
}

}  // namespace ddp
