#include "train/step_graph.hpp"

#include <algorithm>

#include "comm/check.hpp"
#include "model/kernel_trace.hpp"

namespace ddp {

StepGraphPlan plan_step_graphs(const std::string& setting, const std::string& unsupported,
                               const std::string& obstacle, bool trace, bool captures) {
  StepGraphPlan plan;
  if (setting == "off") return plan;
  std::string why = unsupported;
  if (why.empty()) why = obstacle;
  if (why.empty() && trace) why = "io.trace waits for the GPU at every span of the step";
  if (!why.empty()) {
    if (setting == "on") throw InputError("train.cuda_graph = 'on' cannot be: " + why);
    plan.line = "CUDA graph: none (train.cuda_graph = 'auto'): " + why;
    return plan;
  }
  plan.on = true;
  plan.collectives = captures;
  plan.line = std::string("CUDA graph: forward, loss and backward") +
              (captures ? " with the gradient all-reduce (NCCL)"
                        : "; the gradient all-reduce after it, outside (MPI waits on the host)") +
              ", captured per batch shape at its second step and replayed; the step checks and the "
              "optimizer outside";
  return plan;
}

bool StepGraphs::run(const StepGraphKey& key, const std::function<void()>& work,
                     const std::function<void()>& before_drop) {
  // A freed block that was there when a graph was captured may be in it: that graph
  // goes, and its key starts over. Blocks allocated (and freed) since leave it be.
  const std::vector<std::uint64_t> freed = take_device_frees();
  if (!freed.empty()) {
    const std::uint64_t oldest = *std::min_element(freed.begin(), freed.end());
    const auto stale = [&](const Entry& x) { return x.graph && x.allocations >= oldest; };
    if (before_drop && std::any_of(entries_.begin(), entries_.end(), stale)) before_drop();
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), stale), entries_.end());
  }
  const auto e = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& x) { return x.key == key; });
  // As it is at first sight, and while a count makes Kokkos fence at every kernel.
  if (e == entries_.end() || (!e->graph && kernel_trace::counting())) {
    if (e == entries_.end()) entries_.push_back({key, 0, nullptr});
    work();
    return true;
  }
  const bool capture = !e->graph;
  if (capture) {  // its host code runs once more, recording
    const std::uint64_t before = device_allocations();
    e->graph = (backend_ ? *backend_ : compute_backend()).capture(work);
    const std::string changes = device_memory_changes();
    DDP_REQUIRE(e->graph && device_allocations() == before && take_device_frees().empty(),
                "train.cuda_graph: device memory was allocated or freed while the step was captured ("
                    << changes << "); train.cuda_graph = 'off' runs without a graph");
    e->allocations = before;
    ++captures_;
  }
  e->graph->replay();
  ++replays_;
  return capture;
}

}  // namespace ddp
