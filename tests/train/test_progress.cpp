// The time numbers of progress lines (src/train/progress.hpp): human durations, and
// the time left for an epoch and a run, resumed runs included.
#include <gtest/gtest.h>

#include <cmath>

#include "train/progress.hpp"

namespace {

using ddp::duration_text;
using ddp::RunEta;

TEST(Progress, DurationsInHumanUnits) {
  EXPECT_EQ(duration_text(0.0), "0.0s");
  EXPECT_EQ(duration_text(4.26), "4.3s");
  EXPECT_EQ(duration_text(9.96), "10s");
  EXPECT_EQ(duration_text(42.4), "42s");
  EXPECT_EQ(duration_text(192.0), "3m12s");
  EXPECT_EQ(duration_text(3599.0), "59m59s");
  EXPECT_EQ(duration_text(3600.0), "1h00m");
  EXPECT_EQ(duration_text(7529.0), "2h05m");
  EXPECT_EQ(duration_text(std::nan("")), "?");
  EXPECT_EQ(duration_text(-1.0), "?");
  EXPECT_EQ(duration_text(INFINITY), "?");
}

TEST(Progress, NothingMeasuredIsUnknownNotInfinite) {
  const RunEta eta(10, 1000, 100);
  EXPECT_EQ(eta.rate(), 0.0);
  EXPECT_EQ(duration_text(eta.epoch_left(0, 0)), "?");
  EXPECT_EQ(duration_text(eta.run_left(0, 0)), "?");
  RunEta empty(10, 1000, 100);
  empty.trained(0.0, 0);  // a zero-length span is no measurement
  EXPECT_EQ(duration_text(empty.run_left(0, 0)), "?");
}

TEST(Progress, ValidationEstimatedUntilMeasured) {
  // 1000 positions per epoch, 100 validation samples, 100 positions/s.
  RunEta eta(3, 1000, 100);
  eta.trained(2.0, 200);
  EXPECT_DOUBLE_EQ(eta.rate(), 100.0);
  // 800 left at 100/s, validation estimated as 100 samples at 3 times that rate.
  EXPECT_DOUBLE_EQ(eta.epoch_left(0, 200), 8.0 + 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(eta.run_left(0, 200), 8.0 + 1.0 / 3.0 + 2 * (10.0 + 1.0 / 3.0));
  eta.validated(0.25);
  EXPECT_DOUBLE_EQ(eta.run_left(0, 200), 8.25 + 2 * 10.25);
  // The run's end: nothing left.
  EXPECT_DOUBLE_EQ(eta.run_left(3, 0), 0.0);
  // No validation set: none counted.
  RunEta train_only(3, 1000, 0);
  train_only.trained(1.0, 100);
  EXPECT_DOUBLE_EQ(train_only.run_left(1, 500), 5.0 + 10.0);
}

TEST(Progress, ResumedRunCountsOnlyWhatIsLeft) {
  // Resumed mid-epoch 3 of 4 (epoch index 2, 600 of 1000 positions done): only this
  // process's measurements, and only the 400 positions and the one epoch after it.
  RunEta eta(4, 1000, 0);
  eta.trained(1.0, 200);
  EXPECT_DOUBLE_EQ(eta.epoch_left(2, 600), 2.0);
  EXPECT_DOUBLE_EQ(eta.run_left(2, 600), 2.0 + 5.0);
  // On the last epoch the run's time left is the epoch's.
  EXPECT_DOUBLE_EQ(eta.run_left(3, 600), eta.epoch_left(3, 600));
}

}  // namespace
