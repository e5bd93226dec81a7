#pragma once
// What a checkpoint holds of the run's config and optimizer, assembled from them
// for the checkpoint layer (io/checkpoint.hpp), which knows nothing of src/train.

#include <mpi.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "io/checkpoint.hpp"
#include "io/shard_dataset.hpp"
#include "model/model.hpp"
#include "train/config.hpp"
#include "train/optimizer.hpp"

namespace ddp {

// The input file as / keeps it: the resolved namelist, the path and text as read.
RunInput run_input(const Config& cfg);

// The io.* settings that choose where a run starts.
ResumeOptions resume_options(const IoConfig& io);

// An optimizer that owns every parameter, its state copied to the host. (Under ZeRO
// the trainer gathers the ranks' shares itself: Trainer::optimizer_snapshot.)
OptimizerSnapshot snapshot_of(Optimizer& optimizer);

// save_checkpoint of io/checkpoint.hpp, from the optimizer and config themselves.
std::string save_checkpoint(const std::string& run_dir, int keep, const Model& model, Optimizer& optimizer,
                            const TrainingState& state, const Config& cfg, const DataFingerprint* data);

// io.checkpoint_async, rank 0: one checkpoint at a time put on disk
// (PendingCheckpoint::write) on a thread of its own while the ranks train on. The
// trainer asks state() at every step's agreement and finish()es the write when it
// has ended, or before it makes the next checkpoint.
class BackgroundCheckpoint {
 public:
  BackgroundCheckpoint() = default;
  ~BackgroundCheckpoint();  // waits for a write under way
  BackgroundCheckpoint(const BackgroundCheckpoint&) = delete;
  BackgroundCheckpoint& operator=(const BackgroundCheckpoint&) = delete;

  void start(std::unique_ptr<PendingCheckpoint> checkpoint);  // none under way
  bool busy() const { return checkpoint_ != nullptr; }
  enum State { none_ended = 0, ended = 1, failed = 2 };
  State state() const;  // none_ended: none under way, or still writing
  struct Outcome {
    std::string path;
    std::string error;  // CheckpointWriteError's text; "" when it is on disk
    std::size_t bytes = 0;
    double seconds = 0.0;  // from start() to the write's end
  };
  Outcome finish();  // waits for the write under way (busy() must be true)

 private:
  std::unique_ptr<PendingCheckpoint> checkpoint_;
  std::thread thread_;
  std::atomic<bool> ended_{false};
  std::string error_;     // written by the thread before ended_
  double seconds_ = 0.0;  // likewise
};

// Where a run stands against its input, from the position a checkpoint holds: the
// trainer at a start, ddp_train --check, alike.
// train.patience: the run has had `patience` epochs without a better io.keep_best
// metric since pos.patience_epoch (pos.best_step >= 0: a record).
bool stopped_early(const TrainingState& pos, int patience);
// "val_acc has not improved on 0.7612 (epoch 40) for 5 epochs (train.patience = 5)".
std::string early_stop_text(const TrainingState& pos, const Config& cfg);
// "" when a start from `pos` has epochs to train, else why not: "the run is complete
// (...); raise train.epochs ..." or "the run stopped early at epoch E: ...; raise
// train.patience ...".
std::string nothing_to_train(const TrainingState& pos, const Config& cfg);
// A checkpoint's io.keep_best record (pos.best_*) carries on into a start from it where
// io.keep_best names the record's metric and the run directory holds the record's
// checkpoint (`held`, looked at by the caller; not read where the metrics differ).
// Returns "" where it carries on or there is none, else why not and what follows, one
// text for the trainer's line and --check's: "<dir>/checkpoints holds no checkpoint of
// step 10, which has the best val_loss so far (0.5400 at epoch 2): the best is chosen
// again from this run's validations".
std::string dropped_best_text(const TrainingState& pos, const Config& cfg, bool held);
// The position without a record: of io.keep_best's metric, none chosen yet.
void forget_best(TrainingState& pos, const Config& cfg);

// find_start_checkpoint of io/checkpoint.hpp, per cfg.io (resume, run_dir, init_from,
// allow_data_change). Collective. `shares`, `values`: see there.
std::optional<Checkpoint> find_start_checkpoint(MPI_Comm comm, const Config& cfg, const Model& model,
                                                const std::string& optimizer, bool* weights_only,
                                                const DataFingerprint* data,
                                                const std::vector<std::int64_t>* shares = nullptr,
                                                bool values = true);

}  // namespace ddp
