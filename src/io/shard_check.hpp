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
  std::vector<std::int64_t> counts;        // samples per file
  std::vector<std::int64_t> sample_shape;  // /x dims after the first
  std::vector<std::int64_t> target_shape;  // /y dims after the first ({} for labels)
  bool x_uint8 = false;
  bool labels = false;       // /y integer
  std::int64_t y_bytes = 0;  // bytes per /y element on disk
  // Per file: FNV-1a over the stored bytes of /x, then /y, at kHashRows rows evenly
  // spaced from the first to the last (every row of a smaller file). A sample of the
  // content, so that its cost does not grow with the file (README: measured).
  std::vector<std::uint64_t> hashes;
};

constexpr std::int64_t kHashRows = 16;

// Expands `patterns` and checks every file and their agreement. Throws InputError.
Layout inspect(const std::vector<std::string>& patterns, const std::string& what);

// Layout <-> bytes, for the broadcast from rank 0.
std::string pack(const Layout& l);
Layout unpack(const std::string& bytes);

std::string shape_str(const std::vector<std::int64_t>& dims);  // "(1,28,28)"

}  // namespace ddp::shard
