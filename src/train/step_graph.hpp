#pragma once
// train.cuda_graph: a step's device work (forward, loss, backward, and the gradient
// all-reduce where the communicator's collectives can be captured) recorded once as
// a CUDA graph per kind of step and replayed after, one launch in place of hundreds.
//
// A replay runs the captured kernels with the arguments and pointers they had at
// capture. So every host value the step's kernels take is in the key (the input
// slot, the batch size, whether backward writes or adds the gradients, whether the
// micro-batch ends the step, fp16's loss scale, the NaN test hook), what moves on
// every step is an obstacle found at start-up (dropout's stream, SyncBatchNorm's host
// read), and a graph is dropped (its key starts over) once a block of device memory
// that existed when it was captured is freed (take_device_frees(): a workspace that
// grew). A key runs uncaptured when first seen (kernels plan their algorithms and
// workspaces then), is captured when seen again and replayed from then on.
// While a benchmark counts launches (DDP_LAUNCH_COUNT: Kokkos fences at every kernel,
// or events are recorded around each) nothing is captured.
//
// What stays outside the graph is host work: the non-finite check and the flags'
// all-reduce that every rank's decision to step, skip or stop rests on, the optimizer
// step with this step's learning rate (one kernel), the batch's copy in.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/backend.hpp"

namespace ddp {

struct StepGraphKey {
  int slot = 0;            // the input stage's slot: the batch's buffers
  std::int64_t batch = 0;  // samples in the micro-batch
  bool writes_gradients = false;
  bool last_micro = false;  // the micro-batch that ends the step (its buckets start in backward)
  float loss_scale = 1.0f;  // fp16
  bool poisoned = false;    // test hook DDP_INJECT_FAULT=nan_gradient fired
  bool operator==(const StepGraphKey& o) const {
    return slot == o.slot && batch == o.batch && writes_gradients == o.writes_gradients &&
           last_micro == o.last_micro && loss_scale == o.loss_scale && poisoned == o.poisoned;
  }
};

// What train.cuda_graph makes of this run, the same on every rank.
struct StepGraphPlan {
  bool on = false;           // capture and replay
  bool collectives = false;  // on, and the gradient all-reduce (or the buckets' wait) inside the graph
  std::string line;          // rank 0's start-up line; empty for 'off'
};

// `setting`: train.cuda_graph; `unsupported`: the backend's graphs_unsupported();
// `obstacle`: the model's graph_obstacle(); `trace`: io.trace; `captures`: the
// communicator's captures_collectives(). 'on' where it cannot be
// throws InputError naming why; 'auto' then runs uncaptured and says why.
StepGraphPlan plan_step_graphs(const std::string& setting, const std::string& unsupported,
                               const std::string& obstacle, bool trace, bool captures);

class StepGraphs {
 public:
  // Captures with `backend` (null: compute_backend(), the process's own).
  explicit StepGraphs(ComputeBackend* backend = nullptr) : backend_(backend) {}
  // Runs `work` for `key`: as it is, or captured then replayed, or replayed. Returns
  // whether its host code ran (false: a replay, which leaves host state as it was).
  // before_drop, where given, runs before a graph is released (which waits for the
  // device's queue): the trainer's wait on the collectives still queued, under its
  // watchdog, so that a peer gone dead is named there, not waited for without end.
  bool run(const StepGraphKey& key, const std::function<void()>& work,
           const std::function<void()>& before_drop = {});
  std::int64_t captures() const { return captures_; }
  std::int64_t replays() const { return replays_; }  // the capture's own launch included

 private:
  struct Entry {
    StepGraphKey key;
    std::uint64_t allocations = 0;  // device_allocations() at capture: older blocks may be in the graph
    std::unique_ptr<CapturedWork> graph;
  };
  ComputeBackend* backend_;
  std::vector<Entry> entries_;
  std::int64_t captures_ = 0, replays_ = 0;
};

}  // namespace ddp
