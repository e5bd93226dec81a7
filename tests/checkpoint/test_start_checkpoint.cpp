// The checkpoint a run starts from, on real ranks (find_start_checkpoint): rank 0
// reads it and every rank receives it, under ZeRO each rank only its share of the
// optimizer state, and no rank holds what it receives twice; and rank 0 writing one
// holds the file's bytes once.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "comm/host_memory.hpp"
#include "comm/shares.hpp"
#include "io/checkpoint.hpp"
#include "model/model.hpp"
#include "train/checkpointing.hpp"
#include "train/optimizer.hpp"

namespace {

using namespace ddp;

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

std::vector<float> to_host(View1 v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

// Value i of optimizer state k: distinct along the buffer, so that a share taken
// from the wrong place shows.
float state_value(int k, std::int64_t i) { return float(i % 100003) * 0.5f + float(k) * 1e6f; }

// Resets this process's peak resident set (VmHWM) to its resident set; false, with
// the reason in `why`, under AddressSanitizer (its quarantine keeps freed blocks
// mapped) or where Linux refuses the reset.
bool reset_peak(const char** why) {
#if defined(__SANITIZE_ADDRESS__)
  *why = "AddressSanitizer keeps freed blocks mapped";
  return false;
#else
  std::ofstream f("/proc/self/clear_refs");
  f << "5";  // VmHWM back to VmRSS
  f.close();
  if (!f) *why = "/proc/self/clear_refs could not be written";
  return bool(f);
#endif
}

// The model whose checkpoint is read and written: 16.8 M parameters (67 MB), large
// enough that the memory a rank grows by shows what it holds. Under AddressSanitizer,
// where that is not measured (reset_peak), a quarter of it: 4.2 M parameters, still
// four pieces of a read (ckpt::kReadPieceBytes) each, at a quarter of the time (36 s
// of CPU under ASan on 3 ranks of a 2-core EPYC with the whole).
#if defined(__SANITIZE_ADDRESS__)
const char* const kLinear = "linear(1024)";
#else
const char* const kLinear = "linear(4096)";
#endif

// That model with AdamW state (two buffers of its size, distinct values) saved by
// rank 0 into a fresh run directory, its name on every rank.
struct Saved {
  std::string run_dir;
  Model model{{"flatten", kLinear}, {1, 64, 64}, 5};
  std::vector<std::string> state_names;

  Saved() {
    Config cfg;
    cfg.train.optimizer = "adamw";
    auto opt = make_optimizer(cfg.train, std::size_t(model.num_parameters()));
    char dir[64] = "";
    if (rank_of() == 0) {
      char tmpl[] = "/tmp/ddp_start_ckpt_XXXXXX";
      std::snprintf(dir, sizeof dir, "%s", mkdtemp(tmpl));
      int k = 0;
      for (auto& [name, view] : opt->state()) {
        auto h = Kokkos::create_mirror_view(view);
        for (std::size_t i = 0; i < h.extent(0); ++i) h(i) = state_value(k, std::int64_t(i));
        Kokkos::deep_copy(view, h);
        ++k;
      }
      opt->set_steps(7);
      TrainingState ts;
      ts.step = 7;
      ts.world_size = world_size();
      save_checkpoint(dir, 1, model, *opt, ts, cfg, nullptr);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    run_dir = dir;
    for (auto& [name, view] : opt->state()) state_names.push_back(name);
  }
  ~Saved() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_of() == 0) std::system(("rm -rf " + run_dir).c_str());
  }
  std::optional<Checkpoint> start(const std::vector<std::int64_t>* shares, bool values = true) {
    ResumeOptions o;
    o.run_dir = run_dir;
    bool weights_only = true;
    auto ck =
        find_start_checkpoint(MPI_COMM_WORLD, o, model, "AdamW", &weights_only, nullptr, shares, values);
    EXPECT_FALSE(weights_only);
    return ck;
  }
};

// Every value of each optimizer state that `ck` holds, from its offset.
void expect_state(const Checkpoint& ck, const std::vector<std::string>& names, std::int64_t offset,
                  std::int64_t size) {
  ASSERT_EQ(ck.optimizer_state.size(), names.size());
  EXPECT_EQ(ck.optimizer_offset, offset);
  for (std::size_t k = 0; k < names.size(); ++k) {
    const auto& [name, v] = ck.optimizer_state[k];
    EXPECT_EQ(name, names[k]);
    ASSERT_EQ(std::int64_t(v.size()), size) << name << " on rank " << rank_of();
    std::int64_t bad = 0, first = -1;
    for (std::int64_t i = 0; i < size; ++i)
      if (v[std::size_t(i)] != state_value(int(k), offset + i) && !bad++) first = i;
    EXPECT_EQ(bad, 0) << bad << " values of " << name << " wrong on rank " << rank_of() << ", the first "
                      << first << ": " << (bad ? v[std::size_t(first)] : 0.0f) << ", the file's "
                      << state_value(int(k), offset + first);
  }
}

TEST(StartCheckpoint, EachRankReceivesTheWholeWithoutShares) {
  Saved saved;
  const auto ck = saved.start(nullptr);
  ASSERT_TRUE(ck.has_value());
  EXPECT_EQ(ck->optimizer_steps, 7);
  EXPECT_EQ(ck->state.step, 7);
  EXPECT_EQ(ck->parameters, to_host(saved.model.parameters()));
  expect_state(*ck, saved.state_names, 0, saved.model.num_parameters());
}

// ddp_train --check: the ranks other than 0 receive the fields alone (what rank 0
// says of the checkpoint), no parameters and no optimizer state.
TEST(StartCheckpoint, WithoutValuesTheOtherRanksReceiveTheFieldsAlone) {
  Saved saved;
  const auto ck = saved.start(nullptr, false);
  ASSERT_TRUE(ck.has_value());
  EXPECT_EQ(ck->state.step, 7);
  EXPECT_EQ(ck->optimizer, "AdamW");
  EXPECT_NE(ck->path.find(saved.run_dir), std::string::npos) << ck->path;
  ASSERT_EQ(ck->optimizer_state.size(), saved.state_names.size());
  if (rank_of() == 0) {
    EXPECT_EQ(ck->parameters, to_host(saved.model.parameters()));
    expect_state(*ck, saved.state_names, 0, saved.model.num_parameters());
    return;
  }
  EXPECT_TRUE(ck->parameters.empty()) << ck->parameters.size() << " parameters on rank " << rank_of();
  for (std::size_t k = 0; k < saved.state_names.size(); ++k) {
    const auto& [name, v] = ck->optimizer_state[k];
    EXPECT_EQ(name, saved.state_names[k]);
    EXPECT_TRUE(v.empty()) << v.size() << " values of " << name << " on rank " << rank_of();
  }
}

// Under ZeRO each rank receives its share of the optimizer state alone (rank 0, which
// read the file, keeps the whole), and a rank's memory grows by what it receives:
// not by the whole state, and not by a second copy (the packed buffer the broadcast
// once sent everything in).
TEST(StartCheckpoint, UnderZeroEachRankReceivesItsShareOnly) {
  Saved saved;
  const int rank = rank_of();
  const std::int64_t n = saved.model.num_parameters();
  const Shares shares = Shares::split(n, world_size());
  const HostMemory before = host_memory();
  const char* why = "this process's resident set could not be read";
  const bool measured = reset_peak(&why) && before.resident > 0;
  const auto ck = saved.start(&shares.bounds);
  const HostMemory after = host_memory();
  ASSERT_TRUE(ck.has_value());
  EXPECT_EQ(ck->parameters, to_host(saved.model.parameters()));
  if (rank == 0)
    expect_state(*ck, saved.state_names, 0, n);
  else
    expect_state(*ck, saved.state_names, shares.begin(rank), shares.size(rank));

  if (rank == 0) return;  // rank 0 reads the whole file
  if (!measured) {
    std::printf("rank %d: the memory received was not measured: %s\n", rank, why);
    return;
  }
  const std::int64_t whole_state = std::int64_t(saved.state_names.size()) * n * 4;
  const std::int64_t received =
      (n + std::int64_t(ck->buffers.size()) + std::int64_t(saved.state_names.size()) * shares.size(rank)) * 4;
  const std::int64_t grew = after.peak - before.resident;
  EXPECT_LT(grew, received + whole_state / 4)
      << "rank " << rank << "'s peak grew by " << grew << " B receiving " << received
      << " B (the whole state is " << whole_state
      << " B): more than its share of the state, or what it received held twice";
  EXPECT_GT(grew, received / 2) << "the measure saw the values received";
}

// Rank 0 makes the file in memory and writes it from there: its peak grows by the
// file, the largest tensor while HDF5 copies it in and one step of HDF5's buffer
// (1.44 times this file), not by a second copy of the file: H5Fget_file_image's
// copy, or the buffer made resident whole while every tensor was still held (2.03
// times, each).
TEST(SaveCheckpoint, HoldsTheFileOnceWhileWritingIt) {
  if (rank_of() != 0) return;
  Model model{{"flatten", kLinear}, {1, 64, 64}, 5};
  Config cfg;
  cfg.train.optimizer = "adamw";
  auto opt = make_optimizer(cfg.train, std::size_t(model.num_parameters()));
  char tmpl[] = "/tmp/ddp_save_ckpt_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  TrainingState ts;
  ts.step = 1;
  ts.world_size = 1;
  const HostMemory before = host_memory();
  const char* why = "this process's resident set could not be read";
  const bool measured = reset_peak(&why) && before.resident > 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string path = save_checkpoint(dir, 1, model, *opt, ts, cfg, nullptr);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const HostMemory after = host_memory();
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  const std::int64_t file = std::int64_t(in.tellg());
  std::system(("rm -rf " + dir).c_str());
  ASSERT_GT(file, 3 * model.num_parameters() * 4) << path << ": the parameters and AdamW's two states";
  if (!measured) {
    std::printf("the memory of writing was not measured: %s\n", why);
    return;
  }
  const std::int64_t grew = after.peak - before.resident;
  std::printf("writing a checkpoint of %lld B: the peak grew by %lld B, %.3f s\n", (long long)file,
              (long long)grew, seconds);
  EXPECT_LT(grew, file * 7 / 4) << "the peak grew by " << grew << " B writing a file of " << file
                                << " B: the file held twice";
  EXPECT_GT(grew, file / 2) << "the measure saw the file";
}

}  // namespace
