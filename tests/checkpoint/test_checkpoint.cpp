// Checkpoint files and the resumed sample order, on one process.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include "../temp_dir.hpp"
#include "comm/check.hpp"
#include "io/checkpoint.hpp"
#include "io/sampler.hpp"
#include "model/model.hpp"
#include "train/checkpointing.hpp"
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
  const ddp::test::TempDir tmp("/tmp/ddp_ckpt_");
  const std::string& dir = tmp.path();
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
    path = save_checkpoint(dir, 2, model, *opt, ts, cfg, nullptr);
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

// Datasets larger than a piece of a read (ckpt::kReadPieceBytes: rank 0 reads them in
// blocks of rows, each one progress for the waiting ranks) and larger than a run of
// the writeback: a (1100, 1600) weight of 7 MB read in 655 rows and then 445, the
// flat optimizer state in 1 Mi values and then the rest. Every value comes back to
// its place, bit for bit.
TEST(Checkpoint, DatasetsLargerThanAReadPieceRoundTrip) {
  const ddp::test::TempDir tmp("/tmp/ddp_ckpt_");
  const std::string& dir = tmp.path();
  Model model({"flatten", "linear(1100)"}, {40, 40}, 7);
  ASSERT_GT(std::size_t(1100 * 1600 * 4), 4 * (std::size_t(1) << 20));
  Config cfg;
  cfg.train.optimizer = "adamw";
  auto opt = make_optimizer(cfg.train, std::size_t(model.num_parameters()));
  std::vector<std::vector<float>> written;
  for (auto& [name, view] : opt->state()) {  // a value of its own at each place
    auto h = Kokkos::create_mirror_view(view);
    for (std::size_t i = 0; i < h.extent(0); ++i) h(i) = float(i) + (written.empty() ? 0.5f : 0.25f);
    Kokkos::deep_copy(view, h);
    written.push_back(host(view));
  }
  TrainingState ts;
  ts.step = 3;
  const std::string path = save_checkpoint(dir, 1, model, *opt, ts, cfg, nullptr);

  Model other({"flatten", "linear(1100)"}, {40, 40}, 8);
  const Checkpoint ck = load_checkpoint(path, other, "AdamW");
  EXPECT_EQ(ck.parameters, host(model.parameters()));
  ASSERT_EQ(ck.optimizer_state.size(), written.size());
  for (std::size_t i = 0; i < written.size(); ++i) EXPECT_EQ(ck.optimizer_state[i].second, written[i]);
  std::remove(path.c_str());
}

// io.checkpoint_async's writer: a write on its thread ends, is finished with its path
// and size, and leaves a checkpoint that loads; one whose directory went away ends
// failed, with save_checkpoint's error text, and leaves no file.
TEST(Checkpoint, BackgroundWriteEndsOrFailsWithItsLine) {
  const ddp::test::TempDir tmp("/tmp/ddp_ckpt_");
  const std::string& dir = tmp.path();
  Model model({"flatten", "linear(5)", "relu", "linear(3)"}, {2, 2}, 7);
  Config cfg;
  auto opt = make_optimizer(cfg.train, std::size_t(model.num_parameters()));
  TrainingState ts;
  ts.step = 4;
  BackgroundCheckpoint writer;
  EXPECT_FALSE(writer.busy());
  EXPECT_EQ(writer.state(), BackgroundCheckpoint::none_ended);
  writer.start(
      std::make_unique<PendingCheckpoint>(dir, 2, model, snapshot_of(*opt), ts, run_input(cfg), nullptr));
  EXPECT_TRUE(writer.busy());
  for (int i = 0; i < 5000 && writer.state() == BackgroundCheckpoint::none_ended; ++i) usleep(1000);
  EXPECT_EQ(writer.state(), BackgroundCheckpoint::ended);
  const auto done = writer.finish();
  EXPECT_FALSE(writer.busy());
  EXPECT_EQ(done.error, "");
  EXPECT_EQ(done.path, dir + "/checkpoints/ckpt_000000004.h5");
  EXPECT_GT(done.bytes, 0u);
  EXPECT_EQ(load_checkpoint(done.path, model, "SGD").parameters, host(model.parameters()));

  ts.step = 8;
  auto pending =
      std::make_unique<PendingCheckpoint>(dir, 2, model, snapshot_of(*opt), ts, run_input(cfg), nullptr);
  const std::string path = pending->path();
  ASSERT_EQ(std::system(("rm -rf " + dir + "/checkpoints").c_str()), 0);
  writer.start(std::move(pending));
  for (int i = 0; i < 5000 && writer.state() == BackgroundCheckpoint::none_ended; ++i) usleep(1000);
  EXPECT_EQ(writer.state(), BackgroundCheckpoint::failed);
  const auto failed = writer.finish();
  EXPECT_EQ(failed.error.rfind("cannot write checkpoint " + path + ": No such file or directory", 0), 0u)
      << failed.error;
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

// A fresh run directory and a small model with its optimizer, to save and load.
struct SmallRun {
  ddp::test::TempDir tmp{"/tmp/ddp_ckpt_"};
  std::string dir = tmp.path();
  Model model{{"flatten", "linear(5)", "relu", "linear(3)"}, {2, 2}, 7};
  Config cfg;
  std::unique_ptr<Optimizer> opt;
  explicit SmallRun(double momentum = 0.0) {
    cfg.train.momentum = momentum;
    opt = make_optimizer(cfg.train, std::size_t(model.num_parameters()));
  }
  std::string save(std::int64_t step, const DataFingerprint* data = nullptr) {
    TrainingState ts;
    ts.step = step;
    return save_checkpoint(dir, 5, model, *opt, ts, cfg, data);
  }
};

// The file on disk is written from HDF5's memory (the core driver's buffer) with the
// superblock's flags as a closed file has them: byte for byte the image HDF5 gives of
// the file it reads back (H5Fget_file_image, which clears those flags in its copy).
TEST(Checkpoint, FileOnDiskIsHdf5sImageOfIt) {
  SmallRun run(0.9);
  const std::string path = run.save(3);
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> on_disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_core(fapl, 1 << 20, /*backing_store=*/0);
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  H5Pclose(fapl);
  ASSERT_GE(file, 0) << path << " does not open";
  std::vector<char> image(std::size_t(H5Fget_file_image(file, nullptr, 0)));
  H5Fget_file_image(file, image.data(), image.size());
  H5Fclose(file);
  ASSERT_EQ(on_disk.size(), image.size());
  std::size_t differ = 0, first = 0;
  for (std::size_t i = 0; i < image.size(); ++i)
    if (on_disk[i] != image[i] && !differ++) first = i;
  EXPECT_EQ(differ, 0u) << differ << " bytes differ, the first at " << first;
}

// NaN or Inf in the weights makes a checkpoint unusable; in the optimizer state too,
// unless only the weights are wanted (init_from).
TEST(Checkpoint, NonFiniteValuesAreUnusable) {
  SmallRun run(0.9);
  auto poison = [](View1 v, std::size_t at, float value) {
    auto h = Kokkos::create_mirror_view(v);
    Kokkos::deep_copy(h, v);
    h(at) = value;
    Kokkos::deep_copy(v, h);
  };
  auto reason = [&](const std::string& path, const std::string& optimizer) -> std::string {
    try {
      load_checkpoint(path, run.model, optimizer);
      return "";
    } catch (const CheckpointError& e) {
      return e.what();
    }
  };

  poison(run.opt->state()[0].second, 3, std::numeric_limits<float>::infinity());
  const std::string bad_state = run.save(1);
  EXPECT_EQ(reason(bad_state, "SGD"), "/optimizer/momentum_buffer has 1 non-finite value");
  EXPECT_EQ(reason(bad_state, ""), "") << "the weights alone are finite";

  const Model::ParamEntry& last = run.model.parameter_table().back();  // layers.3.bias
  for (std::int64_t i = 0; i < 2; ++i)
    poison(run.model.parameters(), std::size_t(last.offset + i), std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(reason(run.save(2), ""), "/model/" + last.name + " has 2 non-finite values");
}

DataFingerprint fingerprint(std::vector<std::string> files, std::vector<std::int64_t> counts,
                            std::vector<std::uint64_t> hashes) {
  return {std::move(files), std::move(counts), std::move(hashes), {1, 28, 28}, {}};
}

TEST(Checkpoint, CompareData) {
  const DataFingerprint then = fingerprint({"d/a.h5", "d/b.h5"}, {30, 20}, {1, 2});
  DataChange c = compare_data(then, then);
  EXPECT_EQ(c.count, "");
  EXPECT_EQ(c.other, "");

  c = compare_data(then, fingerprint({"d/a.h5"}, {30}, {1}));
  EXPECT_EQ(c.count, "50 samples then, 30 now: d/b.h5 (20 samples) is gone");
  c = compare_data(then, fingerprint({"d/a.h5", "d/b.h5", "d/c.h5"}, {30, 21, 5}, {1, 2, 3}));
  EXPECT_EQ(c.count, "50 samples then, 56 now: d/c.h5 (5 samples) is new; d/b.h5 has 21 samples, had 20");

  // The same count: warnings only.
  c = compare_data(then, fingerprint({"d/a.h5", "d/b.h5"}, {30, 20}, {1, 9}));
  EXPECT_EQ(c.count, "");
  EXPECT_EQ(c.other, "d/b.h5 has other contents in its sampled rows");
  c = compare_data(then, fingerprint({"d/b.h5", "d/a.h5"}, {20, 30}, {2, 1}));
  EXPECT_EQ(c.other, "the files are in another order");
  c = compare_data(then, fingerprint({"e/a.h5", "e/b.h5"}, {30, 20}, {1, 2}));
  EXPECT_EQ(c.other,
            "d/a.h5 (30 samples) is gone; d/b.h5 (20 samples) is gone; e/a.h5 (30 samples) is new; "
            "e/b.h5 (20 samples) is new");

  // One line however many shards changed.
  DataFingerprint many, fewer;
  for (int i = 0; i < 100; ++i) {
    many.files.push_back("s" + std::to_string(i));
    many.counts.push_back(1);
    many.hashes.push_back(0);
  }
  c = compare_data(many, fewer);
  EXPECT_EQ(c.count.rfind("100 samples then, 0 now: s0 (1 sample) is gone; s1 (1 sample) is gone; ", 0), 0u);
  EXPECT_NE(c.count.find("; and 96 more changes"), std::string::npos) << c.count;
}

// The record of the training data goes into the file and comes back.
TEST(Checkpoint, DataFingerprintRoundTrip) {
  SmallRun run;
  const DataFingerprint data = fingerprint({"x/train_0.h5", "x/train_1.h5"}, {7, 9}, {~0ull, 42});
  const Checkpoint ck = load_checkpoint(run.save(0, &data), run.model, "SGD");
  ASSERT_TRUE(ck.data.has_value());
  EXPECT_EQ(ck.data->files, data.files);
  EXPECT_EQ(ck.data->counts, data.counts);
  EXPECT_EQ(ck.data->hashes, data.hashes);
  EXPECT_EQ(ck.data->x_shape, data.x_shape);
  EXPECT_EQ(ck.data->y_shape, data.y_shape);
  EXPECT_FALSE(load_checkpoint(run.save(1), run.model, "SGD").data);
}

// Temp files our writers left (killed, or refused by a full disk) go before a write;
// other files stay.
TEST(Checkpoint, StaleTempFilesGoFirst) {
  SmallRun run;
  run.save(0);
  const std::string ckdir = checkpoint_dir(run.dir);
  for (const char* n : {"ckpt_000000007.h5.tmp.12345", "latest.tmp.12345", "notes.tmp.txt"})
    std::ofstream(ckdir + "/" + n) << "x";
  run.save(1);
  auto exists = [&](const char* n) { return access((ckdir + "/" + n).c_str(), F_OK) == 0; };
  EXPECT_FALSE(exists("ckpt_000000007.h5.tmp.12345"));
  EXPECT_FALSE(exists("latest.tmp.12345"));
  EXPECT_TRUE(exists("notes.tmp.txt"));
}

}  // namespace
