#pragma once
// HDF5 checkpoints: written by rank 0 alone (made in memory by serial HDF5, then
// write(2); no MPI-IO), atomically (temp file, fsync, rename, fsync of the directory,
// then the `latest` pointer the same way), the last `keep` kept. Read by rank 0,
// checked, broadcast to all ranks.
//
// <run_dir>/checkpoints/ckpt_<step, 9 digits>.h5, <run_dir>/checkpoints/latest (its name),
// <run_dir>/checkpoints/best.h5 (io.keep_best: a symbolic link to the checkpoint of the
// best validation so far, never removed by keep-K or by making room on a full disk)
//
//   /model/layers.<i>.weight|bias      float32, PyTorch layouts (Linear (out, in))
//   /model/<buffer name>               float32, Model::buffer_table() (BatchNorm stats)
//   /optimizer/<state name>            float32 (num_parameters), the model's flat parameter
//                                      order; attribute `name` ("SGD" | "AdamW")
//   /optimizer/steps                   int64, optimizer steps taken
//   /state/{epoch, step, consumed, seed, lr_step, dropout_position, world_size}  int64
//   /state/{epoch_loss_sum, epoch_samples}                                       float64
//   /state/best_<metric>, /state/{best_step, best_epoch}  float64, int64 (io.keep_best
//                                      only): the best value of the validation metric
//                                      (val_loss, val_acc, val_acc5) so far, the step of
//                                      the checkpoint that holds it, the epochs done then
//   /state/{patience_value, patience_epoch}  float64, int64 (with those): train.patience's
//                                      reference (TrainingState); absent: the best's
//   /data/train/{counts, hashes}       int64 (files): the training set's DataFingerprint
//                                      (hashes: the uint64 bits),
//   /data/train/{x_shape, y_shape}     int64 (dims): per-sample shapes
//   /data/train/samples                int64: sum of counts; attribute `files`: the
//                                      shard paths, one per line (not under the checksum)
//   attributes of /: format "ddp_train.checkpoint", format_version 1, world_size,
//   config (resolved namelist), source_path, source_text (the input file as read),
//   checksum "fnv1a64:<16 hex>" over every dataset (its path, then its bytes, in
//   path order), verified at load.
//
// Writing on a disk that fills up: our own temp files of earlier attempts are removed
// first (a writer killed or refused mid-write leaves one); the file is made in memory
// (HDF5's core driver: one more host copy of the checkpoint while it is written), so
// its exact size is known before the disk is touched; when the file system has less
// free, the oldest checkpoints go first (never the newest valid one), with a warning.
// A write that still fails removes its temp file, leaves `latest` naming the previous
// checkpoint and throws CheckpointWriteError.
//
// A checkpoint is unusable (CheckpointError) when its checksum does not match or a
// value of /model or /optimizer is NaN or Inf: resume 'auto' then takes the one before.
// /data/train missing (a checkpoint from before it was recorded) loads, with a warning
// that the data cannot be checked.
//
// The checkpoint layer knows nothing of src/train: what a checkpoint holds of the
// run's config and optimizer comes in as plain data (RunInput, OptimizerSnapshot,
// ResumeOptions), assembled by train/checkpointing.hpp. Its sources, by job:
// checkpoint_format.cpp (the schema, blobs and checksum, the file made in memory),
// checkpoint_read.cpp (read and verified, load_checkpoint), checkpoint_write.cpp
// (temp file, fsync, rename, `latest`, keep-K, room on a full disk),
// checkpoint_select.cpp (candidates, the start of a run, its broadcast, the resumed
// sample order), checkpoint_data.cpp (the training data then and now),
// checkpoint_init_from.cpp (io.init_from: ours or PyTorch's weights).

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "io/shard_dataset.hpp"
#include "model/model.hpp"

namespace ddp {

// A checkpoint that cannot be used: unreadable, truncated, checksum mismatch,
// NaN or Inf in its weights or optimizer state.
// The message is the reason, without the file name.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A checkpoint that could not be written; the message is the whole one-line report
// (the file, the cause, the free space, which checkpoint stays the latest).
struct CheckpointWriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where training stands: the /state group.
struct TrainingState {
  std::int64_t epoch = 0;             // 0-based epoch in progress (epochs done when consumed == 0)
  std::int64_t step = 0;              // optimizer steps taken
  std::int64_t consumed = 0;          // positions of the epoch's global sample order already trained
  std::int64_t seed = 0;              // train.seed: the sampler permutation of epoch e uses seed + e
  std::int64_t lr_step = 0;           // learning-rate schedule position (the next step's index)
  std::int64_t dropout_position = 0;  // micro-batches per rank since the start: the dropout stream
  std::int64_t world_size = 0;        // ranks of the run that wrote it
  double epoch_loss_sum = 0.0;        // training loss summed over the epoch's trained samples, all ranks
  double epoch_samples = 0.0;         // samples (with padding) trained in the epoch, all ranks
  double loss_scale = 0.0;            // fp16's dynamic loss scale; 0: none (fp32, bf16)
  std::int64_t loss_scale_clean_steps = 0;  // fp16: clean steps since the scale last changed
  // io.keep_best: the validation metric that names the best checkpoint (best_metric_name),
  // its best value so far, the step of the checkpoint that holds that value (-1: none
  // yet) and the epochs done then. A checkpoint whose step is best_step becomes best.h5
  // when written.
  std::int64_t best_metric = 0;  // 0: none
  double best_value = 0.0;
  std::int64_t best_step = -1;
  std::int64_t best_epoch = 0;
  // train.patience counts from the last epoch that counted as better: the first
  // validated, then each that beat the last that counted by more than train.min_delta.
  // Its value and epoch (with min_delta 0, the best's).
  double patience_value = 0.0;
  std::int64_t patience_epoch = 0;
  // train.schedule = 'plateau' (0 in all five otherwise): the rate after warm-up (0:
  // train.lr, none reduced yet), the best value of train.plateau_metric so far and the
  // epochs done then (0: none yet), the epochs since that counted as not better, and the
  // cooldown epochs left.
  double plateau_lr = 0.0;
  double plateau_best = 0.0;
  std::int64_t plateau_epoch = 0;
  std::int64_t plateau_bad_epochs = 0;
  std::int64_t plateau_cooldown = 0;
};

// io.keep_best's names by TrainingState::best_metric: "none", "val_loss", "val_acc",
// "val_acc5" ("" past them); and back (-1: not one of them).
const char* best_metric_name(std::int64_t metric);
std::int64_t best_metric_index(const std::string& name);
std::vector<std::string> best_metric_names();       // all of them, in that order: io.keep_best's choices
constexpr const char* kBestLink = "best.h5";        // in checkpoint_dir
std::string best_link(const std::string& run_dir);  // <run_dir>/checkpoints/best.h5

// Whether <run_dir>/checkpoints holds the checkpoint of `step` (ckpt_<step>.h5).
bool holds_checkpoint(const std::string& run_dir, std::int64_t step);

// io.keep_best, rank 0 at start-up: "" when best.h5 is absent or a symbolic link (the
// one ddp_train keeps), else the error line: a file or directory put there, which the
// next best would replace (a file) or fail on (a directory).
std::string best_link_problem(const std::string& run_dir);

// Rank 0, at a resume whose checkpoint records the best at `best_step`: whether
// <run_dir>/checkpoints holds that step's checkpoint. If it does and best.h5 names
// another (a checkpoint of a continuation this resume leaves behind) or none, best.h5
// is made to name it, with a line; a failure to is a warning, and the run goes on.
bool restore_best_link(const std::string& run_dir, std::int64_t best_step);

// A checkpoint in host memory, checked against the model it is for.
struct Checkpoint {
  std::string path;
  TrainingState state;
  std::vector<float> parameters;  // (num_parameters) the model's flat layout
  std::vector<float> buffers;     // (buffer block size)
  std::string optimizer;          // "SGD" | "AdamW"
  std::int64_t optimizer_steps = 0;
  // Each (num_parameters), or on a rank that asked for its share only (ZeRO, see
  // find_start_checkpoint) the values [optimizer_offset, optimizer_offset + size).
  std::vector<std::pair<std::string, std::vector<float>>> optimizer_state;
  std::int64_t optimizer_offset = 0;
  std::string config;                   // resolved namelist of the run that wrote it
  std::optional<DataFingerprint> data;  // its training set; none before it was recorded
};

std::string checkpoint_dir(const std::string& run_dir);  // <run_dir>/checkpoints
std::string checkpoint_name(std::int64_t step);          // ckpt_000001234.h5

// What a checkpoint keeps of the run's input file: attributes of /.
struct RunInput {
  std::string config;       // the resolved namelist (Config::to_namelist)
  std::string source_path;  // the input file's path
  std::string source_text;  // the input file as read
};

// What a checkpoint holds of the optimizer: its name, steps and whole state on the
// host (num_parameters each, by torch's names), however the run keeps it (under
// ZeRO the trainer gathers the ranks' shares into one).
struct OptimizerSnapshot {
  std::string name;
  std::int64_t steps = 0;
  std::vector<std::pair<std::string, std::vector<float>>> state;
};

namespace ckpt {
class FileImage;
}

// A checkpoint made in memory by rank 0, put on disk by write(): save_checkpoint in
// two halves, so that the second can run on a thread of its own while the ranks
// train on (io.checkpoint_async). Construction calls HDF5 (it takes hdf5_mutex()),
// removes the temp files of earlier attempts and makes room on a full disk (as
// save_checkpoint, below); write() makes system calls only (open, write,
// sync_file_range, fsync, rename, unlink), so any one thread may call it, once. The
// next checkpoint is made only once this one's write has ended: its construction
// removes temp files.
class PendingCheckpoint {
 public:
  PendingCheckpoint(const std::string& run_dir, int keep, const Model& model, OptimizerSnapshot optimizer,
                    const TrainingState& state, const RunInput& input, const DataFingerprint* data);
  ~PendingCheckpoint();
  PendingCheckpoint(const PendingCheckpoint&) = delete;
  PendingCheckpoint& operator=(const PendingCheckpoint&) = delete;

  std::string path() const;  // <run_dir>/checkpoints/ckpt_<step>.h5
  std::size_t size() const;  // the file's bytes
  // The file, then `latest`, then best.h5 where this checkpoint holds the best
  // validation (state.best_step is its step); removes all but the newest `keep` and the
  // one best.h5 names. CheckpointWriteError when it cannot.
  void write();

 private:
  std::string run_dir_, name_;
  int keep_;
  bool best_;
  std::unique_ptr<ckpt::FileImage> image_;
};

// Rank 0 only. Writes the checkpoint of `step` with the fingerprint of the training
// data (`data`; null: none), updates `latest` (and best.h5, as PendingCheckpoint::
// write), removes all but the newest `keep` checkpoints and the best. Returns the
// path; CheckpointWriteError when it cannot (disk full, see above). Test hook:
// DDP_TEST_CHECKPOINT_DELAY_MS=<ms> sleeps between the fsync of the temp file
// (ckpt_<step>.h5.tmp.<pid>) and its rename, so that a test can kill the writer at
// that point. Takes hdf5_mutex(). `optimizer` is taken (moved in): its state is
// released as the file takes it, not held beside the file's image.
std::string save_checkpoint(const std::string& run_dir, int keep, const Model& model,
                            OptimizerSnapshot optimizer, const TrainingState& state, const RunInput& input,
                            const DataFingerprint* data);

// Any process. Reads `path`, verifies format, checksum and finite values
// (CheckpointError when the file is unusable) and its fit to `model` (InputError: the
// model or the optimizer differs from the run's). `optimizer` empty: weights only,
// any optimizer.
Checkpoint load_checkpoint(const std::string& path, const Model& model, const std::string& optimizer);

// Any process. io.init_from: the weights of `path`, a checkpoint of ours (checked as
// load_checkpoint does) or a weights-only file: /model/<name> datasets in PyTorch's
// names and layouts and nothing else required (no /state, no /optimizer, no checksum;
// any float or integer type). Names: ours, "layers.<i>.<param>", or a bare
// nn.Sequential's "<i>.<param>". A missing, misshapen or non-finite tensor is an
// InputError naming each (the tensor, the shape expected and the one found);
// num_batches_tracked may be missing; tensors the model has no place for are ignored
// with one warning. CheckpointError when the file cannot be read.
Checkpoint load_initial_weights(const std::string& path, const Model& model);

// The checkpoints of a run directory, the one `latest` names first, then the rest
// newest first.
std::vector<std::string> checkpoint_candidates(const std::string& run_dir);

// Where a run starts from: the io.* settings that say so.
struct ResumeOptions {
  std::string resume = "auto";     // io.resume: 'auto' | 'never' | a checkpoint's path
  std::string run_dir;             // io.run_dir: where 'auto' looks
  std::string init_from;           // io.init_from: weights for a new run ("": none)
  bool allow_data_change = false;  // io.allow_data_change
};

// Collective. The checkpoint a run starts from, per io.resume ('auto': the newest
// valid one of run_dir, each unusable newer one skipped with a warning; 'never';
// a path: that file, an error when unusable), then io.init_from (weights only).
// Rank 0 reads and checks; every rank receives the same Checkpoint, but where
// `shares` is given (ZeRO: W + 1 bounds of the ranks' shares of the flat parameter
// buffer, comm/shares.hpp) rank r receives of each optimizer state only its share
// [shares[r], shares[r + 1]) (rank 0 keeps the whole). No rank holds a second copy
// of what it receives. With `values` false, ranks other than 0 receive the fields
// alone (path, state, names, sizes: what `ddp_train --check` says), no values.
// nullopt: a new run. `weights_only` tells which of the two it
// came from. A resume also compares the checkpoint's training data with `data` (this
// run's; null: not checked): another sample count is a collective error unless
// io.allow_data_change (then a warning), any other difference a warning.
std::optional<Checkpoint> find_start_checkpoint(MPI_Comm comm, const ResumeOptions& options,
                                                const Model& model, const std::string& optimizer,
                                                bool* weights_only, const DataFingerprint* data,
                                                const std::vector<std::int64_t>* shares = nullptr,
                                                bool values = true);

// How this run's training data differs from the one a checkpoint recorded, each a
// list of what changed ("e2e/train_001.h5 (40 samples) is gone; ..."), or "":
// `count` when the number of samples differs ("80 samples then, 40 now: ..."),
// else `other` (files renamed, reordered, rewritten, reshaped).
struct DataChange {
  std::string count;
  std::string other;
};
DataChange compare_data(const DataFingerprint& then, const DataFingerprint& now);

}  // namespace ddp
