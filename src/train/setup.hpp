#pragma once
// Start-up of a run, between the command line (command_line.hpp) and the trainer: the
// input file (read once by rank 0, shared with every rank), the data sets and the
// model, each checked against the others. Errors here are the user's: they are
// reported once, in one line, and every rank exits non-zero.

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/context.hpp"
#include "io/run_dir_lock.hpp"
#include "io/shard_dataset.hpp"
#include "model/loss.hpp"
#include "model/model.hpp"
#include "train/command_line.hpp"
#include "train/config.hpp"
#include "train/trainer.hpp"

namespace ddp {

// Rank 0 reads the file; all ranks parse the same text, so all hold the same Config.
Config load_config(const Context& ctx, const CommandLine& cli);

struct Data {
  std::unique_ptr<ShardDataset> train;
  std::unique_ptr<ShardDataset> val;  // null when data.val_files is empty
  int prefetch_batches = 0;  // 0 when preloaded (batches under 1 MiB) or when MPI gives no thread support
  Shape input_shape;         // one sample as the model sees it (after data.image_size's crop)
};

// Opens the shard sets, preloads or streams them (data.mode) and checks the
// per-rank share against the batch size. Not `training` (--evaluate): the training
// set is opened for its shapes and labels alone, and the validation set is read.
Data open_data(const Context& ctx, const Config& cfg, bool training = true);

// The model for this data: input shape from the shards, loss from the labels
// (model.loss = 'auto') and checked against the output shape and the label range.
struct ModelSetup {
  std::unique_ptr<Model> model;
  LossKind loss;
};
ModelSetup build_model(const Context& ctx, const Config& cfg, Data& data);

// The communicator of comm.backend (comm/compute_communicator.hpp): MPI on host
// buffers in the CPU build, where 'nccl' is a clear error; NCCL or MPI on device
// buffers in the CUDA build.
std::unique_ptr<Communicator> make_communicator(const Context& ctx, const Config& cfg);

// Creates <run_dir> and locks it for this run (rank 0; a run that holds it already is
// an error, io/run_dir_lock.hpp), and prints the resolved configuration and the plan.
// The run keeps the lock while it holds what this returns.
[[nodiscard]] RunDirLock prepare_run_dir(const Context& ctx, const Config& cfg);

// "ddp_train 0.1.0 --check: 2 ranks, input x.nml", then the resolved input: what a
// run, --check and --evaluate print first (`option`: "" for a run).
std::string input_banner(const Context& ctx, const Config& cfg, const std::string& option);

// Resume (io.resume) or initialise (io.init_from) the trainer from a checkpoint,
// when there is one: rank 0 reads and checks it (a resume against the training
// data's fingerprint too), every rank gets it.
void start_from_checkpoint(const Context& ctx, const Config& cfg, const Model& model, const Data& data,
                           Trainer& trainer);

// ddp_train --check: the input, every data file, the model built on the data, and
// the checkpoint a run would start from; prints a summary and "check passed".
// Returns the exit status (0); any problem is the usual one-line collective error.
int check_run(const Context& ctx, const Config& cfg);

}  // namespace ddp
