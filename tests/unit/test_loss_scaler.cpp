// Dynamic loss scaling (fp16) on the CPU: overflow agreed across ranks, the scale
// schedule of torch.cuda.amp.GradScaler, exact unscaling.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/compute_communicator.hpp"
#include "train/loss_scaler.hpp"

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

ddp::View1 make_grads(const std::vector<float>& values) {
  ddp::View1 g("test::grads", values.size());
  auto h = Kokkos::create_mirror_view(g);
  for (std::size_t i = 0; i < values.size(); ++i) h(i) = values[i];
  Kokkos::deep_copy(g, h);
  return g;
}

std::vector<float> to_vector(ddp::View1 g) {
  auto h = Kokkos::create_mirror_view(g);
  Kokkos::deep_copy(h, g);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

TEST(LossScaler, Defaults) {
  ddp::LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.clean_steps(), 0);
}

TEST(LossScaler, DetectsInfAndNan) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(ddp::LossScaler::has_inf_or_nan(make_grads({0.f, -1.f, 3e38f, -3e38f, 1e-45f})));
  EXPECT_FALSE(ddp::LossScaler::has_inf_or_nan(make_grads({})));
  EXPECT_TRUE(ddp::LossScaler::has_inf_or_nan(make_grads({0.f, inf, 1.f})));
  EXPECT_TRUE(ddp::LossScaler::has_inf_or_nan(make_grads({-inf})));
  EXPECT_TRUE(ddp::LossScaler::has_inf_or_nan(make_grads({1.f, 2.f, nan})));
}

// The injected overflow sits on ONE rank (each rank in turn, then the last one with
// a NaN): every rank must skip the step, keep its gradients untouched and halve the scale.
TEST(LossScaler, OverflowOnOneRankSkipsTheStepOnAll) {
  auto comm = ddp::make_compute_communicator(MPI_COMM_WORLD);
  const int rank = world_rank(), size = world_size();
  ddp::LossScaler scaler;
  float expected_scale = 65536.0f;
  for (int bad_rank = 0; bad_rank <= size; ++bad_rank) {
    SCOPED_TRACE("overflow on rank " + std::to_string(bad_rank % size));
    std::vector<float> values(1000, 4096.0f);
    if (rank == bad_rank % size)
      values[rank * 7 + 3] = bad_rank < size ? std::numeric_limits<float>::infinity() : std::nanf("");
    ddp::View1 grads = make_grads(values);
    EXPECT_FALSE(scaler.unscale_and_check(*comm, grads));
    expected_scale *= 0.5f;
    EXPECT_EQ(scaler.scale(), expected_scale);
    EXPECT_EQ(scaler.clean_steps(), 0);
    std::vector<float> after = to_vector(grads);
    for (std::size_t i = 0; i < after.size(); ++i) {
      if (!std::isfinite(values[i])) continue;
      ASSERT_EQ(after[i], values[i]) << i;  // skipped: not unscaled
    }
    // Every rank holds the same scale.
    double s = scaler.scale(), lo = 0, hi = 0;
    MPI_Allreduce(&s, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&s, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lo, hi);
  }
  // A clean step on every rank is taken and unscaled.
  ddp::View1 grads = make_grads(std::vector<float>(10, 1024.0f));
  EXPECT_TRUE(scaler.unscale_and_check(*comm, grads));
  for (float g : to_vector(grads)) EXPECT_EQ(g, 1024.0f / expected_scale);
  EXPECT_EQ(scaler.clean_steps(), 1);
}

// A scripted run (growth_interval 3): o = overflow, c = clean. After each step the
// scale must be as the GradScaler rules give it, written out here by hand.
TEST(LossScaler, FollowsTheSchedule) {
  auto comm = ddp::make_compute_communicator(MPI_COMM_WORLD);
  ddp::LossScalerOptions opt;
  opt.init_scale = 1024;
  opt.growth_interval = 3;
  ddp::LossScaler scaler(opt);
  struct Step {
    char what;
    float scale;  // after the step
    int clean;
  };
  const Step script[] = {
      {'c', 1024, 1}, {'c', 1024, 2}, {'c', 2048, 0},  // 3 clean: x2
      {'c', 2048, 1}, {'o', 1024, 0},                  // overflow: /2, count reset
      {'c', 1024, 1}, {'c', 1024, 2}, {'o', 512, 0},   // reset again before growing
      {'o', 256, 0},  {'o', 128, 0},                   // overflows in a row
      {'c', 128, 1},  {'c', 128, 2},  {'c', 256, 0},  {'c', 256, 1}, {'c', 256, 2}, {'c', 512, 0},
  };
  const int rank = world_rank(), size = world_size();
  int n = 0;
  for (const Step& st : script) {
    SCOPED_TRACE("step " + std::to_string(n));
    std::vector<float> values(64, 2.0f);
    // The overflow shows up on a different single rank each time.
    if (st.what == 'o' && rank == n % size) values[n] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(scaler.unscale_and_check(*comm, make_grads(values)), st.what == 'c');
    EXPECT_EQ(scaler.scale(), st.scale);
    EXPECT_EQ(scaler.clean_steps(), st.clean);
    ++n;
  }
}

TEST(LossScaler, DefaultGrowthAfter2000CleanSteps) {
  ddp::LossScaler scaler;
  for (int i = 0; i < 1999; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 65536.0f);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 131072.0f);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 65536.0f);
}

TEST(LossScaler, NeverGrowsToInfinity) {
  ddp::LossScalerOptions opt;
  opt.init_scale = 0x1p127;
  opt.growth_interval = 1;
  ddp::LossScaler scaler(opt);
  for (int i = 0; i < 5; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 0x1p127f);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 0x1p126f);
}

// Unscaling by a power of two only changes the exponent: exact, whatever the mantissa.
TEST(LossScaler, UnscaleIsExactForPowersOfTwo) {
  std::vector<float> values;
  for (int i = 0; i < 500; ++i)
    values.push_back(std::ldexp(1.0f + float(i) * 0.0078125f / 3.0f, i % 40 - 10) * (i % 2 ? -1.f : 1.f));
  for (int e : {0, 1, 7, 16, 24}) {
    ddp::LossScalerOptions opt;
    opt.init_scale = std::ldexp(1.0, e);
    ddp::LossScaler scaler(opt);
    ddp::View1 g = make_grads(values);
    scaler.unscale(g);
    std::vector<float> out = to_vector(g);
    for (std::size_t i = 0; i < values.size(); ++i) ASSERT_EQ(out[i], std::ldexp(values[i], -e)) << i;
  }
}

}  // namespace
