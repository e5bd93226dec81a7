#pragma once
// The data-parallel training loop: DistributedSampler order, forward, backward,
// gradient all-reduce across ranks, optimizer step, validation, metrics.

#include <cstdint>
#include <memory>

#include "comm/communicator.hpp"
#include "io/batch_loader.hpp"
#include "io/metrics.hpp"
#include "io/shard_dataset.hpp"
#include "model/loss.hpp"
#include "model/model.hpp"
#include "train/config.hpp"
#include "train/optimizer.hpp"

namespace ddp {

struct EpochStats {
  std::int64_t epoch = 0;      // 1-based
  std::int64_t step = 0;       // optimizer steps taken so far
  double train_loss = 0.0;     // mean over every sample trained this epoch, all ranks
  double samples_per_s = 0.0;  // training samples of all ranks per second of training
  double train_seconds = 0.0;
  double data_wait_seconds = 0.0;  // rank 0's time blocked on the loader
  double lr = 0.0;                 // learning rate of the epoch's last step
};

struct ValStats {
  double loss = 0.0;       // mean per-sample loss
  double accuracy = 0.0;   // classification only
  std::int64_t count = 0;  // samples evaluated: every sample exactly once
  double loss_sum = 0.0;
  std::int64_t correct = 0;
};

class Trainer {
 public:
  // `prefetch_batches` > 0 reads ahead on a thread (streaming data).
  Trainer(const Config& cfg, Communicator& comm, Model& model, LossKind loss, ShardDataset& train,
          ShardDataset* val, int prefetch_batches);

  // All epochs of cfg.train, one line per epoch on rank 0 and one metrics record.
  void fit(MetricsWriter* metrics);

  EpochStats train_epoch(std::int64_t epoch);  // epoch is 0-based
  ValStats validate(ShardDataset& data);

  std::int64_t step() const { return step_; }
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }

 private:
  void load_batch(const Batch& batch);  // host batch -> input, label/target views
  void reduce_and_step(std::int64_t samples_per_rank);

  const Config& cfg_;
  Communicator& comm_;
  Model& model_;
  LossKind loss_kind_;
  ShardDataset& train_;
  ShardDataset* val_;
  int prefetch_;
  std::unique_ptr<Optimizer> optimizer_;
  std::int64_t step_ = 0;
  std::int64_t steps_per_epoch_ = 0;

  Tensor x_;          // (B, sample...)
  LabelView labels_;  // (B)
  View1 targets_;     // (B * target_numel)
  View1 loss_;        // (B) per-sample loss
  View1 correct_;     // (B) 1 where argmax == label
  Tensor dout_;       // (B, out...)
};

}  // namespace ddp
