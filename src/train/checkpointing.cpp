#include "train/checkpointing.hpp"

#include <Kokkos_Core.hpp>
#include <chrono>
#include <cstdio>
#include <exception>

namespace ddp {

RunInput run_input(const Config& cfg) {
  return RunInput{cfg.to_namelist(), cfg.source_path, cfg.source_text};
}

ResumeOptions resume_options(const IoConfig& io) {
  return ResumeOptions{io.resume, io.run_dir, io.init_from, io.allow_data_change};
}

OptimizerSnapshot snapshot_of(Optimizer& optimizer) {
  OptimizerSnapshot snap{optimizer.name(), optimizer.steps(), {}};
  for (auto& [name, view] : optimizer.state()) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    snap.state.emplace_back(name, std::vector<float>(host.data(), host.data() + host.extent(0)));
  }
  return snap;
}

bool stopped_early(const TrainingState& pos, int patience) {
  return patience > 0 && pos.best_step >= 0 && pos.epoch - pos.patience_epoch >= patience;
}

std::string early_stop_text(const TrainingState& pos, const Config& cfg) {
  char text[512];
  if (cfg.train.min_delta > 0)
    std::snprintf(
        text, sizeof text,
        "%s has not improved by more than %g on %.4f (epoch %lld) for %lld epochs (train.patience = %d, "
        "train.min_delta = %g)",
        best_metric_name(pos.best_metric), cfg.train.min_delta, pos.patience_value,
        (long long)pos.patience_epoch, (long long)(pos.epoch - pos.patience_epoch), cfg.train.patience,
        cfg.train.min_delta);
  else
    std::snprintf(text, sizeof text,
                  "%s has not improved on %.4f (epoch %lld) for %lld epochs (train.patience = %d)",
                  best_metric_name(pos.best_metric), pos.patience_value, (long long)pos.patience_epoch,
                  (long long)(pos.epoch - pos.patience_epoch), cfg.train.patience);
  return text;
}

std::string nothing_to_train(const TrainingState& pos, const Config& cfg) {
  if (pos.epoch >= cfg.train.epochs)
    return "the run is complete (epoch " + std::to_string(pos.epoch) + " of " +
           std::to_string(cfg.train.epochs) + ", step " + std::to_string(pos.step) +
           "); raise train.epochs to continue it, or set io.resume = 'never' for a new run";
  if (stopped_early(pos, cfg.train.patience))
    return "the run stopped early at epoch " + std::to_string(pos.epoch) + ": " + early_stop_text(pos, cfg) +
           "; raise train.patience (0: off) to continue it";
  return "";
}

std::string dropped_best_text(const TrainingState& pos, const Config& cfg, bool held) {
  if (pos.best_step < 0) return "";
  const bool other = pos.best_metric != best_metric_index(cfg.io.keep_best);
  if (!other && held) return "";
  char record[128];
  std::snprintf(record, sizeof record, "%.4f at epoch %lld", pos.best_value, (long long)pos.best_epoch);
  const std::string then = cfg.io.keep_best == "none"
                               ? best_link(cfg.io.run_dir) + " is no longer updated"
                               : "the best is chosen again from this run's validations";
  if (other)
    return std::string("the checkpoint's run kept the best by ") + best_metric_name(pos.best_metric) + " (" +
           record + ", step " + std::to_string(pos.best_step) + ") and io.keep_best is '" + cfg.io.keep_best +
           "': " + then;
  return checkpoint_dir(cfg.io.run_dir) + " holds no checkpoint of step " + std::to_string(pos.best_step) +
         ", which has the best " + best_metric_name(pos.best_metric) + " so far (" + record + "): " + then;
}

void forget_best(TrainingState& pos, const Config& cfg) {
  pos.best_metric = best_metric_index(cfg.io.keep_best);
  pos.best_value = 0.0;
  pos.best_step = -1;
}

std::string save_checkpoint(const std::string& run_dir, int keep, const Model& model, Optimizer& optimizer,
                            const TrainingState& state, const Config& cfg, const DataFingerprint* data) {
  return save_checkpoint(run_dir, keep, model, snapshot_of(optimizer), state, run_input(cfg), data);
}

BackgroundCheckpoint::~BackgroundCheckpoint() {
  if (thread_.joinable()) thread_.join();
}

void BackgroundCheckpoint::start(std::unique_ptr<PendingCheckpoint> checkpoint) {
  checkpoint_ = std::move(checkpoint);
  ended_.store(false, std::memory_order_relaxed);
  error_.clear();
  thread_ = std::thread([this, t0 = std::chrono::steady_clock::now()] {
    try {
      checkpoint_->write();
    } catch (const CheckpointWriteError& e) {
      error_ = e.what();
    } catch (const std::exception& e) {  // bad_alloc: the job ends as for a full disk
      error_ = "cannot write checkpoint " + checkpoint_->path() + ": " + e.what();
    }
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ended_.store(true, std::memory_order_release);
  });
}

BackgroundCheckpoint::State BackgroundCheckpoint::state() const {
  if (!busy() || !ended_.load(std::memory_order_acquire)) return none_ended;
  return error_.empty() ? ended : failed;
}

BackgroundCheckpoint::Outcome BackgroundCheckpoint::finish() {
  thread_.join();
  Outcome o{checkpoint_->path(), error_, checkpoint_->size(), seconds_};
  checkpoint_.reset();
  return o;
}

std::optional<Checkpoint> find_start_checkpoint(MPI_Comm comm, const Config& cfg, const Model& model,
                                                const std::string& optimizer, bool* weights_only,
                                                const DataFingerprint* data,
                                                const std::vector<std::int64_t>* shares, bool values) {
  return find_start_checkpoint(comm, resume_options(cfg.io), model, optimizer, weights_only, data, shares,
                               values);
}

}  // namespace ddp
