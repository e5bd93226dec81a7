// Optimizers against torch.optim's update rules written out here in double,
// plus hand-derived values; learning-rate schedules at chosen steps.
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#include <cmath>

#include "comm/check.hpp"
#include "train/optimizer.hpp"
#include "train/schedule.hpp"

namespace {

using Vec = std::vector<double>;

// Three steps of gradients for a 4-parameter model, (3, 4).
const std::vector<Vec> kGrads = {{0.5, -1.0, 0.25, 2.0}, {0.4, -0.8, -0.5, 1.5}, {-0.3, 0.6, 0.1, 1.0}};
const Vec kParams0 = {1.0, -2.0, 0.5, 3.0};

Kokkos::View<float*> to_device(const Vec& x, const std::string& label) {
  Kokkos::View<float*> v(label, x.size());
  auto v_host = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < x.size(); ++i) v_host(i) = static_cast<float>(x[i]);
  Kokkos::deep_copy(v, v_host);
  return v;
}

Vec to_host(const Kokkos::View<float*>& v) {
  auto v_host = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(v_host, v);
  return Vec(v_host.data(), v_host.data() + v_host.extent(0));
}

void expect_close(const Vec& got, const Vec& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-6 * std::abs(want[i])) << what << "[" << i << "]";
}

// Runs `opt` over kGrads from kParams0 with a constant lr; returns the parameters.
Vec run(ddp::Optimizer& opt, const std::vector<Vec>& grads, double lr, Vec params0 = kParams0) {
  auto params = to_device(params0, "params");
  for (const Vec& g : grads) opt.step(params, to_device(g, "grads"), lr);
  return to_host(params);
}

ddp::TrainConfig sgd(double momentum, bool nesterov, double weight_decay) {
  ddp::TrainConfig cfg;
  cfg.optimizer = "sgd";
  cfg.momentum = momentum;
  cfg.nesterov = nesterov;
  cfg.weight_decay = weight_decay;
  return cfg;
}

// torch.optim.SGD (dampening 0) in double; returns params, fills the momentum buffer.
Vec sgd_reference(const ddp::TrainConfig& c, double lr, Vec& buf) {
  Vec p = kParams0;
  buf.assign(p.size(), 0.0);
  for (std::size_t t = 0; t < kGrads.size(); ++t)
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d = kGrads[t][i] + c.weight_decay * p[i];
      if (c.momentum != 0) {
        buf[i] = t == 0 ? d : c.momentum * buf[i] + d;
        d = c.nesterov ? d + c.momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  return p;
}

TEST(SGD, PlainByHand) {
  auto opt = ddp::make_optimizer(sgd(0, false, 0), 4);
  EXPECT_EQ(opt->name(), "SGD");
  EXPECT_TRUE(opt->state().empty());
  // p - 0.1 * (sum of the three gradients)
  expect_close(run(*opt, kGrads, 0.1), {1.0 - 0.06, -2.0 + 0.12, 0.5 + 0.015, 3.0 - 0.45}, "p");
  EXPECT_EQ(opt->steps(), 3);
}

TEST(SGD, MomentumAndNesterovByHand) {
  // Constant gradient 1, momentum 0.9, lr 0.01: buf = 1, 1.9, 2.71.
  const std::vector<Vec> ones(3, Vec{1.0});
  auto heavy_ball = ddp::make_optimizer(sgd(0.9, false, 0), 1);
  expect_close(run(*heavy_ball, ones, 0.01, {1.0}), {1.0 - 0.01 * (1 + 1.9 + 2.71)}, "momentum");
  expect_close(to_host(heavy_ball->state().at(0).second), {2.71}, "momentum_buffer");
  // Nesterov steps with 1 + 0.9 * buf: 1.9, 2.71, 3.439.
  auto nesterov = ddp::make_optimizer(sgd(0.9, true, 0), 1);
  expect_close(run(*nesterov, ones, 0.01, {1.0}), {1.0 - 0.01 * (1.9 + 2.71 + 3.439)}, "nesterov");
}

TEST(SGD, MatchesTorchRule) {
  for (const auto& cfg : {sgd(0, false, 0.1), sgd(0.9, false, 0), sgd(0.9, false, 0.01), sgd(0.8, true, 0),
                          sgd(0.8, true, 0.05)}) {
    SCOPED_TRACE("momentum " + std::to_string(cfg.momentum) + " nesterov " + std::to_string(cfg.nesterov) +
                 " wd " + std::to_string(cfg.weight_decay));
    auto opt = ddp::make_optimizer(cfg, 4);
    Vec buf;
    const Vec want = sgd_reference(cfg, 0.05, buf);
    expect_close(run(*opt, kGrads, 0.05), want, "params");
    if (cfg.momentum != 0) {
      const auto state = opt->state();
      ASSERT_EQ(state.size(), 1u);
      EXPECT_EQ(state[0].first, "momentum_buffer");
      expect_close(to_host(state[0].second), buf, "momentum_buffer");
    }
  }
}

ddp::TrainConfig adamw(double weight_decay) {
  ddp::TrainConfig cfg;
  cfg.optimizer = "adamw";
  cfg.betas = {0.9, 0.999};
  cfg.eps = 1e-8;
  cfg.weight_decay = weight_decay;
  return cfg;
}

TEST(AdamW, ConstantGradientByHand) {
  // With a constant gradient g the bias-corrected moments are g and g^2, so each
  // step is p <- p (1 - lr wd) - lr g / (|g| + eps).
  const double lr = 0.01, wd = 0.1, g = 0.5, eps = 1e-8;
  auto opt = ddp::make_optimizer(adamw(wd), 1);
  EXPECT_EQ(opt->name(), "AdamW");
  double p = 1.0;
  for (int t = 0; t < 3; ++t) p = p * (1 - lr * wd) - lr * g / (g + eps);
  expect_close(run(*opt, std::vector<Vec>(3, Vec{g}), lr, {1.0}), {p}, "params");
}

TEST(AdamW, MatchesTorchRule) {
  const double lr = 0.02, wd = 0.05, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  auto opt = ddp::make_optimizer(adamw(wd), 4);
  // torch.optim.AdamW, amsgrad off, in double, in the paper's form: torch's
  // step_size * m / (sqrt(v) / sqrt(bc2) + eps) is the same expression.
  Vec p = kParams0, m(4, 0.0), v(4, 0.0);
  for (std::size_t t = 1; t <= kGrads.size(); ++t)
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double g = kGrads[t - 1][i];
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(b1, t));
      const double v_hat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  expect_close(run(*opt, kGrads, lr), p, "params");
  EXPECT_EQ(opt->steps(), 3);
  const auto state = opt->state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "exp_avg");
  EXPECT_EQ(state[1].first, "exp_avg_sq");
  expect_close(to_host(state[0].second), m, "exp_avg");
  expect_close(to_host(state[1].second), v, "exp_avg_sq");
}

// train.decay_norm_and_bias = F: the ranges given leave weight decay out, as a
// second torch.optim parameter group with weight_decay 0; the rest decays as before,
// to the bit.
TEST(Optimizer, NoDecayRangesAsASecondParameterGroup) {
  for (const auto& cfg : {sgd(0.875, false, 0.05), adamw(0.05)}) {
    SCOPED_TRACE(cfg.optimizer);
    const std::vector<ddp::ParamRange> no_decay = {{1, 2}};  // parameters 1 and 2
    auto masked = ddp::make_optimizer(cfg, 4, no_decay), all = ddp::make_optimizer(cfg, 4);
    ddp::TrainConfig plain = cfg;
    plain.weight_decay = 0;
    auto none = ddp::make_optimizer(plain, 4);
    const Vec got = run(*masked, kGrads, 0.05), decayed = run(*all, kGrads, 0.05),
              undecayed = run(*none, kGrads, 0.05);
    EXPECT_EQ(got[0], decayed[0]);
    EXPECT_EQ(got[1], undecayed[1]);
    EXPECT_EQ(got[2], undecayed[2]);
    EXPECT_EQ(got[3], decayed[3]);
    EXPECT_NE(decayed[1], undecayed[1]);  // the decay would have shown
  }
}

TEST(Optimizer, UnknownNameIsAnInputError) {
  ddp::TrainConfig cfg;
  cfg.optimizer = "lamb";
  EXPECT_THROW(ddp::make_optimizer(cfg, 4), ddp::InputError);
}

ddp::TrainConfig schedule(const std::string& kind, int warmup) {
  ddp::TrainConfig cfg;
  cfg.schedule = kind;
  cfg.lr = 0.1;
  cfg.warmup_steps = warmup;
  cfg.epochs = 5;  // with 10 steps per epoch: 50 steps
  cfg.step_epochs = 2;
  cfg.milestones = {2, 3};
  cfg.gamma = 0.5;
  cfg.min_lr = 0.01;
  return cfg;
}

TEST(Schedule, ConstantWithWarmup) {
  const auto cfg = schedule("constant", 4);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 0, 10), 0.025);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 1, 10), 0.05);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 3, 10), 0.1);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 4, 10), 0.1);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 49, 10), 0.1);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(schedule("constant", 0), 0, 10), 0.1);
}

TEST(Schedule, StepDecaysEveryStepEpochs) {
  const auto cfg = schedule("step", 0);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 0, 10), 0.1);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 19, 10), 0.1);   // epoch 1
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 20, 10), 0.05);  // epoch 2
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 39, 10), 0.05);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 40, 10), 0.025);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(schedule("step", 5), 2, 10), 0.06);  // warm-up first
}

// As torch.optim.lr_scheduler.MultiStepLR(milestones=[2, 3], gamma=0.5) stepped after
// each epoch: epochs 0 and 1 at lr, epoch 2 at lr * 0.5, epoch 3 on at lr * 0.25.
TEST(Schedule, MultistepDecaysAtEachMilestone) {
  const auto cfg = schedule("multistep", 0);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 0, 10), 0.1);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 19, 10), 0.1);   // epoch 1
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 20, 10), 0.05);  // epoch 2
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 29, 10), 0.05);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 30, 10), 0.025);                     // epoch 3
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 49, 10), 0.025);                     // past the last milestone
  EXPECT_DOUBLE_EQ(ddp::learning_rate(schedule("multistep", 5), 2, 10), 0.06);  // warm-up first
}

// 'plateau': warm-up to lr, then the position's rate (lr until a reduction).
TEST(Schedule, PlateauAfterWarmup) {
  const auto cfg = schedule("plateau", 4);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 1, 10, 0.01), 0.05);  // warm-up: to train.lr
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 4, 10, 0.01), 0.01);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 49, 10, 0.0), 0.1);  // none reduced yet
}

// plateau_step as ReduceLROnPlateau.step (mode 'min', threshold 0.1 'rel', patience 1,
// cooldown 1, factor 0.5, min_lr 0.01): the first finite value is the best; a value
// within 10% of the best is not better; the second epoch not better reduces; the epoch
// after a reduction is cooldown, not counted; a reduction below 1e-8 (at min_lr) is none.
TEST(Schedule, PlateauStepAsReduceLROnPlateau) {
  auto cfg = schedule("plateau", 0);
  cfg.plateau_patience = 1;
  cfg.plateau_threshold = 0.1;
  cfg.plateau_cooldown = 1;
  cfg.gamma = 0.5;
  cfg.min_lr = 0.01;
  ddp::TrainingState pos;
  pos.plateau_lr = 0.1;
  struct Epoch {
    double value;
    std::int64_t bad;  // what plateau_step returns
    double lr;         // the rate after it
    std::int64_t best_epoch;
  };
  const Epoch epochs[] = {
      {std::nan(""), 0, 0.1, 0},  // NaN is never better, not even first: 1 bad epoch
      {1.0, 0, 0.1, 2},           // the first finite value
      {0.95, 0, 0.1, 2},          // within 10%: 1 bad epoch
      {0.92, 2, 0.05, 2},         // 2 bad epochs > patience 1: halved, cooldown 1
      {0.92, 0, 0.05, 2},         // cooldown: not counted
      {0.92, 0, 0.05, 2},         // 1 bad
      {0.92, 2, 0.025, 2},        // 2 bad: halved
      {0.5, 0, 0.025, 8},         // better (and in cooldown)
      {0.6, 0, 0.025, 8},         // 1 bad
      {0.7, 2, 0.0125, 8},        // 2 bad: halved
      {0.7, 0, 0.0125, 8},        // cooldown
      {0.7, 0, 0.0125, 8},        // 1 bad
      {0.7, 2, 0.01, 8},          // 2 bad: max(0.00625, min_lr)
      {0.7, 0, 0.01, 8},          // cooldown
      {0.7, 0, 0.01, 8},          // 1 bad
      {0.7, 0, 0.01, 8},          // 2 bad: max(0.005, 0.01) = 0.01, no change: no reduction
  };
  for (const Epoch& e : epochs) {
    ++pos.epoch;
    EXPECT_EQ(ddp::plateau_step(pos, cfg, e.value, /*lower=*/true), e.bad) << "epoch " << pos.epoch;
    EXPECT_DOUBLE_EQ(pos.plateau_lr, e.lr) << "epoch " << pos.epoch;
    EXPECT_EQ(pos.plateau_epoch, e.best_epoch) << "epoch " << pos.epoch;
  }
  // 'max' (accuracies): better where above the best by more than 10% of it.
  ddp::TrainingState acc;
  acc.plateau_lr = 0.1;
  acc.epoch = 1;
  ddp::plateau_step(acc, cfg, 0.5, /*lower=*/false);
  acc.epoch = 2;
  ddp::plateau_step(acc, cfg, 0.54, false);
  EXPECT_EQ(acc.plateau_epoch, 1);
  acc.epoch = 3;
  ddp::plateau_step(acc, cfg, 0.56, false);
  EXPECT_EQ(acc.plateau_epoch, 3);
  EXPECT_DOUBLE_EQ(acc.plateau_best, 0.56);
}

TEST(Schedule, CosineAfterWarmup) {
  const auto cfg = schedule("cosine", 10);                   // T = 50 - 10 = 40
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 4, 10), 0.05);    // warm-up: 0.1 * 5 / 10
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 10, 10), 0.1);    // t = 0: peak
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 30, 10), 0.055);  // t = T/2: halfway to min_lr
  EXPECT_NEAR(ddp::learning_rate(cfg, 20, 10), 0.01 + 0.09 * (1 + std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(ddp::learning_rate(cfg, 50, 10), 0.01);  // t = T: min_lr
  EXPECT_DOUBLE_EQ(ddp::learning_rate(schedule("cosine", 0), 0, 10), 0.1);
}

}  // namespace
