#include "train/trainer.hpp"

#include <chrono>
#include <cstdio>

#include "comm/log.hpp"
#include "io/sampler.hpp"
#include "train/schedule.hpp"

namespace ddp {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::int64_t numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// Sum of v[0..n) in double.
double sum(const View1& v, std::int64_t n) {
  double total = 0.0;
  Kokkos::parallel_reduce(
      "Trainer::sum", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(std::int64_t i, double& acc) { acc += double(v(i)); }, total);
  return total;
}

// SplitMix64 finaliser: distinct, well-mixed dropout seeds per rank.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

Trainer::Trainer(const Config& cfg, Communicator& comm, Model& model, LossKind loss, ShardDataset& train,
                 ShardDataset* val, int prefetch_batches)
    : cfg_(cfg),
      comm_(comm),
      model_(model),
      loss_kind_(loss),
      train_(train),
      val_(val),
      prefetch_(prefetch_batches) {
  const std::int64_t n_params = model_.num_parameters();
  optimizer_ = make_optimizer(cfg_.train, std::size_t(n_params));

  // Every rank starts from rank 0's weights, as DDP does at construction.
  comm_.broadcast(model_.parameters().data(), std::size_t(n_params), 0);
  model_.reseed_dropout(mix(std::uint64_t(cfg_.train.seed) * 1000003u + std::uint64_t(comm_.rank())));

  const DistributedSampler sampler(train_.size(), comm_.size(), comm_.rank(), cfg_.data.shuffle,
                                   std::uint64_t(cfg_.train.seed), cfg_.data.drop_last);
  const std::int64_t B = cfg_.train.batch_size;
  const std::int64_t batches = (sampler.num_samples() + B - 1) / B;
  steps_per_epoch_ = (batches + cfg_.train.accumulation_steps - 1) / cfg_.train.accumulation_steps;

  x_.data = View1("Trainer::x", std::size_t(B * train_.sample_numel()));
  labels_ = LabelView("Trainer::labels", std::size_t(B));
  targets_ = View1("Trainer::targets", std::size_t(B * train_.target_numel()));
  loss_ = View1("Trainer::loss", std::size_t(B));
  correct_ = View1("Trainer::correct", std::size_t(B));
  dout_.data = View1("Trainer::dout", std::size_t(B * numel(model_.output_shape())));
}

void Trainer::load_batch(const Batch& batch) {
  // The host edge: the loader's buffers go to the compute space here.
  using HostIn = Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  using HostLabels = Kokkos::View<const std::int32_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  const std::int64_t n = batch.size;
  const auto all = [](std::int64_t len) { return Kokkos::make_pair(std::size_t(0), std::size_t(len)); };
  const std::int64_t nx = n * train_.sample_numel();
  Kokkos::deep_copy(Kokkos::subview(x_.data, all(nx)), HostIn(batch.x.data(), std::size_t(nx)));
  x_.shape = {n};
  for (auto d : train_.sample_shape()) x_.shape.push_back(d);
  if (train_.has_class_labels()) {
    Kokkos::deep_copy(Kokkos::subview(labels_, all(n)), HostLabels(batch.labels.data(), std::size_t(n)));
  } else {
    const std::int64_t nt = n * train_.target_numel();
    Kokkos::deep_copy(Kokkos::subview(targets_, all(nt)), HostIn(batch.targets.data(), std::size_t(nt)));
  }
}

void Trainer::reduce_and_step(std::int64_t samples_per_rank) {
  View1 grads = model_.gradients();
  const std::int64_t n = model_.num_parameters();
  // Gradients hold per-sample sums; after the all-reduce they are divided by the
  // global sample count of this step, so W ranks with batch B match one rank with
  // batch W*B (every rank has the same batch sizes: the sampler pads).
  comm_.allreduce_sum(grads.data(), std::size_t(n));
  const float inv = 1.0f / float(samples_per_rank * comm_.size());
  Kokkos::parallel_for(
      "Trainer::scale_gradients", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { grads(i) *= inv; });
  const double lr = learning_rate(cfg_.train, step_, steps_per_epoch_);
  optimizer_->step(model_.parameters(), grads, lr);
  ++step_;
}

EpochStats Trainer::train_epoch(std::int64_t epoch) {
  DistributedSampler sampler(train_.size(), comm_.size(), comm_.rank(), cfg_.data.shuffle,
                             std::uint64_t(cfg_.train.seed), cfg_.data.drop_last);
  sampler.set_epoch(epoch);
  BatchLoader loader(train_, sampler.indices(), cfg_.train.batch_size, prefetch_);
  const std::int64_t batches = loader.num_batches();
  const int accumulation = cfg_.train.accumulation_steps;

  const double t0 = now();
  double loss_sum = 0.0, window_loss = 0.0;
  std::int64_t samples = 0, window_samples = 0, group_samples = 0;
  int micro = 0;
  Batch batch;
  model_.zero_grad();
  for (std::int64_t b = 0; loader.next(batch); ++b) {
    load_batch(batch);
    const Tensor& out = model_.forward(x_, /*training=*/true);
    loss_forward(loss_kind_, out, labels_, targets_, loss_, correct_);
    const double batch_loss = sum(loss_, batch.size);
    dout_.shape = out.shape;
    loss_backward(loss_kind_, out, labels_, targets_, 1.0f, dout_);  // per-sample sum, scaled at the step
    model_.backward(dout_);
    loss_sum += batch_loss;
    window_loss += batch_loss;
    samples += batch.size;
    window_samples += batch.size;
    group_samples += batch.size;
    // Gradient accumulation: only the last micro-step of a group talks to the other ranks.
    if (++micro < accumulation && b + 1 < batches) continue;
    reduce_and_step(group_samples);
    model_.zero_grad();
    group_samples = 0;
    micro = 0;
    if (cfg_.train.log_every > 0 && step_ % cfg_.train.log_every == 0) {
      char line[160];
      std::snprintf(line, sizeof line,
                    "  epoch %lld  step %lld  loss %.4f (rank 0, last %lld samples)  lr %.4g",
                    (long long)epoch + 1, (long long)step_, window_loss / double(window_samples),
                    (long long)window_samples, learning_rate(cfg_.train, step_ - 1, steps_per_epoch_));
      log::info(line);
      window_loss = 0.0;
      window_samples = 0;
    }
  }
  const double seconds = now() - t0;

  double totals[2] = {loss_sum, double(samples)};
  comm_.allreduce_sum(totals, 2);
  EpochStats stats;
  stats.epoch = epoch + 1;
  stats.step = step_;
  stats.train_loss = totals[0] / totals[1];
  stats.train_seconds = seconds;
  stats.samples_per_s = totals[1] / seconds;
  stats.data_wait_seconds = loader.wait_seconds();
  stats.lr = learning_rate(cfg_.train, step_ - 1, steps_per_epoch_);
  return stats;
}

ValStats Trainer::validate(ShardDataset& data) {
  // The validation set is cut into chunks of batch_size consecutive samples and
  // chunk c goes to rank c % W. A sample is then always evaluated in the same
  // batch at the same position, whatever the number of ranks, and each chunk's
  // sum is formed in a fixed order: the metrics are bitwise identical for any W,
  // and no sample is padded or counted twice.
  const std::int64_t B = cfg_.train.batch_size;
  const std::int64_t n = data.size();
  const std::int64_t chunks = (n + B - 1) / B;
  std::vector<std::int64_t> indices;
  for (std::int64_t c = comm_.rank(); c < chunks; c += comm_.size())
    for (std::int64_t i = c * B; i < std::min(n, (c + 1) * B); ++i) indices.push_back(i);

  std::vector<double> chunk_sums(std::size_t(2 * chunks), 0.0);  // (loss, correct) per chunk
  BatchLoader loader(data, std::move(indices), B, prefetch_);
  auto loss_host = Kokkos::create_mirror_view(loss_);
  auto correct_host = Kokkos::create_mirror_view(correct_);
  Batch batch;
  while (loader.next(batch)) {
    load_batch(batch);
    const Tensor& out = model_.forward(x_, /*training=*/false);
    loss_forward(loss_kind_, out, labels_, targets_, loss_, correct_);
    Kokkos::deep_copy(loss_host, loss_);
    Kokkos::deep_copy(correct_host, correct_);
    const std::size_t c = std::size_t(batch.index[0] / B);
    for (std::int64_t i = 0; i < batch.size; ++i) {
      chunk_sums[2 * c] += double(loss_host(i));
      chunk_sums[2 * c + 1] += double(correct_host(i));
    }
  }
  // Each chunk has one owner and zeros elsewhere, so the sum is exact.
  comm_.allreduce_sum(chunk_sums.data(), chunk_sums.size());
  ValStats stats;
  for (std::int64_t c = 0; c < chunks; ++c) {
    stats.loss_sum += chunk_sums[std::size_t(2 * c)];
    stats.correct += std::int64_t(chunk_sums[std::size_t(2 * c + 1)]);
  }
  stats.count = n;
  stats.loss = stats.loss_sum / double(n);
  stats.accuracy = double(stats.correct) / double(n);
  return stats;
}

void Trainer::fit(MetricsWriter* metrics) {
  const bool classify = loss_kind_ == LossKind::CrossEntropy;
  for (std::int64_t epoch = 0; epoch < cfg_.train.epochs; ++epoch) {
    const EpochStats e = train_epoch(epoch);
    ValStats v;
    double val_seconds = 0.0;
    if (val_) {
      const double t0 = now();
      v = validate(*val_);
      val_seconds = now() - t0;
    }
    char line[256];
    int len = std::snprintf(line, sizeof line, "epoch %lld/%d  step %lld  train_loss %.4f",
                            (long long)e.epoch, cfg_.train.epochs, (long long)e.step, e.train_loss);
    if (val_) len += std::snprintf(line + len, sizeof line - len, "  val_loss %.4f", v.loss);
    if (val_ && classify) len += std::snprintf(line + len, sizeof line - len, "  val_acc %.4f", v.accuracy);
    std::snprintf(line + len, sizeof line - len, "  samples/s %.0f  time %.2f s", e.samples_per_s,
                  e.train_seconds + val_seconds);
    log::info(line);

    if (!metrics) continue;
    MetricRecord r = {
        {"epoch", (long long)e.epoch}, {"step", (long long)e.step}, {"train_loss", e.train_loss}};
    if (val_) {
      r.push_back({"val_loss", v.loss});
      if (classify) r.push_back({"val_acc", v.accuracy});
      if (classify) r.push_back({"val_correct", (long long)v.correct});
      r.push_back({"val_count", (long long)v.count});
    }
    r.push_back({"samples_per_s", e.samples_per_s});
    r.push_back({"train_seconds", e.train_seconds});
    r.push_back({"val_seconds", val_seconds});
    r.push_back({"data_wait_seconds", e.data_wait_seconds});
    r.push_back({"lr", e.lr});
    r.push_back({"world_size", (long long)comm_.size()});
    metrics->write(r);
  }
}

}  // namespace ddp
