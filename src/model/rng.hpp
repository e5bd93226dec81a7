#pragma once
// A small portable counter-based generator: value i of stream `key` is a pure
// function hash64(key, i) (the splitmix64 output function), so a kernel can draw
// element i's number on any device, in any order, and get the same result. We
// cannot reproduce PyTorch's stream; we reproduce its distributions.

#include <Kokkos_Core.hpp>
#include <cstdint>

namespace ddp {

KOKKOS_INLINE_FUNCTION std::uint64_t hash64(std::uint64_t key, std::uint64_t counter) {
  std::uint64_t z = key + (counter + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) from the top 24 bits: every value is an exact float.
KOKKOS_INLINE_FUNCTION float u01(std::uint64_t bits) {
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

// A sequential stream on the host, used to hand out keys (one per parameter
// tensor, one per dropout layer) in a fixed order.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : seed_(seed) {}
  std::uint64_t next_u64() { return hash64(seed_, counter_++); }
  float uniform() { return u01(next_u64()); }  // [0, 1)

 private:
  std::uint64_t seed_;
  std::uint64_t counter_ = 0;
};

// p[i] = U(lo, hi) drawn from stream `key`, as a kernel; p: (n) in the default memory space.
void fill_uniform(float* p, std::int64_t n, float lo, float hi, std::uint64_t key);

// p[i] = N(mean, stddev) drawn from stream `key` (Box-Muller over counters 2i and 2i + 1,
// in double), as a kernel; p: (n) in the default memory space.
void fill_normal(float* p, std::int64_t n, float mean, float stddev, std::uint64_t key);

}  // namespace ddp
