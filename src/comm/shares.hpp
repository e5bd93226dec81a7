#pragma once
// ZeRO's cut of the flat parameter buffer (comm.zero = 1, 2): W contiguous shares in
// rank order, rank r owning [bounds[r], bounds[r + 1]). Every boundary but the last
// (n) is a multiple of kShareAlign floats, so a share starts on a 4 KB boundary and
// the blocks of the gradient norm (train/clip.hpp) never straddle two shares. The
// shares are as equal as that allows: ceil(n / kShareAlign / W) blocks each from rank
// 0 on, so the last ranks may own fewer floats, or none when n is small.

#include <cstdint>
#include <vector>

namespace ddp {

constexpr std::int64_t kShareAlign = 1024;  // floats: 4 KB

struct Shares {
  std::vector<std::int64_t> bounds;  // W + 1 offsets, bounds[0] = 0, bounds[W] = n

  static Shares split(std::int64_t n, int world_size) {
    Shares s;
    const std::int64_t blocks = (n + kShareAlign - 1) / kShareAlign;
    const std::int64_t per_rank = (blocks + world_size - 1) / world_size;
    for (int r = 0; r <= world_size; ++r) {
      const std::int64_t at = std::int64_t(r) * per_rank * kShareAlign;
      s.bounds.push_back(at < n ? at : n);
    }
    return s;
  }
  int ranks() const { return int(bounds.size()) - 1; }
  std::int64_t begin(int r) const { return bounds[std::size_t(r)]; }
  std::int64_t end(int r) const { return bounds[std::size_t(r) + 1]; }
  std::int64_t size(int r) const { return end(r) - begin(r); }
  struct Part {
    std::int64_t begin, end;
  };
  Part part(int r) const { return {begin(r), end(r)}; }
};

}  // namespace ddp
