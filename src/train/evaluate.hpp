#pragma once
// ddp_train --evaluate: the validation loss and accuracy of a checkpoint's weights,
// measured as a run's validation measures them (the same chunks, the same sums, the
// same arithmetic: train.precision), on any number of ranks, without training.

#include "comm/context.hpp"
#include "train/config.hpp"

namespace ddp {

// The checkpoint a run would start from (io.resume: run_dir's newest usable one, or
// the path it names; else io.init_from), its weights alone, evaluated on
// data.val_files. Rank 0 prints one line for a reader and one `evaluation: {...}`
// JSON line (metrics.jsonl's fields, full precision). Nothing is written to
// io.run_dir, and a run training there may go on. Collective; returns the exit status
// (0). No validation set, or no checkpoint, is one line and exit status 1.
int evaluate_run(const Context& ctx, const Config& cfg);

}  // namespace ddp
