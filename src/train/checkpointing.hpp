#pragma once
// What a checkpoint holds of the run's config and optimizer, assembled from them
// for the checkpoint layer (io/checkpoint.hpp), which knows nothing of src/train.

#include <mpi.h>

#include <optional>
#include <string>

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

// find_start_checkpoint of io/checkpoint.hpp, per cfg.io (resume, run_dir, init_from,
// allow_data_change). Collective. `shares`, `values`: see there.
std::optional<Checkpoint> find_start_checkpoint(MPI_Comm comm, const Config& cfg, const Model& model,
                                                const std::string& optimizer, bool* weights_only,
                                                const DataFingerprint* data,
                                                const std::vector<std::int64_t>* shares = nullptr,
                                                bool values = true);

}  // namespace ddp
