// Image shards (NHWC and NCHW) and the rank's image transform (train/augment.hpp):
// the layout read and its errors, data.augment's grammar, and the augmented batch as
// a pure function of (seed, epoch, global index): the same on any number of ranks,
// in any batch split, after a resume mid-epoch, from either layout.

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "comm/check.hpp"
#include "io/batch_loader.hpp"
#include "io/sampler.hpp"
#include "io/shard_dataset.hpp"
#include "shard_files.hpp"
#include "train/augment.hpp"
#include "train/config.hpp"
#include "train/input_stage.hpp"

namespace ddp {
namespace {

int rank_of(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}

// Image g's pixel (c, y, x): distinct enough that a wrong index or layout shows.
std::uint8_t pixel_value(std::int64_t g, std::int64_t c, std::int64_t y, std::int64_t x) {
  return std::uint8_t((g * 131 + c * 71 + y * 17 + x * 5 + (y * x) % 7) % 256);
}

// Writes images [first, first + count) of (C, H, W) stored NHWC or NCHW, with the
// layout attribute `layout` on /x ("" : none), as h5py writes them.
void write_images(const std::string& path, std::int64_t first, std::int64_t count, std::int64_t C,
                  std::int64_t H, std::int64_t W, bool nhwc, const std::string& layout) {
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0) << path;
  std::vector<std::uint8_t> x(std::size_t(count * C * H * W));
  for (std::int64_t i = 0; i < count; ++i)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t y = 0; y < H; ++y)
        for (std::int64_t w = 0; w < W; ++w)
          x[std::size_t(nhwc ? ((i * H + y) * W + w) * C + c : ((i * C + c) * H + y) * W + w)] =
              pixel_value(first + i, c, y, w);
  const std::vector<hsize_t> dims =
      nhwc ? std::vector<hsize_t>{hsize_t(count), hsize_t(H), hsize_t(W), hsize_t(C)}
           : std::vector<hsize_t>{hsize_t(count), hsize_t(C), hsize_t(H), hsize_t(W)};
  hid_t space = H5Screate_simple(4, dims.data(), nullptr);
  const hid_t d = H5Dcreate2(f, "/x", H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data());
  H5Sclose(space);
  if (!layout.empty()) {
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    space = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(d, "layout", type, space, H5P_DEFAULT, H5P_DEFAULT);
    const char* text = layout.c_str();
    H5Awrite(a, type, &text);
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
  }
  H5Dclose(d);
  std::vector<std::int64_t> y(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) y[std::size_t(i)] = (first + i) % 3;
  const hsize_t n = hsize_t(count);
  space = H5Screate_simple(1, &n, nullptr);
  const hid_t dy = H5Dcreate2(f, "/y", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(dy, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data());
  H5Dclose(dy);
  H5Sclose(space);
  H5Fclose(f);
}

class Images : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::make_shared_tmpdir(MPI_COMM_WORLD); }
  void TearDown() override { test::remove_shared_tmpdir(MPI_COMM_WORLD, dir_); }
  // Rank 0 writes; every rank returns after it has.
  template <class F>
  void on_root(F f) {
    if (rank_of(MPI_COMM_WORLD) == 0) f();
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // Two shards of 13 and 12 images of (3, 10, 12).
  std::string two_shards(const std::string& name, bool nhwc, const std::string& layout) {
    on_root([&] {
      write_images(dir_ + "/" + name + "_0.h5", 0, 13, 3, 10, 12, nhwc, layout);
      write_images(dir_ + "/" + name + "_1.h5", 13, 12, 3, 10, 12, nhwc, layout);
    });
    return dir_ + "/" + name + "_*.h5";
  }
  std::string error_of(const std::string& pattern) {
    try {
      ShardDataset ds(MPI_COMM_WORLD, {pattern}, "data.train_files");
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }
  std::string dir_;
};

TEST(ParseAugment, ItemsAndTheirArguments) {
  AugmentSpec s = parse_augment({"flip", "crop(pad=4)"});
  EXPECT_TRUE(s.flip);
  EXPECT_EQ(s.crop_pad, 4);
  EXPECT_FALSE(s.resized_crop);
  s = parse_augment({"random_resized_crop(scale=0.08,1)", "flip"});
  EXPECT_TRUE(s.resized_crop);
  EXPECT_DOUBLE_EQ(s.scale[0], 0.08);
  EXPECT_DOUBLE_EQ(s.scale[1], 1.0);
  EXPECT_DOUBLE_EQ(s.ratio[0], 0.75);
  s = parse_augment({"random_resized_crop(scale=0.5, 1, ratio=0.5, 2)"});
  EXPECT_DOUBLE_EQ(s.scale[0], 0.5);
  EXPECT_DOUBLE_EQ(s.ratio[1], 2.0);
  EXPECT_EQ(parse_augment({"crop"}).crop_pad, 0);
  EXPECT_TRUE(parse_augment({"random_resized_crop"}).resized_crop);
}

TEST(ParseAugment, BadItemsAreOneLineNamingThem) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"flop"}, "'flop': unknown augmentation 'flop'; expected 'flip'"},
      {{"crop(pad=x)"}, "'crop(pad=x)': 'x' is not a number"},
      {{"crop(pad=-1)"}, "pad must be an integer >= 0"},
      {{"crop(pad=1.5)"}, "pad must be an integer >= 0"},
      {{"crop(size=3)"}, "crop takes one argument, pad=N"},
      {{"crop(pad=4"}, "no closing ')'"},
      {{"flip(1)"}, "flip takes no arguments"},
      {{"random_resized_crop(scale=1,0.5)"}, "0 < lo <= hi"},
      {{"random_resized_crop(scale=0.1)"}, "scale takes two numbers"},
      {{"random_resized_crop(scale=0.1,2)"}, "scale must lie in (0, 1]"},
      {{"random_resized_crop(zoom=1,2)"}, "unknown argument 'zoom'"},
      {{"crop(pad=4)", "random_resized_crop"}, "do not combine"},
      {{"flip", "flip"}, "flip is given twice"},
  };
  for (const auto& [items, expected] : bad) {
    try {
      parse_augment(items);
      ADD_FAILURE() << items[0] << ": no error";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
}

TEST_F(Images, LayoutFromTheAttributeOrTheShape) {
  struct Case {
    std::vector<std::int64_t> chw;
    bool nhwc;
    std::string attr;
    bool read_nhwc;
  };
  const std::vector<Case> cases = {
      {{3, 10, 12}, true, "NHWC", true},
      {{3, 10, 12}, true, "", true},  // the guess: last extent 3
      {{3, 10, 12}, false, "NCHW", false},
      {{3, 10, 12}, false, "", false},
      {{1, 6, 6}, true, "", true},
      {{4, 6, 6}, true, "", true},
      // (N, 3, 5, 3): the second extent is a channel count too: NCHW without the attribute
      {{3, 5, 3}, false, "", false},
      {{3, 5, 3}, true, "NHWC", true},
  };
  int k = 0;
  for (const Case& c : cases) {
    const std::string path = dir_ + "/case" + std::to_string(k++) + ".h5";
    on_root([&] { write_images(path, 0, 4, c.chw[0], c.chw[1], c.chw[2], c.nhwc, c.attr); });
    ShardDataset ds(MPI_COMM_WORLD, {path}, "data.train_files");
    EXPECT_EQ(ds.nhwc(), c.read_nhwc) << path;
    if (c.nhwc == c.read_nhwc) {
      EXPECT_EQ(ds.sample_shape(), c.chw) << path;
    }
    EXPECT_TRUE(ds.x_is_uint8());
  }
}

TEST_F(Images, MixedLayoutsSidesAndBadAttributesAreErrors) {
  on_root([&] {
    write_images(dir_ + "/mixed_0.h5", 0, 4, 3, 10, 12, true, "NHWC");
    write_images(dir_ + "/mixed_1.h5", 4, 4, 3, 10, 12, false, "NCHW");
    write_images(dir_ + "/sides_0.h5", 0, 4, 3, 10, 12, true, "NHWC");
    write_images(dir_ + "/sides_1.h5", 4, 4, 3, 10, 10, true, "NHWC");
    write_images(dir_ + "/chans_0.h5", 0, 4, 3, 10, 12, true, "");
    write_images(dir_ + "/chans_1.h5", 4, 4, 1, 10, 12, true, "");
    write_images(dir_ + "/attr_0.h5", 0, 4, 3, 10, 12, true, "HWC");
  });
  std::string e = error_of(dir_ + "/mixed_*.h5");
  EXPECT_NE(e.find("mixed_1.h5: /x is stored NCHW (N, C, H, W) but " + dir_ + "/mixed_0.h5 is NHWC"),
            std::string::npos)
      << e;
  e = error_of(dir_ + "/sides_*.h5");
  EXPECT_NE(e.find("sides_1.h5: /x holds images of (C,H,W) = (3,10,10) but"), std::string::npos) << e;
  e = error_of(dir_ + "/chans_*.h5");
  EXPECT_NE(e.find("chans_1.h5: /x holds images of (C,H,W) = (1,10,12)"), std::string::npos) << e;
  e = error_of(dir_ + "/attr_0.h5");
  EXPECT_NE(e.find("attr_0.h5: /x has layout = 'HWC'; expected 'NHWC' or 'NCHW'"), std::string::npos) << e;
}

// Rows of 64 KB or more are streamed straight into the batch, one read per row in
// file order (shard_dataset.cpp): the same bytes as a preloaded set, in request order,
// repeats included, across shards.
TEST_F(Images, LargeRowsStreamStraightIntoTheBatch) {
  const std::int64_t C = 3, H = 128, W = 192;  // 73,728 bytes a row
  on_root([&] {
    write_images(dir_ + "/large_0.h5", 0, 5, C, H, W, true, "NHWC");
    write_images(dir_ + "/large_1.h5", 5, 6, C, H, W, true, "NHWC");
  });
  ShardDataset streamed(MPI_COMM_WORLD, {dir_ + "/large_*.h5"}, "data.train_files");
  ShardDataset preloaded(MPI_COMM_WORLD, {dir_ + "/large_*.h5"}, "data.train_files");
  preloaded.preload();
  const std::vector<std::int64_t> idx = {7, 0, 10, 7, 3, 5, 3, 9, 4};
  const std::size_t row = std::size_t(C * H * W), n = idx.size();
  std::vector<std::uint8_t> a(n * row), b(n * row);
  std::vector<std::int32_t> la(n), lb(n);
  streamed.read_stored(idx.data(), std::int64_t(n), a.data(), la.data(), nullptr);
  preloaded.read_stored(idx.data(), std::int64_t(n), b.data(), lb.data(), nullptr);
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(la[i], idx[i] % 3);
    EXPECT_EQ(a[i * row + (5 * W + 7) * C + 2], pixel_value(idx[i], 2, 5, 7)) << i;  // (c, y, x) = (2, 5, 7)
  }
  std::vector<float> fa(n * row), fb(n * row);  // the x/255 path stages as before
  streamed.read(idx.data(), std::int64_t(n), fa.data(), nullptr, nullptr);
  preloaded.read(idx.data(), std::int64_t(n), fb.data(), nullptr, nullptr);
  EXPECT_EQ(fa, fb);
}

// The model's floats of `indices` in batches of `batch`, through the loader (uint8
// as stored) and the input stage: global index -> (C * OH * OW) floats.
std::map<std::int64_t, std::vector<float>> transform_all(ShardDataset& ds, const ImageTransform& t,
                                                         std::vector<std::int64_t> indices,
                                                         std::int64_t batch, std::int64_t epoch,
                                                         bool training, int prefetch = 1) {
  const std::int64_t numel = t.output_numel();
  InputStage stage(batch, numel, true, 1, ds.sample_numel());
  BatchLoader loader(ds, std::move(indices), batch, prefetch, /*keep_uint8=*/true);
  const BatchTransform bt{&t, image_shape(ds), epoch, training};
  std::map<std::int64_t, std::vector<float>> out;
  Batch b;
  while (loader.next(b)) {
    EXPECT_TRUE(b.x.empty());
    EXPECT_EQ(b.x_uint8.size(), std::size_t(b.size * ds.sample_numel()));
    const int slot = stage.put(b, &bt);
    const Inputs in = stage.take(slot);
    auto x_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), in.x);
    for (std::int64_t i = 0; i < b.size; ++i)
      out[b.index[std::size_t(i)]] =
          std::vector<float>(x_host.data() + i * numel, x_host.data() + (i + 1) * numel);
    stage.release(slot);
  }
  return out;
}

std::vector<std::int64_t> all_of(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Setting {
  const char* name;
  std::vector<std::string> augment;
  std::int64_t side;
  std::vector<double> normalize;
};
const std::vector<Setting> kSettings = {
    {"flip + crop(pad=2)", {"flip", "crop(pad=2)"}, 8, {}},
    {"random_resized_crop + flip",
     {"random_resized_crop(scale=0.08,1)", "flip"},
     8,
     {0.5, 0.4, 0.3, 0.2, 0.25, 0.3}},
    {"random_resized_crop upward", {"random_resized_crop(scale=0.05,0.2)"}, 9, {}},
};

// What 1, 2, ... ranks train: each rank's samples of epoch 1 (and of a resume at
// position 7), batch after batch of 3, bitwise equal to the whole set transformed in
// one batch on this rank: the transform does not see ranks, batches or the resume.
TEST_F(Images, AugmentedSampleIsTheSameOnAnyRanksBatchesAndResume) {
  const std::string pattern = two_shards("ranks", true, "NHWC");
  ShardDataset ds(MPI_COMM_WORLD, {pattern}, "data.train_files");
  ds.preload();  // the set's reads are tested elsewhere; streaming below too
  ShardDataset streamed(MPI_COMM_WORLD, {pattern}, "data.train_files");
  int W = 1, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  for (const Setting& s : kSettings) {
    const ImageTransform t(parse_augment(s.augment), s.normalize, 3, s.side, s.side, 1234);
    const auto whole = transform_all(ds, t, all_of(ds.size()), ds.size(), 1, true);
    for (std::int64_t consumed : {std::int64_t(0), std::int64_t(7)}) {
      const auto mine = epoch_indices(ds.size(), W, r, true, 1234, false, 1, consumed);
      for (ShardDataset* d : {&ds, &streamed}) {
        const auto got = transform_all(*d, t, mine, 3, 1, true, d == &ds ? 0 : 2);
        ASSERT_EQ(got.size(), std::set<std::int64_t>(mine.begin(), mine.end()).size());
        for (const auto& [g, v] : got)
          EXPECT_TRUE(same_bits(v, whole.at(g))) << s.name << ": sample " << g << " consumed " << consumed;
      }
    }
    // Another epoch draws again; evaluation draws nothing and differs from training.
    const auto next = transform_all(ds, t, all_of(ds.size()), 5, 2, true);
    const auto eval = transform_all(ds, t, all_of(ds.size()), 5, 1, false);
    int moved = 0, augmented = 0;
    for (std::int64_t g = 0; g < ds.size(); ++g) {
      moved += !same_bits(next.at(g), whole.at(g));
      augmented += !same_bits(eval.at(g), whole.at(g));
    }
    EXPECT_GT(moved, ds.size() / 2) << s.name;
    EXPECT_GT(augmented, ds.size() / 2) << s.name;
  }
}

// NHWC (attribute or guess) and NCHW shards of the same images: the same floats.
TEST_F(Images, NhwcAndNchwShardsGiveIdenticalBatches) {
  ShardDataset nhwc(MPI_COMM_WORLD, {two_shards("nhwc", true, "NHWC")}, "data.train_files");
  ShardDataset guessed(MPI_COMM_WORLD, {two_shards("guess", true, "")}, "data.train_files");
  ShardDataset nchw(MPI_COMM_WORLD, {two_shards("nchw", false, "")}, "data.train_files");
  ASSERT_TRUE(nhwc.nhwc() && guessed.nhwc() && !nchw.nhwc());
  std::vector<Setting> settings = kSettings;
  settings.push_back({"none, as stored", {}, 0, {}});
  for (const Setting& s : settings) {
    const std::int64_t oh = s.side ? s.side : 10, ow = s.side ? s.side : 12;
    const ImageTransform t(parse_augment(s.augment), s.normalize, 3, oh, ow, 7);
    for (bool training : {true, false}) {
      const auto a = transform_all(nhwc, t, all_of(25), 4, 3, training);
      const auto b = transform_all(guessed, t, all_of(25), 4, 3, training);
      const auto c = transform_all(nchw, t, all_of(25), 4, 3, training);
      for (std::int64_t g = 0; g < 25; ++g) {
        EXPECT_TRUE(same_bits(a.at(g), c.at(g))) << s.name << " sample " << g;
        EXPECT_TRUE(same_bits(b.at(g), c.at(g))) << s.name << " sample " << g;
      }
    }
  }
}

// uint8 NCHW with no augmentation and no normalize: the same floats as the host's
// x/255 of ShardDataset::read, as before the transform existed.
TEST_F(Images, PlainUint8IsTheHostsDivision) {
  ShardDataset ds(MPI_COMM_WORLD, {two_shards("plain", false, "")}, "data.train_files");
  const ImageTransform t(AugmentSpec{}, {}, 3, 10, 12, 0);
  const auto got = transform_all(ds, t, all_of(25), 6, 0, true);
  std::vector<float> x(std::size_t(ds.sample_numel()));
  for (std::int64_t g = 0; g < 25; ++g) {
    ds.read(&g, 1, x.data(), nullptr, nullptr);
    EXPECT_TRUE(same_bits(got.at(g), x)) << g;
  }
}

// The boxes: torchvision's centre crop (Python's round, half to even), RandomCrop's
// window of the padded image, RandomResizedCrop's box inside the image.
TEST(ImageTransformBox, CentreCropAndDrawsStayInRange) {
  const ImageTransform t(AugmentSpec{}, {}, 3, 8, 8, 0);
  EXPECT_EQ(t.box({3, 10, 10, false}, 0, 0, false).top, 1);
  EXPECT_EQ(t.box({3, 11, 10, false}, 0, 0, false).top, 2);  // round(1.5) = 2
  EXPECT_EQ(t.box({3, 9, 13, false}, 0, 0, false).top, 0);   // round(0.5) = 0
  EXPECT_EQ(t.box({3, 9, 13, false}, 0, 0, false).left, 2);  // round(2.5) = 2
  const ImageTransform crop(parse_augment({"crop(pad=4)", "flip"}), {}, 3, 8, 8, 5);
  const ImageTransform rrc(parse_augment({"random_resized_crop(scale=0.08,1)"}), {}, 3, 8, 8, 5);
  int flips = 0;
  std::set<int> tops;
  for (std::int64_t g = 0; g < 2000; ++g) {
    const SampleBox b = crop.box({3, 8, 8, false}, 3, g, true);
    EXPECT_TRUE(b.top >= -4 && b.top <= 4 && b.left >= -4 && b.left <= 4);
    EXPECT_EQ(b.height, 8);
    tops.insert(b.top);
    flips += b.flip;
    const SampleBox r = rrc.box({3, 20, 30, false}, 3, g, true);
    EXPECT_TRUE(r.top >= 0 && r.left >= 0 && r.top + r.height <= 20 && r.left + r.width <= 30 &&
                r.height > 0 && r.width > 0);
  }
  EXPECT_EQ(tops.size(), 9u);  // every offset of 2 * 4 + 1
  EXPECT_GT(flips, 900);
  EXPECT_LT(flips, 1100);
}

}  // namespace
}  // namespace ddp
