// train.cuda_graph without a GPU: what the plan makes of each setting and obstacle
// (plan_step_graphs), the model's obstacles (dropout, SyncBatchNorm), and
// StepGraphs' bookkeeping (first sight as it is, capture at the second, replays,
// every graph dropped when device memory moves) on a backend whose "graph" keeps the
// arguments the work had at capture, as a CUDA graph keeps its kernels'.
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/check.hpp"
#include "comm/communicator.hpp"
#include "model/backend.hpp"
#include "model/model.hpp"
#include "train/step_graph.hpp"

namespace {

using ddp::plan_step_graphs;
using ddp::StepGraphKey;

TEST(StepGraphPlan, OffSaysNothing) {
  const auto plan = plan_step_graphs("off", "the CPU build runs no CUDA graphs", "", false, false);
  EXPECT_FALSE(plan.on);
  EXPECT_EQ(plan.line, "");
}

TEST(StepGraphPlan, OnWhereItCannotBeIsOneError) {
  try {
    plan_step_graphs("on", "the CPU build runs no CUDA graphs", "", false, false);
    FAIL() << "no error";
  } catch (const ddp::InputError& e) {
    EXPECT_EQ(std::string(e.what()), "train.cuda_graph = 'on' cannot be: the CPU build runs no CUDA graphs");
  }
  EXPECT_THROW(plan_step_graphs("on", "", "model.layers(3) dropout(0.5): dropout ...", false, true),
               ddp::InputError);
  try {
    plan_step_graphs("on", "", "", /*trace=*/true, true);
    FAIL() << "no error";
  } catch (const ddp::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("io.trace waits for the GPU"), std::string::npos) << e.what();
  }
}

TEST(StepGraphPlan, AutoRunsUncapturedAndSaysWhy) {
  // The first reason found is the one given: the build, then the model, then io.trace.
  auto plan = plan_step_graphs("auto", "the CPU build runs no CUDA graphs", "model ...", true, true);
  EXPECT_FALSE(plan.on);
  EXPECT_EQ(plan.line, "CUDA graph: none (train.cuda_graph = 'auto'): the CPU build runs no CUDA graphs");
  plan = plan_step_graphs("auto", "", "model.layers(2) dropout(0.5): why", true, true);
  EXPECT_FALSE(plan.on);
  EXPECT_NE(plan.line.find("model.layers(2) dropout(0.5): why"), std::string::npos) << plan.line;
}

TEST(StepGraphPlan, TheAllReduceGoesInWhereTheCommunicatorCaptures) {
  auto plan = plan_step_graphs("auto", "", "", false, /*captures=*/true);
  EXPECT_TRUE(plan.on);
  EXPECT_TRUE(plan.collectives);
  EXPECT_NE(plan.line.find("with the gradient all-reduce (NCCL)"), std::string::npos) << plan.line;
  plan = plan_step_graphs("on", "", "", false, /*captures=*/false);
  EXPECT_TRUE(plan.on);
  EXPECT_FALSE(plan.collectives);
  EXPECT_NE(plan.line.find("all-reduce after it, outside"), std::string::npos) << plan.line;
}

TEST(StepGraphObstacle, DropoutAndSyncBatchNormAreNamed) {
  ddp::Model plain({"flatten", "linear(8)", "relu", "linear(3)"}, {1, 4, 4}, 0);
  EXPECT_EQ(plain.graph_obstacle(), "");
  ddp::Model dropout({"flatten", "linear(8)", "dropout(0.5)", "linear(3)"}, {1, 4, 4}, 0);
  EXPECT_EQ(dropout.graph_obstacle(),
            "model.layers(3) dropout(0.5): dropout draws its masks from a stream the host moves on at every "
            "step");
  ddp::Model sync({"conv2d(4, 3, pad=1)", "resblock(4)", "batchnorm2d(sync)", "flatten", "linear(3)"},
                  {1, 4, 4}, 0);
  EXPECT_EQ(sync.graph_obstacle(), "");  // no communicator: plain batch norm
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  sync.set_communicator(comm.get());
  EXPECT_EQ(
      sync.graph_obstacle(),
      "model.layers(3) batchnorm2d(sync): batchnorm2d(sync) reads the ranks' sample count on the host in "
      "every forward");
}

// Work whose "device" effect adds `arg` to `sum`: run as it is, it adds the current
// value; captured, the value at capture is kept, and each replay adds that.
struct Work {
  int host_runs = 0;
  double sum = 0;
  double arg = 0;
  bool capturing = false;
  double recorded = 0;
  int released = 0;  // graphs destroyed
  void operator()() {
    ++host_runs;
    if (capturing)
      recorded = arg;
    else
      sum += arg;
  }
};

class RecordingBackend final : public ddp::ComputeBackend {
 public:
  explicit RecordingBackend(Work& work) : work_(work) {}
  std::string name() const override { return "recording"; }
  std::string precision_text(ddp::Precision) const override { return ""; }
  bool device_memory() const override { return false; }
  void gemm(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int,
            ddp::Precision) override {}
  std::unique_ptr<ddp::ConvKernels> make_conv(const ddp::ConvGeometry&) override { return nullptr; }
  void synchronize() override {}
  std::string graphs_unsupported() const override { return {}; }
  std::unique_ptr<ddp::CapturedWork> capture(const std::function<void()>& record) override {
    work_.capturing = true;
    record();
    work_.capturing = false;
    struct Graph final : ddp::CapturedWork {
      Work* work;
      double arg;
      void replay() override { work->sum += arg; }
      ~Graph() override { ++work->released; }
    };
    auto g = std::make_unique<Graph>();
    g->work = &work_;
    g->arg = work_.recorded;
    return g;
  }

 private:
  Work& work_;
};

TEST(StepGraphs, FirstSightRunsSecondCapturesThenReplays) {
  Work work;
  RecordingBackend backend(work);
  ddp::watch_device_memory();  // releases are kept from here on
  ddp::StepGraphs graphs(&backend);
  const auto run = [&](const StepGraphKey& key, double arg) {
    work.arg = arg;
    return graphs.run(key, std::ref(work));
  };
  const StepGraphKey a{0, 64, true, true, 1.0f, false};
  StepGraphKey b = a;
  b.batch = 16;  // the epoch's last, smaller batch

  EXPECT_TRUE(run(a, 1.0));  // as it is
  EXPECT_EQ(work.host_runs, 1);
  EXPECT_EQ(work.sum, 1.0);
  EXPECT_TRUE(run(a, 2.0));  // captured (its host code runs once more), then replayed
  EXPECT_EQ(work.host_runs, 2);
  EXPECT_EQ(work.sum, 3.0);
  EXPECT_EQ(graphs.captures(), 1);
  EXPECT_FALSE(run(a, 5.0));  // replayed: the host code does not run, the captured argument is used
  EXPECT_EQ(work.host_runs, 2);
  EXPECT_EQ(work.sum, 5.0);

  EXPECT_TRUE(run(b, 10.0));  // another key: as it is
  EXPECT_EQ(work.sum, 15.0);
  EXPECT_FALSE(run(a, 0.0));  // a's graph is still there
  EXPECT_EQ(work.sum, 17.0);
  EXPECT_EQ(graphs.replays(), 3);

  ddp::device_block_freed("a workspace");  // a workspace grew: every graph may point at the old one
  EXPECT_EQ(ddp::device_memory_changes(), "a workspace freed");  // what a failed capture's line names
  EXPECT_TRUE(run(a, 100.0));                                    // as it is again
  EXPECT_EQ(ddp::device_memory_changes(), "");                   // taken with the releases
  EXPECT_EQ(work.sum, 117.0);
  EXPECT_TRUE(run(a, 1000.0));  // captured again
  EXPECT_EQ(graphs.captures(), 2);
  EXPECT_EQ(work.sum, 1117.0);
  EXPECT_FALSE(run(a, 0.0));
  EXPECT_EQ(work.sum, 2117.0);
}

// A graph released (a block it may hold was freed) waits for the device's queue: the
// trainer's wait on its collectives (under the watchdog) comes first, once, and only
// where a graph goes.
TEST(StepGraphs, TheTrainersWaitComesBeforeAGraphIsReleased) {
  Work work;
  RecordingBackend backend(work);
  ddp::watch_device_memory();
  ddp::take_device_frees();
  ddp::StepGraphs graphs(&backend);
  std::vector<int> released_at_wait;
  const auto run = [&](const StepGraphKey& key, double arg) {
    work.arg = arg;
    return graphs.run(key, std::ref(work), [&] { released_at_wait.push_back(work.released); });
  };
  const StepGraphKey a{0, 64, true, true, 1.0f, false};
  ddp::device_block_freed("a workspace");  // no graph yet: none to release, no wait
  EXPECT_TRUE(run(a, 1.0));
  EXPECT_TRUE(run(a, 1.0));  // captured
  EXPECT_FALSE(run(a, 1.0));
  EXPECT_TRUE(released_at_wait.empty());
  ddp::device_block_freed("a workspace");
  EXPECT_TRUE(run(a, 1.0));  // its graph released, after the wait
  EXPECT_EQ(released_at_wait, std::vector<int>{0});
  EXPECT_EQ(work.released, 1);
  EXPECT_TRUE(run(a, 1.0));  // captured again, no release
  EXPECT_EQ(released_at_wait.size(), 1u);
}

// Kokkos's CUDA team kernels without scratch memory (batch norm's) allocate 0 bytes
// of team scratch at every launch: no memory a graph could point into, so no
// obstacle to a capture. A block with bytes is one, and is named.
TEST(StepGraphs, EmptyDeviceBlocksDoNotStopACapture) {
  Work work;
  RecordingBackend backend(work);
  ddp::watch_device_memory();
  ddp::take_device_frees();
  ddp::StepGraphs graphs(&backend);
  const Kokkos::Profiling::SpaceHandle device = Kokkos::Profiling::make_space_handle("Cuda");
  const char* label = "Kokkos::CudaSpace::TeamScratchMemory";
  int block = 0;
  const auto team_kernel = [&] {
    Kokkos::Profiling::allocateData(device, label, &block, 0);
    work();
  };
  const StepGraphKey a{0, 32, true, true, 1.0f, false};
  EXPECT_TRUE(graphs.run(a, team_kernel));   // as it is
  EXPECT_TRUE(graphs.run(a, team_kernel));   // captured, although it "allocated"
  EXPECT_FALSE(graphs.run(a, team_kernel));  // replayed
  EXPECT_EQ(graphs.captures(), 1);
  EXPECT_EQ(ddp::device_memory_changes(), "");

  const std::uint64_t before = ddp::device_allocations();
  Kokkos::Profiling::allocateData(device, label, &block, 64);
  EXPECT_EQ(ddp::device_allocations(), before + 1);  // what fails a capture
  EXPECT_EQ(ddp::device_memory_changes(), std::string("'") + label + "' allocated");
  Kokkos::Profiling::deallocateData(device, label, &block, 64);
  EXPECT_EQ(ddp::take_device_frees(), std::vector<std::uint64_t>{before + 1});
  Kokkos::Profiling::deallocateData(device, label, &block, 0);  // an empty block's release: nothing
  EXPECT_TRUE(ddp::take_device_frees().empty());
}

TEST(StepGraphs, KeysDifferInEveryField) {
  const StepGraphKey k{1, 64, false, true, 1024.0f, false};
  for (int field = 0; field < 6; ++field) {
    StepGraphKey o = k;
    switch (field) {
      case 0:
        o.slot = 0;
        break;
      case 1:
        o.batch = 63;
        break;
      case 2:
        o.writes_gradients = true;
        break;
      case 3:
        o.last_micro = false;
        break;
      case 4:
        o.loss_scale = 512.0f;
        break;
      case 5:
        o.poisoned = true;
        break;
    }
    EXPECT_FALSE(o == k) << "field " << field;
  }
  EXPECT_TRUE(StepGraphKey(k) == k);
}

}  // namespace
