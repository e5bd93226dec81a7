// An epoch of training and a pass of validation (train/trainer.hpp): the rank's
// batches in the sampler's order, forward, loss and backward per micro-batch, a step
// per accumulation group, progress lines, and the checkpoints due inside the epoch.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <utility>

#include "comm/check.hpp"
#include "comm/fault_injection.hpp"
#include "comm/log.hpp"
#include "comm/trace.hpp"
#include "comm/watchdog.hpp"
#include "io/sampler.hpp"
#include "model/rng.hpp"
#include "train/guards.hpp"
#include "train/schedule.hpp"
#include "train/signals.hpp"
#include "train/trainer.hpp"
#include "train/trainer_internal.hpp"

namespace ddp {

using trainer_detail::now;

namespace {

// acc(2) += the sum of loss[0..n) in double, in index order, on the device: the
// host reads it once per step, with the step's non-finite check after the gradient
// all-reduce, so the micro-batches' kernels queue without waiting for the GPU.
void accumulate_loss(const View1& loss, std::int64_t n, const Kokkos::View<double[3]>& acc) {
  Kokkos::parallel_for(
      "Trainer::accumulate_loss", Range(0, 1), KOKKOS_LAMBDA(int) {
        double s = 0.0;
        for (std::int64_t i = 0; i < n; ++i) s += double(loss(i));
        acc(2) += s;
      });
}

// Test hook (DDP_INJECT_FAULT=nan_gradient): v(0) = NaN, on the device.
void poison_first(const View1& v) {
  Kokkos::parallel_for(
      "Trainer::poison_first", Range(0, 1), KOKKOS_LAMBDA(int) {
        const float zero = v(0) * 0.0f;
        v(0) = zero / zero;  // 0/0: NaN without <cmath> on the device
      });
}

// (epoch, window, step) sums so far; resets the window's when asked.
std::array<double, 3> read_loss(const Kokkos::View<double[3]>& acc, bool reset_window) {
  auto host = Kokkos::create_mirror_view(acc);
  Kokkos::deep_copy(host, acc);
  // Read before the reset: on the host the mirror is `acc` itself.
  const std::array<double, 3> sums = {host(0), host(1), host(2)};
  if (reset_window) {
    host(1) = 0.0;
    Kokkos::deep_copy(acc, host);
  }
  return sums;
}

using SampleTrace = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

// io.trace_samples (debug): the global indices this rank trains, one per line, appended.
SampleTrace open_sample_trace(const Config& cfg, int rank, std::int64_t epoch) {
  SampleTrace trace(nullptr, std::fclose);
  if (!cfg.io.trace_samples) return trace;
  const std::string path =
      cfg.io.run_dir + "/samples_rank" + std::to_string(rank) + "_epoch" + std::to_string(epoch + 1) + ".txt";
  trace.reset(std::fopen(path.c_str(), "a"));
  if (!trace) DDP_FATAL("io.trace_samples: cannot open '" << path << "'");
  return trace;
}

}  // namespace

EpochStats Trainer::train_epoch(std::int64_t epoch) {
  pos_.epoch = epoch;
  pos_.consumed = 0;
  pos_.epoch_loss_sum = 0.0;
  pos_.epoch_samples = 0.0;
  return run_epoch(false, nullptr);
}

Trainer::EpochRun Trainer::begin_epoch() {
  EpochRun r;
  r.epoch = pos_.epoch;
  r.start = pos_.consumed;
  // The epoch's training loss so far, from the checkpoint this run resumed from
  // (a global sum, counted once, on rank 0).
  r.prior_loss = comm_.rank() == 0 ? pos_.epoch_loss_sum : 0.0;
  r.prior_samples = comm_.rank() == 0 ? pos_.epoch_samples : 0.0;
  r.t0 = now();
  // The span since the last progress line (or the epoch's start): its samples/s, and
  // the rate behind the time left.
  r.mark = r.t0;
  r.mark_consumed = r.start;
  Kokkos::deep_copy(loss_acc_, 0.0);
  model_.zero_grad();
  step_indices_.clear();
  r.graph_replays = graphs_.replays();
  r.graph_captures = graphs_.captures();
  return r;
}

EpochStats Trainer::run_epoch(bool checkpoints, Agreed* pending) {
  // The two batches in hand and the loader's take the last epoch's buffers; all
  // go back to batch_buffers_ at the epoch's end (the loader's when it is reset).
  const auto reused = [this] {
    if (batch_buffers_.empty()) return Batch{};
    Batch b = std::move(batch_buffers_.back());
    batch_buffers_.pop_back();
    return b;
  };
  Batch batch = reused(), next = reused();
  // Stopped before a run ends on an error: its prefetch thread must not be in HDF5
  // while the ranks leave through MPI_Finalize.
  auto loader = std::make_unique<BatchLoader>(
      train_,
      epoch_indices(train_.size(), comm_.size(), comm_.rank(), cfg_.data.shuffle, std::uint64_t(pos_.seed),
                    cfg_.data.drop_last, pos_.epoch, pos_.consumed),
      cfg_.train.batch_size, prefetch_, /*keep_uint8=*/transform_ != nullptr, &batch_buffers_);
  // The epoch and the global indices key each sample's draws: the same augmented
  // sample on any number of ranks and after a resume.
  const BatchTransform augment{transform_.get(), image_shape(train_), pos_.epoch, /*training=*/true};
  const BatchTransform* const bt = transform_ ? &augment : nullptr;
  const int accumulation = cfg_.train.accumulation_steps;
  const SampleTrace trace = open_sample_trace(cfg_, comm_.rank(), pos_.epoch);
  EpochRun r = begin_epoch();
  r.batches = loader->num_batches();
  EpochStats stats;
  // One batch ahead: batch b+1 is put once step b's kernels are queued, so on a GPU
  // the host copies it into pinned memory (38.5 MB for ResNet-50's batch of 256,
  // about 5 ms of data wait a step when it was put before the step's kernels) and
  // its transfer runs while the GPU computes step b; slot b is released once all of
  // step b is queued.
  watchdog::set_phase(Phase::data);
  trace_step_start();
  int slot = -1, next_slot = -1;
  {
    const trace::Span span("data wait", "data");
    slot = loader->next(batch) ? stage_.put(batch, bt) : -1;
  }
  for (std::int64_t b = 0; slot >= 0; ++b, slot = next_slot, std::swap(batch, next)) {
    if (r.micro == 0 && b > 0) trace_step_start();
    use_inputs(slot, batch);
    // Gradient accumulation: only the last micro-step of a group talks to the
    // other ranks; its buckets start as backward completes them.
    forward_backward(slot, batch, r.micro + 1 >= accumulation || b + 1 == r.batches, stats);
    watchdog::set_phase(Phase::data);
    {
      const trace::Span span("data wait", "data");
      next_slot = loader->next(next) ? stage_.put(next, bt) : -1;
    }
    ++r.micro_batches;
    r.samples += batch.size;
    r.group_samples += batch.size;
    step_indices_.insert(step_indices_.end(), batch.index.begin(), batch.index.begin() + batch.size);
    if (trace)
      for (std::int64_t i = 0; i < batch.size; ++i)
        std::fprintf(trace.get(), "%lld\n", (long long)batch.index[i]);
    if (++r.micro < accumulation && b + 1 < r.batches) continue;
    Agreed a = reduce_and_step(r.group_samples, graph_plan_.collectives, stats);
    if (a.stop) {
      r.nonfinite = true;
      break;
    }
    if (!after_step(r, a)) break;
    if (a.written != BackgroundCheckpoint::none_ended && !background_written(r, a)) break;
    if (!checkpoints) continue;
    a.step_due = cfg_.io.checkpoint_every_steps > 0 && step_ % cfg_.io.checkpoint_every_steps == 0;
    if (b + 1 == r.batches) {  // the epoch's end: fit() checkpoints after validation
      *pending = a;
      break;
    }
    if ((a.preempt || a.time_due || a.step_due) && checkpoint_mid_epoch(r, a)) break;
  }
  batch_buffers_.push_back(std::move(batch));
  batch_buffers_.push_back(std::move(next));
  return end_epoch(r, loader, stats);
}

void Trainer::forward_backward(int slot, const Batch& batch, bool last_micro, EpochStats& stats) {
  watchdog::set_phase(Phase::compute);
  inject_fault(FaultSite::train_step, step_);  // tests only: DDP_INJECT_FAULT
  inject_step_delay();                         // tests only: DDP_TEST_STEP_DELAY_US
  const double t_forward = now();
  double t_backward = t_forward;
  model_.reseed_dropout(hash64(dropout_key_, std::uint64_t(pos_.dropout_position++)));
  const bool poisoned = inject_fault(FaultSite::loss_gradient, step_);  // tests only
  const float loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  const bool reduce = last_micro && graph_plan_.collectives;
  // What a CUDA graph captures (train.cuda_graph): device work only, every host value
  // its kernels take in the key below.
  const auto work = [&] {
    // One span after the other (emplace ends the previous one first); no heap on the hot path.
    std::optional<trace::Span> span(std::in_place, "forward", "forward");
    const Tensor& out = model_.forward(x_, /*training=*/true);
    span.emplace("loss", "forward");
    const float smoothing = static_cast<float>(cfg_.train.label_smoothing);
    // The loss and its gradient in one kernel: per-sample sums, scaled at the step;
    // fp16 multiplies by the loss scale first.
    loss_forward_backward(loss_kind_, out, labels_, targets_, loss_scale, loss_, correct_, dout_, smoothing,
                          label_rows_, loss_rows_);
    accumulate_loss(loss_, batch.size, loss_acc_);
    t_backward = now();
    if (poisoned) poison_first(dout_.data);
    if (span->on()) Kokkos::fence();
    span.emplace("backward", "backward");
    if (reducer_ && last_micro) {
      model_.backward(dout_, [this](std::int64_t offset) { reducer_->mark_ready(offset); });
    } else {
      model_.backward(dout_);
    }
    span.reset();
    if (reduce) reduce_gradients();
  };
  if (graph_plan_.on) {
    const StepGraphKey key{slot, batch.size, model_.writes_gradients(), last_micro, loss_scale, poisoned};
    const auto before_drop = [&] {
      comm_.wait_device("the collectives queued before a CUDA graph's release (NCCL)");
    };
    if (!graphs_.run(key, work, before_drop)) model_.replayed_backward();
  } else {
    work();
  }
  stage_.release(slot);
  stats.forward_seconds += t_backward - t_forward;
  stats.backward_seconds += now() - t_backward;
}

bool Trainer::after_step(EpochRun& r, const Agreed& a) {
  if (a.stepped) {
    r.loss_samples += r.group_samples;
    r.window_samples += r.group_samples;
  }
  model_.zero_grad();  // nothing to wait for: the next backward writes the gradients
  if (trace_step_begin_ >= 0 && trace::recording())
    trace::record(
        "step " + std::to_string(step_), "step", trace::kMainRow, trace_step_begin_, trace::now_ns(),
        "\"epoch\": " + std::to_string(r.epoch + 1) + ", \"samples\": " + std::to_string(r.group_samples));
  trace_step_begin_ = -1;
  r.group_samples = 0;
  r.micro = 0;
  // Every rank trains the same number of samples: positions of the global order done.
  pos_.consumed = r.start + r.samples * comm_.size();
  const bool check = cfg_.comm.check_every > 0 && step_ % cfg_.comm.check_every == 0;
  const bool log = cfg_.train.log_every > 0 && step_ % cfg_.train.log_every == 0;
  // Both read device memory, after the step's last collectives (ZeRO's all-gather).
  if (check || log) comm_.wait_device("the step's last collectives (NCCL, on the device)");
  if (check) {
    r.problem = parameters_disagree(comm_.mpi_comm(), model_, step_);
    if (!r.problem.empty()) return false;
  }
  if (log) progress_line(r);
  return true;
}

void Trainer::progress_line(EpochRun& r) {
  const double window_loss = read_loss(loss_acc_, /*reset_window=*/true)[1];
  const double t = now();
  const double span_rate = t > r.mark ? double(pos_.consumed - r.mark_consumed) / (t - r.mark) : 0.0;
  eta_.trained(t - r.mark, pos_.consumed - r.mark_consumed);
  r.mark = t;
  r.mark_consumed = pos_.consumed;
  const double fraction = std::clamp(double(pos_.consumed) / double(epoch_positions_), 0.0, 1.0);
  const double loss = window_loss / double(r.window_samples);
  const double lr = learning_rate(cfg_.train, pos_.lr_step - 1, steps_per_epoch_, pos_.plateau_lr);
  // The last step's total gradient norm, before clipping (clip_grad_norm_'s value).
  char norm[40] = "";
  if (cfg_.train.clip_grad_norm > 0) std::snprintf(norm, sizeof norm, "  grad_norm %.4g", grad_norm_);
  char line[320];
  std::snprintf(line, sizeof line,
                "  epoch %lld/%d %d%%  step %lld  loss %.4f (rank 0, last %lld samples)  lr %.4g%s  "
                "samples/s %.0f  eta epoch %s, run %s",
                (long long)r.epoch + 1, cfg_.train.epochs, int(std::floor(100.0 * fraction)),
                (long long)step_, loss, (long long)r.window_samples, lr, norm, span_rate,
                duration_text(eta_.epoch_left(r.epoch, pos_.consumed)).c_str(),
                duration_text(eta_.run_left(r.epoch, pos_.consumed)).c_str());
  log::info(line);
  if (tb_) {
    tb_->scalar("train/loss", step_, loss);
    tb_->scalar("train/lr", step_, lr);
    if (cfg_.train.clip_grad_norm > 0) tb_->scalar("train/grad_norm", step_, grad_norm_);
    tb_->scalar("train/samples_per_s", step_, span_rate);
    tb_->flush();
  }
  r.window_samples = 0;
}

bool Trainer::background_written(EpochRun& r, const Agreed& a) {
  const std::string error = comm_.rank() == 0 ? finish_background() : "";
  if (a.written != BackgroundCheckpoint::failed) return true;
  // Every rank ends here together (end_epoch's fatal_all); rank 0's line says why.
  r.problem = comm_.rank() == 0 ? error : "rank 0 could not write a checkpoint";
  return false;
}

bool Trainer::checkpoint_mid_epoch(EpochRun& r, const Agreed& a) {
  comm_.wait_device("the step's last collectives, before a checkpoint (NCCL, on the device)");  // ZeRO's
  double partial[2] = {read_loss(loss_acc_, false)[0] + r.prior_loss,
                       double(r.loss_samples) + r.prior_samples};
  comm_.allreduce_sum_host(partial, 2);
  pos_.epoch_loss_sum = partial[0];
  pos_.epoch_samples = partial[1];
  r.problem = unsafe_to_save();
  if (!r.problem.empty()) return true;
  const std::string path = checkpoint(cfg_.io.checkpoint_async && !a.preempt);
  if (!a.preempt) return false;
  r.stopped = true;
  char line[512];
  std::snprintf(line, sizeof line, "preempted: checkpoint %s written at step %lld; exit %d for requeue",
                path.c_str(), (long long)step_, kExitRequeue);
  log::info(line);
  return true;
}

EpochStats Trainer::end_epoch(EpochRun& r, std::unique_ptr<BatchLoader>& loader, EpochStats& stats) {
  // A GPU may still be running the last step's kernels and collectives.
  comm_.wait_device("the end of the epoch's collectives (NCCL, on the device)");
  Kokkos::fence();
  const double seconds = now() - r.t0;
  eta_.trained(r.t0 + seconds - r.mark, pos_.consumed - r.mark_consumed);
  stats.data_wait_seconds = loader->wait_seconds();
  loader.reset();
  if (graph_plan_.on)  // rank 0's own count: every rank runs the same micro-batches
    log::info("CUDA graph: " + std::to_string(graphs_.replays() - r.graph_replays) + " of " +
              std::to_string(r.micro_batches) + " micro-batches of epoch " + std::to_string(r.epoch + 1) +
              " ran from a graph (" + std::to_string(graphs_.captures() - r.graph_captures) + " captured)");
  if (r.nonfinite) stop_nonfinite();
  if (!r.problem.empty()) fatal_all(comm_.mpi_comm(), r.problem);
  if (const std::string changed = data_changed(); !changed.empty()) fatal_all(comm_.mpi_comm(), changed);

  double totals[3] = {read_loss(loss_acc_, false)[0] + r.prior_loss, double(r.loss_samples) + r.prior_samples,
                      double(r.samples)};
  comm_.allreduce_sum_host_waiting(totals, 3);
  stats.epoch = r.epoch + 1;
  stats.step = step_;
  stats.train_loss = totals[1] > 0 ? totals[0] / totals[1] : std::nan("");
  stats.train_seconds = seconds;
  stats.samples_per_s = totals[2] / seconds;
  stats.lr = learning_rate(cfg_.train, pos_.lr_step - 1, steps_per_epoch_, pos_.plateau_lr);
  stats.loss_scale = scaler_ ? scaler_->scale() : 0.0;
  stats.complete = !r.stopped;
  if (!r.stopped) {
    pos_.epoch = r.epoch + 1;
    pos_.consumed = 0;
    pos_.epoch_loss_sum = 0.0;
    pos_.epoch_samples = 0.0;
  }
  return stats;
}

ValStats Trainer::validate(ShardDataset& data) {
  // The validation set is cut into chunks of batch_size consecutive samples and
  // chunk c goes to rank c % W. A sample is then always evaluated in the same
  // batch at the same position, whatever the number of ranks, and each chunk's
  // sum is formed in a fixed order: the metrics are bitwise identical for any W,
  // and no sample is padded or counted twice.
  watchdog::set_phase(Phase::validation);
  const trace::Span span("validation", "validation");
  // Batch norm's running statistics are each rank's own, updated from its own
  // batches (unless synchronised); rank 0's are the model's, as DDP's broadcast_buffers
  // makes them: those its checkpoints hold, and every rank validates with them.
  if (const std::size_t n = model_.buffers().extent(0); n > 0) {
    comm_.broadcast(model_.buffers().data(), n, 0);
    comm_.wait_device("the broadcast of rank 0's batch-norm statistics (NCCL, on the device)");
  }
  const std::int64_t B = cfg_.train.batch_size;
  const std::int64_t n = data.size();
  const std::int64_t chunks = (n + B - 1) / B;
  std::vector<std::int64_t> indices;
  for (std::int64_t c = comm_.rank(); c < chunks; c += comm_.size())
    for (std::int64_t i = c * B; i < std::min(n, (c + 1) * B); ++i) indices.push_back(i);

  // (loss, correct, top-5 hits) per chunk; top-5 where there are more than 5 classes.
  const bool top5 =
      loss_kind_ == LossKind::CrossEntropy && shape_numel(model_.output_shape()) / label_rows_ > 5;
  std::vector<double> chunk_sums(std::size_t(3 * chunks), 0.0);
  BatchLoader loader(data, std::move(indices), B, prefetch_, /*keep_uint8=*/transform_ != nullptr);
  // Evaluation: the centre crop, no augmentation, the same normalize.
  const BatchTransform eval{transform_.get(), image_shape(data), 0, /*training=*/false};
  const double rows = double(label_rows_);
  auto loss_host = Kokkos::create_mirror_view(loss_);
  auto correct_host = Kokkos::create_mirror_view(correct_);
  auto hits_host = Kokkos::create_mirror_view(hits5_);
  Batch batch;
  while (loader.next(batch)) {
    const int slot = stage_.put(batch, transform_ ? &eval : nullptr);
    use_inputs(slot, batch);
    const Tensor& out = model_.forward(x_, /*training=*/false);
    loss_forward(loss_kind_, out, labels_, targets_, loss_, correct_, 0.0f, label_rows_, loss_rows_);
    if (top5) top_k_hits(out, labels_, 5, hits5_, label_rows_, loss_rows_);
    stage_.release(slot);
    Kokkos::deep_copy(loss_host, loss_);
    Kokkos::deep_copy(correct_host, correct_);
    if (top5) Kokkos::deep_copy(hits_host, hits5_);
    double* sums = &chunk_sums[std::size_t(3 * (batch.index[0] / B))];
    for (std::int64_t i = 0; i < batch.size; ++i) {
      sums[0] += double(loss_host(i));
      // A token sample's correct is its fraction of T tokens, (k / T) as a float: times
      // T it rounds back to k (exact below 2^23 tokens), so the counts stay exact.
      sums[1] += label_rows_ == 1 ? double(correct_host(i)) : std::nearbyint(double(correct_host(i)) * rows);
      if (top5)
        sums[2] += label_rows_ == 1 ? double(hits_host(i)) : std::nearbyint(double(hits_host(i)) * rows);
    }
  }
  // Each chunk has one owner and zeros elsewhere, so the sum is exact.
  comm_.allreduce_sum_host_waiting(chunk_sums.data(), chunk_sums.size());
  ValStats stats;
  for (std::int64_t c = 0; c < chunks; ++c) {
    stats.loss_sum += chunk_sums[std::size_t(3 * c)];
    stats.correct += std::int64_t(chunk_sums[std::size_t(3 * c + 1)]);
    stats.correct5 += std::int64_t(chunk_sums[std::size_t(3 * c + 2)]);
  }
  stats.count = n;
  stats.tokens = label_rows_ > 1 ? n * label_rows_ : 0;
  const double targets = double(n * label_rows_);  // samples, or tokens
  stats.loss = stats.loss_sum / double(n);
  stats.accuracy = double(stats.correct) / targets;
  stats.top5 = top5;
  stats.accuracy5 = double(stats.correct5) / targets;
  watchdog::set_phase(Phase::compute);
  return stats;
}

}  // namespace ddp
