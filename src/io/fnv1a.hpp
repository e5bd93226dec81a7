#pragma once
// FNV-1a, 64 bits: the checksum of a checkpoint and the content hash of a data
// shard. It tells damaged or changed bytes, not tampering (not cryptographic).

#include <cstddef>
#include <cstdint>

namespace ddp {

constexpr std::uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;

// Continues hash `h` over n bytes; start from kFnv1aBasis.
inline std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h = kFnv1aBasis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace ddp
