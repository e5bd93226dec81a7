// Data parallelism changes nothing but the speed: W ranks with per-rank batch B
// end with the parameters of 1 rank with batch W*B over the same global sample
// order, and validation metrics do not depend on the number of ranks at all.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "../model/grad_check.hpp"
#include "comm/communicator.hpp"
#include "comm/compute_communicator.hpp"
#include "io/shard_dataset.hpp"
#include "model/model.hpp"
#include "synthetic_data.hpp"
#include "train/trainer.hpp"

namespace {

using namespace ddp;
using ddp::test::max_relative_error;

constexpr std::int64_t kTrainSamples = 240;  // divisible by 2, 3, 4 and by the global batches
constexpr std::int64_t kValSamples = 101;    // divisible by none of 2, 3, 4

struct Files {
  std::string train, val;
};

const Files& files() {
  static const Files f = [] {
    const std::string dir = test::shared_test_dir(MPI_COMM_WORLD, "equivalence");
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) mkdir(dir.c_str(), 0755);
    Files out{dir + "/train.h5", dir + "/val.h5"};
    test::write_classification_shard(MPI_COMM_WORLD, out.train, kTrainSamples, 12, 4, 1);
    test::write_classification_shard(MPI_COMM_WORLD, out.val, kValSamples, 12, 4, 2);
    return out;
  }();
  return f;
}

Config base_config() {
  Config cfg;
  cfg.data.train_files = {files().train};
  cfg.model.layers = {"linear(16)", "tanh", "linear(16)", "relu", "linear(4)"};
  cfg.train.epochs = 2;
  cfg.train.seed = 3;
  cfg.train.log_every = 0;
  return cfg;
}

std::vector<float> to_host(View1 v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

// Trains cfg.train.epochs epochs on the ranks of `comm`; returns the parameters.
std::vector<float> train(MPI_Comm comm, const Config& cfg) {
  auto c = make_compute_communicator(comm);
  ShardDataset data(comm, cfg.data.train_files, "data.train_files");
  Model model(cfg.model.layers, data.sample_shape(), std::uint64_t(cfg.train.seed));
  Trainer trainer(cfg, *c, model, LossKind::CrossEntropy, data, nullptr, 0);
  for (int e = 0; e < cfg.train.epochs; ++e) trainer.train_epoch(e);
  return to_host(model.parameters());
}

int world_size() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

// W ranks x batch B (x accumulation) against 1 rank x batch W*B*accumulation.
void expect_same_as_one_rank(Config cfg) {
  const int W = world_size();
  if (W == 1) GTEST_SKIP() << "needs 2 or more ranks";
  const std::vector<float> parallel = train(MPI_COMM_WORLD, cfg);
  Config single = cfg;
  single.train.batch_size = cfg.train.batch_size * W * cfg.train.accumulation_steps;
  single.train.accumulation_steps = 1;
  const std::vector<float> reference = train(MPI_COMM_SELF, single);
  ASSERT_EQ(parallel.size(), reference.size());
  const double err = max_relative_error(parallel, reference);
  EXPECT_LE(err, 1e-5) << "W=" << W;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::printf("W=%d: max relative parameter difference to 1 rank: %.3g\n", W, err);
  // The runs must have moved the weights, or the comparison proves nothing.
  Config untrained = cfg;
  untrained.train.epochs = 0;
  EXPECT_GT(max_relative_error(train(MPI_COMM_SELF, untrained), reference), 1e-2);
}

// The gradient all-reduce of `mode`: MPI per bucket during backward ('poll', 'thread'),
// the buckets summed in shared memory ('shm'), or one MPI all-reduce after backward
// ('none').
void set_reduction(Config& cfg, const std::string& mode) {
  cfg.comm.shared_memory = mode == "shm";
  cfg.comm.overlap = mode == "shm" ? "poll" : mode;
}

// Each way of reducing the gradients: the same sums, so the same parameters up to
// float rounding.
class EquivalenceOverlap : public ::testing::TestWithParam<const char*> {};

TEST_P(EquivalenceOverlap, SgdMomentumMatchesOneRankWithWTimesTheBatch) {
  Config cfg = base_config();
  set_reduction(cfg, GetParam());
  cfg.comm.bucket_mb = 0.0005;  // several buckets even for this small model
  cfg.comm.first_bucket_mb = 0.0001;
  cfg.train.batch_size = 5;
  cfg.train.optimizer = "sgd";
  cfg.train.lr = 0.1;
  cfg.train.momentum = 0.9;
  cfg.train.nesterov = true;
  cfg.train.weight_decay = 1e-3;
  expect_same_as_one_rank(cfg);
}

INSTANTIATE_TEST_SUITE_P(Overlap, EquivalenceOverlap, ::testing::Values("none", "poll", "thread", "shm"));

TEST(Equivalence, BucketingChangesNothingButRounding) {
  if (world_size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  Config cfg = base_config();
  cfg.train.batch_size = 5;
  cfg.train.optimizer = "adamw";
  cfg.train.lr = 1e-2;
  cfg.comm.bucket_mb = 0.0005;
  cfg.comm.first_bucket_mb = 0.0001;
  set_reduction(cfg, "none");
  const std::vector<float> plain = train(MPI_COMM_WORLD, cfg);
  for (const char* mode : {"poll", "thread", "shm"}) {
    set_reduction(cfg, mode);
    EXPECT_LE(max_relative_error(train(MPI_COMM_WORLD, cfg), plain), 1e-6) << mode;
  }
}

TEST(Equivalence, AdamWCosineWithAccumulationMatchesOneRank) {
  Config cfg = base_config();
  cfg.train.batch_size = 3;
  cfg.train.accumulation_steps = 2;  // W=3: the epoch's last group is one short batch
  cfg.train.optimizer = "adamw";
  cfg.train.lr = 1e-2;
  cfg.train.weight_decay = 1e-2;
  cfg.train.schedule = "cosine";
  cfg.train.warmup_steps = 3;
  expect_same_as_one_rank(cfg);
}

// Counts the gradient all-reduces a training epoch makes.
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(MPI_Comm comm) : inner_(make_compute_communicator(comm)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void allreduce_sum(float* d, std::size_t n) override { ++float_allreduces, inner_->allreduce_sum(d, n); }
  void allreduce_sum(double* d, std::size_t n) override { inner_->allreduce_sum(d, n); }
  void broadcast(float* d, std::size_t n, int root) override { inner_->broadcast(d, n, root); }
  void allreduce_sum_host(double* d, std::size_t n) override { inner_->allreduce_sum_host(d, n); }
  void barrier() override { inner_->barrier(); }
  void allgather_shares(float* d, const std::vector<std::int64_t>& b) override { inner_->allgather_shares(d, b); }
  void reduce_scatter_shares(float* d, const std::vector<std::int64_t>& b) override {
    inner_->reduce_scatter_shares(d, b);
  }
  std::unique_ptr<BucketReducer> make_bucket_reducer(float* grads, std::vector<Bucket> buckets,
                                                     const std::string& overlap, bool shared_memory,
                                                     const std::vector<std::int64_t>& scatter_to) override {
    return inner_->make_bucket_reducer(grads, std::move(buckets), overlap, shared_memory, scatter_to);
  }
  MPI_Comm mpi_comm() const override { return inner_->mpi_comm(); }
  int float_allreduces = 0;

 private:
  std::unique_ptr<Communicator> inner_;
};

// train.precision reaches the model through the trainer, as it does through setup.
TEST(Trainer, AppliesTrainPrecision) {
  Config cfg = base_config();
  cfg.train.precision = "bf16";
  auto c = make_compute_communicator(MPI_COMM_WORLD);
  ShardDataset data(MPI_COMM_WORLD, cfg.data.train_files, "data.train_files");
  Model model(cfg.model.layers, data.sample_shape(), 3);
  EXPECT_EQ(model.precision(), Precision::fp32);
  Trainer trainer(cfg, *c, model, LossKind::CrossEntropy, data, nullptr, 0);
  EXPECT_EQ(model.precision(), Precision::bf16);
}

TEST(Equivalence, AccumulationReducesOnlyOnTheLastMicroStep) {
  Config cfg = base_config();
  cfg.train.batch_size = 4;
  cfg.train.accumulation_steps = 3;
  cfg.comm.overlap = "none";  // every gradient all-reduce goes through the communicator
  CountingCommunicator comm(MPI_COMM_WORLD);
  ShardDataset data(MPI_COMM_WORLD, cfg.data.train_files, "data.train_files");
  Model model(cfg.model.layers, data.sample_shape(), 3);
  Trainer trainer(cfg, comm, model, LossKind::CrossEntropy, data, nullptr, 0);
  const std::int64_t per_rank = kTrainSamples / world_size();
  const std::int64_t batches = (per_rank + 3) / 4;
  trainer.train_epoch(0);
  EXPECT_EQ(trainer.step(), (batches + 2) / 3);
  EXPECT_EQ(comm.float_allreduces, (batches + 2) / 3) << batches << " micro-batches";
}

TEST(Validation, MetricsAreBitwiseIdenticalForAnyNumberOfRanks) {
  Config cfg = base_config();
  cfg.train.batch_size = 8;
  cfg.train.epochs = 1;
  cfg.train.optimizer = "sgd";
  cfg.train.lr = 0.05;
  auto comm = make_compute_communicator(MPI_COMM_WORLD);
  ShardDataset train_data(MPI_COMM_WORLD, cfg.data.train_files, "data.train_files");
  ShardDataset val_data(MPI_COMM_WORLD, {files().val}, "data.val_files");
  Model model(cfg.model.layers, train_data.sample_shape(), 3);
  Trainer trainer(cfg, *comm, model, LossKind::CrossEntropy, train_data, &val_data, 0);
  trainer.train_epoch(0);
  const ValStats parallel = trainer.validate(val_data);

  // The same weights evaluated by one rank alone.
  auto self = make_compute_communicator(MPI_COMM_SELF);
  ShardDataset train_self(MPI_COMM_SELF, cfg.data.train_files, "data.train_files");
  ShardDataset val_self(MPI_COMM_SELF, {files().val}, "data.val_files");
  Model copy(cfg.model.layers, train_self.sample_shape(), 99);
  Kokkos::deep_copy(copy.parameters(), model.parameters());
  Trainer single(cfg, *self, copy, LossKind::CrossEntropy, train_self, &val_self, 0);
  const ValStats reference = single.validate(val_self);

  EXPECT_EQ(parallel.count, kValSamples);
  EXPECT_EQ(reference.count, kValSamples);
  EXPECT_EQ(parallel.correct, reference.correct);
  EXPECT_EQ(parallel.loss_sum, reference.loss_sum);  // bitwise, not approximately
  EXPECT_GT(parallel.correct, 0);
  EXPECT_GT(parallel.loss_sum, 0.0);
}

}  // namespace
