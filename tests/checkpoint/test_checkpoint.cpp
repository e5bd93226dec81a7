// Checkpoint files and the resumed sample order, on one process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>

#include "comm/check.hpp"
#include "io/checkpoint.hpp"
#include "io/sampler.hpp"
#include "model/model.hpp"
#include "train/optimizer.hpp"

namespace {

using namespace ddp;

// Stopping after `consumed` positions of W ranks and resuming on W2 ranks trains
// every sample of the epoch once, plus W2's padding (drawn from the permutation's start).
TEST(EpochIndices, ResumeOnAnyWorldSizeUsesEverySampleOnce) {
  for (std::int64_t n : {10, 37, 60}) {
    for (int w = 1; w <= 4; ++w) {
      for (int w2 = 1; w2 <= 4; ++w2) {
        for (std::int64_t steps = 1; steps * w < n; ++steps) {
          const std::int64_t consumed = steps * w;  // one sample per rank per step
          std::map<std::int64_t, int> count;
          for (int r = 0; r < w; ++r) {
            const auto first = epoch_indices(n, w, r, true, 5, false, 2, 0);
            for (std::int64_t i = 0; i < steps; ++i) ++count[first[std::size_t(i)]];
          }
          std::size_t per_rank = 0;
          for (int r = 0; r < w2; ++r) {
            const auto rest = epoch_indices(n, w2, r, true, 5, false, 2, consumed);
            if (r == 0) per_rank = rest.size();
            EXPECT_EQ(rest.size(), per_rank) << "ranks must get equal counts";
            for (auto i : rest) ++count[i];
          }
          const std::int64_t pad = (w2 - (n - consumed) % w2) % w2;
          std::int64_t total = 0, twice = 0;
          for (auto& [i, c] : count) {
            total += c;
            twice += c == 2;
            EXPECT_LE(c, 2);
          }
          EXPECT_EQ(std::int64_t(count.size()), n) << "n " << n << " w " << w << " w2 " << w2;
          EXPECT_EQ(total, n + pad);
          EXPECT_EQ(twice, pad);
        }
      }
    }
  }
}

// Same world size: the resumed order is exactly the rest of the uninterrupted one.
TEST(EpochIndices, SameWorldSizeContinuesTheSamplerOrder) {
  for (bool drop_last : {false, true})
    for (int w = 1; w <= 4; ++w)
      for (int r = 0; r < w; ++r) {
        DistributedSampler s(37, w, r, true, 9, drop_last);
        s.set_epoch(3);
        const auto full = s.indices();
        for (std::size_t k = 1; k < full.size(); ++k) {
          const auto rest = epoch_indices(37, w, r, true, 9, drop_last, 3, std::int64_t(k) * w);
          EXPECT_EQ(rest, std::vector<std::int64_t>(full.begin() + std::ptrdiff_t(k), full.end()));
        }
      }
}

std::vector<float> host(View1 v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

TEST(Checkpoint, RoundTripAndChecksum) {
  char tmpl[] = "/tmp/ddp_ckpt_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  Model model({"flatten", "linear(5)", "relu", "linear(3)"}, {2, 2}, 7);
  Config cfg;
  cfg.train.optimizer = "adamw";
  auto opt = make_optimizer(cfg.train, std::size_t(model.num_parameters()));
  auto state = opt->state();
  Kokkos::deep_copy(state[0].second, 0.25f);
  opt->set_steps(12);
  TrainingState ts;
  ts.epoch = 1;
  ts.step = 12;
  ts.consumed = 40;
  ts.world_size = 3;
  ts.epoch_loss_sum = 1.5;
  std::string path;
  for (int s : {10, 11, 12}) {  // keep 2: the oldest goes
    ts.step = s;
    path = save_checkpoint(dir, 2, model, *opt, ts, cfg);
  }
  EXPECT_EQ(path, dir + "/checkpoints/ckpt_000000012.h5");
  const auto names = checkpoint_candidates(dir);
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0], path);

  Model other({"flatten", "linear(5)", "relu", "linear(3)"}, {2, 2}, 8);
  const Checkpoint ck = load_checkpoint(path, other, "AdamW");
  EXPECT_EQ(ck.parameters, host(model.parameters()));
  EXPECT_EQ(ck.state.consumed, 40);
  EXPECT_EQ(ck.state.world_size, 3);
  EXPECT_EQ(ck.state.epoch_loss_sum, 1.5);
  EXPECT_EQ(ck.optimizer_steps, 12);
  ASSERT_EQ(ck.optimizer_state.size(), 2u);
  EXPECT_EQ(ck.optimizer_state[0].first, "exp_avg");
  EXPECT_EQ(ck.optimizer_state[0].second, std::vector<float>(std::size_t(model.num_parameters()), 0.25f));

  // Another model or optimizer is the user's error, not a corrupt file.
  Model bigger({"flatten", "linear(6)", "relu", "linear(3)"}, {2, 2}, 7);
  EXPECT_THROW(load_checkpoint(path, bigger, "AdamW"), InputError);
  EXPECT_THROW(load_checkpoint(path, model, "SGD"), InputError);

  // A flipped byte in the last parameter value: the checksum catches it.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const float last = host(model.parameters()).back();
    std::string needle(reinterpret_cast<const char*>(&last), sizeof last);
    const auto at = bytes.find(needle);
    ASSERT_NE(at, std::string::npos);
    f.seekp(std::streamoff(at));
    f.put(char(bytes[at] ^ 0x01));
  }
  try {
    load_checkpoint(path, model, "AdamW");
    ADD_FAILURE() << "a corrupt checkpoint loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_checkpoint(dir + "/nothing.h5", model, ""), CheckpointError);
}

}  // namespace
