#include "train/loss_scaler.hpp"

#include <cfloat>

#include "comm/check.hpp"
#include "train/guards.hpp"

namespace ddp {

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options), scale_(options.init_scale) {
  DDP_REQUIRE(options.init_scale > 0 && options.init_scale <= FLT_MAX, "init_scale " << options.init_scale);
  DDP_REQUIRE(options.growth_factor > 1, "growth_factor " << options.growth_factor);
  DDP_REQUIRE(options.backoff_factor > 0 && options.backoff_factor < 1,
              "backoff_factor " << options.backoff_factor);
  DDP_REQUIRE(options.growth_interval > 0, "growth_interval " << options.growth_interval);
}

bool LossScaler::has_inf_or_nan(ConstView1 grads) { return count_nonfinite(grads) > 0; }

bool LossScaler::any_rank(Communicator& comm, bool local_overflow) {
  // A sum of 0/1 flags (the shared interface has no MAX): any count > 0 is "some
  // rank". The flag lives where the gradients live, so that the gradients'
  // communicator (NCCL takes device pointers only) can reduce it.
  Kokkos::View<double*> flag("LossScaler::flag", 1);
  auto flag_host = Kokkos::create_mirror_view(flag);
  flag_host(0) = local_overflow ? 1.0 : 0.0;
  Kokkos::deep_copy(flag, flag_host);
  Kokkos::fence();
  comm.allreduce_sum(flag.data(), 1);
  Kokkos::deep_copy(flag_host, flag);
  return flag_host(0) > 0.0;
}

void LossScaler::unscale(View1 grads) const {
  const float inv = float(1.0 / scale_);
  Kokkos::parallel_for(
      "LossScaler::unscale", Range(0, grads.extent(0)), KOKKOS_LAMBDA(std::size_t i) { grads(i) *= inv; });
}

void LossScaler::update(bool overflow) {
  if (overflow) {
    scale_ *= options_.backoff_factor;
    clean_steps_ = 0;
    return;
  }
  if (++clean_steps_ < options_.growth_interval) return;
  clean_steps_ = 0;
  // A scale of inf would turn every loss into inf, and inf * backoff stays inf.
  if (scale_ * options_.growth_factor <= FLT_MAX) scale_ *= options_.growth_factor;
}

void LossScaler::restore(double scale, int clean_steps) {
  DDP_REQUIRE(scale > 0 && scale <= FLT_MAX, "scale " << scale);
  DDP_REQUIRE(clean_steps >= 0, "clean_steps " << clean_steps);
  scale_ = scale;
  clean_steps_ = clean_steps;
}

bool LossScaler::unscale_and_check(Communicator& comm, View1 grads) {
  const bool overflow = any_rank(comm, has_inf_or_nan(grads));
  if (!overflow) unscale(grads);
  update(overflow);
  return !overflow;
}

}  // namespace ddp
