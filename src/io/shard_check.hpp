#pragma once
// Rank 0's inspection of shard files before anyone opens them in parallel: every
// user error found here becomes one line naming the file and the problem.
// Internal to the io module (ShardDataset uses it).

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::shard {

struct Layout {
  std::vector<std::string> files;
  std::vector<std::int64_t> counts;  // samples per file
  // /x dims after the first, images as (C, H, W) whatever their stored layout
  std::vector<std::int64_t> sample_shape;
  std::vector<std::int64_t> target_shape;  // /y dims after the first ({} for labels)
  bool x_uint8 = false;
  // /x stored (N, H, W, C): its attribute layout = "NHWC", or, without the attribute,
  // a 4-D uint8 /x whose last extent is 1, 3 or 4 and whose second is not (what h5py
  // users write from PIL and image decoders). Otherwise (N, C, H, W) or not an image.
  bool nhwc = false;
  std::int64_t class_names = 0;  // entries of the first file's root attribute class_names; 0: none
  bool labels = false;           // /y integer
  std::int64_t y_bytes = 0;      // bytes per /y element on disk
  // Per file: FNV-1a over the stored bytes of /x, then /y, at kHashRows rows evenly
  // spaced from the first to the last (every row of a smaller file). A sample of the
  // content, so that its cost does not grow with the file (docs/checkpoints.md: measured).
  std::vector<std::uint64_t> hashes;
  // Token shards: /tokens (N) integer token ids instead of /x and /y; counts are then
  // tokens per file, y_bytes the bytes of a stored token, and vocab_size the root
  // attribute vocab_size (every file's the same); sample and target shapes are empty
  // (the data set makes windows of data.seq_len from them).
  bool tokens = false;
  std::int64_t vocab_size = 0;
};

constexpr std::int64_t kHashRows = 16;
constexpr std::int64_t kHashTokens = 64;  // token shards: a run of this many tokens at each of kHashRows places

// Expands `patterns` and checks every file and their agreement. Throws InputError.
Layout inspect(const std::vector<std::string>& patterns, const std::string& what);

// A token shard's vocabulary, id to bytes (/vocab_bytes, /vocab_offsets: written by
// tools/token_shards.py), or empty where the file has none or it does not read.
std::vector<std::string> vocabulary(const std::string& path);

// Layout <-> bytes, for the broadcast from rank 0.
std::string pack(const Layout& l);
Layout unpack(const std::string& bytes);

std::string shape_str(const std::vector<std::int64_t>& dims);  // "(1,28,28)"

}  // namespace ddp::shard
